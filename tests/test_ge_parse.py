"""The pure Grid Engine modules against real Son of Grid Engine 8.1.9 output
(testdata/gridengine/, recorded by its ``capture``; NOTES.md says what each shows):
qstat's XML, the hold filters, the accounting records and their one cause table, the
record a ref picks (number reuse, a cleared Eqw, a reschedule), the accounting file
followed by offset, the account string, the error table and Preflight's parsing."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from controller.errors import (
    CommandFailed,
    ErrBackPressure,
    ErrConflict,
    ErrInvalid,
    ErrNotFound,
    ProtocolError,
    TransientError,
)
from controller.gridengine import accounting, capabilities, classify, naming, qstat
from controller.gridengine.failures import ge_failure
from controller.model.obs import CauseKind, ObjectRef, Provenance, Source, State
from controller.runner.base import CommandResult

DATA = Path(__file__).resolve().parent.parent / "testdata" / "gridengine"
STATES = {"RUN": 8, "USERHOLD": 9, "TOOBIG": 10, "DEFERRED": 11, "BADOUT": 12,
          "ROOTQHOLD": 13, "OPHOLD": 14, "SYSHOLD": 15}


def read(name: str) -> str:
    return (DATA / name).read_text()


def record(name: str, index: int = -1) -> accounting.AccountingRecord:
    return accounting.parse_record(read(name).splitlines()[index])


# ---------------------------------------------------------------- qstat


def test_list_has_every_state_and_the_running_job_s_host() -> None:
    listed = qstat.parse_list(read("qstat-xml-u-states.xml"))
    by_name = {job.name: job for job in listed.jobs}
    assert {name: job.state for name, job in by_name.items()} == {
        "dj-RUN": "r", "dj-TOOBIG": "qw", "dj-BADOUT": "Eqw", "dj-USERHOLD": "hqw",
        "dj-DEFERRED": "qw", "dj-ROOTQHOLD": "hqw", "dj-OPHOLD": "hqw", "dj-SYSHOLD": "hqw"}
    assert by_name["dj-RUN"].host == "vm" and by_name["dj-RUN"].queue == "dispatch.q@vm"
    assert by_name["dj-RUN"].time == 1796468184  # 2026-12-05T10:56:24, read as UTC
    assert by_name["dj-TOOBIG"].host == "" and by_name["dj-TOOBIG"].slots == 5


def test_f_list_gives_queue_instance_states() -> None:
    down = qstat.parse_list(read("execd-kill-noresched-qstat-f-while-down.xml"))
    assert [(q.name, q.state, q.host) for q in down.queues] == [("dispatch.q@vm", "u", "vm")]
    well = qstat.parse_list(read("qstat-f-xml.xml"))
    assert [(q.name, q.state) for q in well.queues] == [("dispatch.q@vm", "")]


def test_array_job_lists_a_task_per_element() -> None:
    listed = qstat.parse_list(read("qstat-xml-u-more.xml"))
    array = [job for job in listed.jobs if job.name == "dj-ARRAY"]
    assert [(job.state, job.tasks) for job in array] == [("r", "1"), ("qw", "2-4:1")]


def test_details_of_a_held_job() -> None:
    details = qstat.parse_details(read("qstat-j-xml-e2e-hqw.xml"))
    detail = details[38]
    assert (detail.name, detail.owner, detail.submit, detail.account) == (
        "dj-TEST", "dispatch", 1796468698, "dispatch;s=1;a=0")
    assert detail.context_value("dispatch") == "s=1;a=0"
    assert detail.start is None and not detail.rerunnable


def test_details_of_a_running_and_an_eqw_job() -> None:
    details = qstat.parse_details(read("qstat-j-xml-states.xml"))
    assert details[STATES["RUN"]].start == 1796468184
    assert "can't stat() \"/root/nope/\" as stdout_path" in details[STATES["BADOUT"]].messages[0]
    assert details[STATES["BADOUT"]].start is None


def test_unknown_ids_are_absent_and_garbage_refused() -> None:
    assert qstat.parse_details("<?xml version='1.0'?>\n<unknown_jobs >\n"
                               "<ST_name>99999</ST_name>\n</unknown_jobs>\n") == {}
    with pytest.raises(ProtocolError):
        qstat.parse_list("Following jobs do not exist")
    with pytest.raises(ProtocolError):
        qstat.parse_list("<job_info><job_info><job_list><JB_job_number>x</JB_job_number>"
                         "<JB_name>a</JB_name><JB_owner>b</JB_owner><state>r</state>"
                         "<slots>1</slots></job_list></job_info></job_info>")


def test_hold_filters_tell_the_holds_apart() -> None:
    assert qstat.parse_numbers(read("qstat-xml-u-s-hu.xml")) == {9, 13}
    assert qstat.parse_numbers(read("qstat-xml-u-s-ho.xml")) == {14}
    assert qstat.parse_numbers(read("qstat-xml-u-s-hs.xml")) == {15}


# ---------------------------------------------------------------- live classification


def _observed(name: str, *, context: tuple[tuple[str, str], ...] = ()) -> tuple[State, object]:
    listed = {j.number: j for j in qstat.parse_list(read("qstat-xml-u-states.xml")).jobs}
    details = qstat.parse_details(read("qstat-j-xml-states.xml"))
    number = STATES[name]
    job = listed[number]
    detail = details.get(number) or qstat.JobDetail(number, job.name, "dispatch", 1, None)
    if context:
        detail = qstat.JobDetail(detail.number, detail.name, detail.owner, detail.submit,
                                 detail.account, context, messages=detail.messages)
    hu = qstat.parse_numbers(read("qstat-xml-u-s-hu.xml"))
    ho = qstat.parse_numbers(read("qstat-xml-u-s-ho.xml"))
    hs = qstat.parse_numbers(read("qstat-xml-u-s-hs.xml"))
    obs = classify.observe_live(job, detail, cluster="ge", now=2_000_000_000,
                                holds=classify.Holds(number in hu, number in ho, number in hs))
    return obs.state, obs


@pytest.mark.parametrize(("name", "state", "cause", "provenance"), [
    pytest.param("RUN", State.RUNNING, CauseKind.NONE, Provenance.UNKNOWN, id="r"),
    pytest.param("TOOBIG", State.PENDING, CauseKind.NONE, Provenance.UNKNOWN, id="qw"),
    pytest.param("DEFERRED", State.PENDING, CauseKind.NONE, Provenance.UNKNOWN, id="deferred"),
    pytest.param("USERHOLD", State.GATED, CauseKind.NONE, Provenance.UNKNOWN, id="gate"),
    pytest.param("OPHOLD", State.HELD, CauseKind.ADMIN_HOLD, Provenance.ADMIN, id="operator"),
    pytest.param("SYSHOLD", State.HELD, CauseKind.ADMIN_HOLD, Provenance.ADMIN, id="system"),
    pytest.param("BADOUT", State.HELD, CauseKind.LAUNCH_FAILED, Provenance.SLURM, id="Eqw"),
])
def test_live_table(name: str, state: State, cause: CauseKind, provenance: Provenance) -> None:
    got, obs = _observed(name)
    assert got is state
    assert (obs.cause.kind, obs.cause.provenance) == (cause, provenance)  # type: ignore[attr-defined]


def test_eqw_carries_its_reason_and_running_its_node() -> None:
    _, eqw = _observed("BADOUT")
    assert "stdout_path: Permission denied" in eqw.cause.detail  # type: ignore[attr-defined]
    _, run = _observed("RUN")
    assert run.nodes == ("vm",) and run.start == 1796468184  # type: ignore[attr-defined]


def test_a_user_hold_with_our_context_is_a_dispatch_hold() -> None:
    state, obs = _observed("USERHOLD", context=((naming.HOLD_CONTEXT, "7"),))
    assert state is State.HELD
    assert obs.hold_instance == 7 and obs.cause.provenance is Provenance.DISPATCH  # type: ignore[attr-defined]
    # an operator's hold on top wins: never released by us
    state, obs = _observed("OPHOLD", context=((naming.HOLD_CONTEXT, "7"),))
    assert state is State.HELD and obs.hold_instance is None  # type: ignore[attr-defined]


@pytest.mark.parametrize(("letters", "state", "cause"), [
    pytest.param("Rq", State.PENDING, CauseKind.REQUEUED, id="Rq"),
    pytest.param("Rr", State.RUNNING, CauseKind.NONE, id="Rr"),
    pytest.param("dr", State.RUNNING, CauseKind.NONE, id="dr"),
    pytest.param("t", State.RUNNING, CauseKind.NONE, id="t"),
    pytest.param("s", State.SUSPENDED, CauseKind.NONE, id="s"),
    pytest.param("S", State.SUSPENDED, CauseKind.NONE, id="S"),
    pytest.param("Ehqw", State.HELD, CauseKind.LAUNCH_FAILED, id="Ehqw"),
    pytest.param("zz", State.ENDED, CauseKind.UNKNOWN, id="unknown letters"),
])
def test_live_table_letters(letters: str, state: State, cause: CauseKind) -> None:
    got, found = classify.live_state(letters, classify.Holds(), None)
    assert (got, found.kind) == (state, cause)


# ---------------------------------------------------------------- accounting


@pytest.mark.parametrize(("name", "cause", "exit_code"), [
    pytest.param("accounting-ok.txt", CauseKind.COMPLETED, None, id="exit 0"),
    pytest.param("accounting-exit1.txt", CauseKind.NON_ZERO_EXIT, 1, id="exit 1"),
    pytest.param("accounting-exit100.txt", CauseKind.LAUNCH_FAILED, None, id="exit 100 Eqw"),
    pytest.param("accounting-selfkill.txt", CauseKind.SIGNALED, None, id="kill self"),
    pytest.param("accounting-termext.txt", CauseKind.SIGNALED, None, id="SIGTERM"),
    pytest.param("accounting-qdel.txt", CauseKind.SIGNALED, None, id="qdel"),
    pytest.param("accounting-hrt.txt", CauseKind.TIMEOUT, None, id="h_rt"),
    pytest.param("accounting-eqw-badout.txt", CauseKind.LAUNCH_FAILED, None, id="bad -o"),
    pytest.param("execd-kill-noresched-accounting-lost.txt", CauseKind.NODE_LOST, None,
                 id="shepherd lost"),
    pytest.param("execd-kill-noresched-accounting-survives.txt", CauseKind.COMPLETED, None,
                 id="ended while execd down"),
    pytest.param("accounting-hvmem.txt", CauseKind.NON_ZERO_EXIT, 1, id="h_vmem rlimit"),
    pytest.param("accounting-pe2.txt", CauseKind.SIGNALED, None, id="qdel pe"),
])
def test_accounting_table(name: str, cause: CauseKind, exit_code: int | None) -> None:
    rec = record(name)
    obs = classify.observe_record(rec, cluster="ge", now=2_000_000_000)
    assert obs.state is State.ENDED and obs.source is Source.ACCOUNTING
    assert (obs.cause.kind, obs.exit_code) == (cause, exit_code)


def test_a_qdel_we_made_is_cancelled() -> None:
    obs = classify.observe_record(record("accounting-qdel.txt"), cluster="ge", now=0,
                                  cancelled=True)
    assert (obs.cause.kind, obs.cause.provenance) == (CauseKind.CANCELLED, Provenance.DISPATCH)


def test_record_fields() -> None:
    rec = record("accounting-ok.txt")
    assert (rec.owner, rec.name, rec.number, rec.account, rec.failed, rec.exit_status,
            rec.host, rec.pe_taskid) == ("dispatch", "dj-OK", 16, "dispatch;s=1;a=0", 0, 0,
                                         "vm", "NONE")
    with pytest.raises(ProtocolError):
        accounting.parse_record("a:b:c")


def _ref(rec: accounting.AccountingRecord, submit: int | None = None) -> ObjectRef:
    return ObjectRef("ge", rec.name, rec.number, rec.submit if submit is None else submit)


def test_pick_the_run_of_a_cleared_eqw() -> None:
    records = [accounting.parse_record(line)
               for line in read("accounting-eqw-cleared.txt").splitlines()]
    assert [r.failed for r in records] == [26, 0]
    picked = accounting.pick_record(_ref(records[0]), records, user="dispatch")
    assert picked is records[1]


def test_pick_skips_a_reschedule_record_and_follows_the_rerun() -> None:
    records = [accounting.parse_record(line)
               for line in read("execd-kill-resched-accounting-lostrerun.txt").splitlines()]
    assert records[0].submit == 0  # failed 25: no submission time
    ref = ObjectRef("ge", "dj-LOSTRERUN", 35, records[1].submit - 40)
    picked = accounting.pick_record(ref, records, user="dispatch")
    assert picked is records[-1]


def test_pick_never_takes_another_job_on_a_reused_number() -> None:
    rec = record("accounting-ok.txt")
    other_user = _fields(rec, owner="dispatch-other")
    assert accounting.pick_record(_ref(rec), [other_user], user="dispatch") is None
    renamed = _fields(rec, name="dj-OTHER")
    assert accounting.pick_record(_ref(rec), [renamed], user="dispatch") is None
    earlier = _fields(rec, submit=rec.submit - 100)  # an older job of that number
    assert accounting.pick_record(_ref(rec), [earlier], user="dispatch") is None
    slave = _fields(rec, pe_taskid="1.vm")
    assert accounting.pick_record(_ref(rec), [slave], user="dispatch") is None
    assert accounting.pick_record(_ref(rec), [earlier, rec], user="dispatch") is rec


def _fields(rec: accounting.AccountingRecord, **changes: object) -> accounting.AccountingRecord:
    values = {name: getattr(rec, name) for name in accounting.AccountingRecord.__slots__}
    values.update(changes)
    return accounting.AccountingRecord(**values)  # type: ignore[arg-type]


def _read_output(size: int, start: int, data: bytes) -> str:
    return f"{size} {start}\n{base64.b64encode(data).decode()}\n"


def test_index_follows_the_file_by_offset() -> None:
    ok = read("accounting-ok.txt").encode()
    exit1 = read("accounting-exit1.txt").encode()
    foreign = b"dispatch.q:vm:x:someone:dj-OK:99:sge:0:1:1:1:0:0" + b":0" * 32 + b"\n"
    index = accounting.AccountingIndex("dispatch")
    index.offset = 0
    whole = ok + foreign + exit1[:40]  # the last line not yet complete
    assert not index.feed(_read_output(len(whole), 0, whole))
    assert sorted(index.records) == [16]
    assert index.offset == len(ok) + len(foreign)
    rest = exit1
    size = len(ok) + len(foreign) + len(rest)
    index.feed(_read_output(size, index.offset, rest))
    assert sorted(index.records) == [16, 17]
    # rotated: the file shrank, the script read it from 0 again
    index.feed(_read_output(len(ok), 0, ok))
    assert index.offset == len(ok) and len(index.records[16]) == 2
    with pytest.raises(ProtocolError):
        index.feed(_read_output(10, 3, b"x"))


def test_first_read_looks_back_and_drops_the_partial_line() -> None:
    ok = read("accounting-ok.txt").encode()
    exit1 = read("accounting-exit1.txt").encode()
    index = accounting.AccountingIndex("dispatch")
    data = ok[10:] + exit1  # from the middle of the first line
    index.feed(_read_output(10 + len(data), 10, data))
    assert sorted(index.records) == [17]
    assert index.offset == 10 + len(data)


def test_index_prunes_old_records() -> None:
    index = accounting.AccountingIndex("dispatch")
    index.add_lines([read("accounting-ok.txt").strip()])
    index.prune(before=2_000_000_000)
    assert index.records == {}


# ---------------------------------------------------------------- naming


def test_account_string() -> None:
    assert naming.format_account(3, 0) == "dispatch;s=3;a=0"
    assert naming.parse_account("dispatch;s=3;a=12") == (3, 12)
    for bad in ("dispatch:s=1;a=0", "dispatch;s=01;a=0", "dispatch;s=1;a=-1", "sge",
                "dispatch;s=1;a=0 ", None):
        assert naming.parse_account(bad) is None
    with pytest.raises(ErrInvalid):
        naming.format_account(0, 0)
    assert naming.parse_hold_instance("12") == 12
    assert naming.parse_hold_instance("0") is None
    assert naming.parse_hold_instance("4294967296") is None


# ---------------------------------------------------------------- errors


def _result(stderr: str, rc: int = 1) -> CommandResult:
    return CommandResult(("qsub",), rc, "", stderr, 0.1)


@pytest.mark.parametrize(("file_or_text", "kind"), [
    pytest.param("qsub-refused-bad-pe.txt", ErrInvalid, id="bad pe"),
    pytest.param("qsub-refused-bad-queue.txt", ErrInvalid, id="bad queue"),
    pytest.param("qsub-refused-root.txt", ErrInvalid, id="min_uid"),
    pytest.param("error: unable to contact qmaster using port 6444 on host \"vm\"",
                 TransientError, id="qmaster down"),
    pytest.param("denied: job \"5\" does not exist", ErrNotFound, id="qdel gone"),
    pytest.param("denied: \"dispatch\" must be operator to remove operator hold",
                 ErrConflict, id="operator hold"),
    pytest.param("Unable to run job: job rejected: Only 10 jobs are allowed per user "
                 "(current job count: 10)", ErrBackPressure, id="max_u_jobs"),
    pytest.param("something else", CommandFailed, id="other"),
])
def test_error_table(file_or_text: str, kind: type[Exception]) -> None:
    text = read(file_or_text) if file_or_text.endswith(".txt") else file_or_text
    assert type(ge_failure(_result(text), operation="qsub")) is kind


def test_names_refused_by_qsub_are_invalid() -> None:
    for block in read("qsub-refused-names.txt").split("$ ")[1:]:
        assert isinstance(ge_failure(_result(block), operation="qsub"), ErrInvalid), block


# ---------------------------------------------------------------- preflight parsing


def test_preflight_parsing() -> None:
    assert capabilities.parse_version(read("version.txt")) == (8, 1, 9)
    conf = capabilities.parse_sconf(read("qconf-sconf.txt"))
    assert conf["min_uid"] == "1000"
    assert capabilities.duration_s(conf["max_unheard"]) == 20
    assert capabilities.duration_s(conf["reschedule_unknown"]) == 0
    assert capabilities.flush_s(conf["reporting_params"]) == 0
    assert capabilities.flush_s("accounting=true flush_time=00:00:15") == 15
    caps = capabilities.Capabilities(version="8.1.9", accounting_file="/x",
                                     accounting_readable=False, min_uid=1000, submit_uid=0,
                                     queues=("dispatch.q",), queue_configured="nosuch.q")
    problems = capabilities.preflight_problems(caps)
    assert len(problems) == 4, problems
