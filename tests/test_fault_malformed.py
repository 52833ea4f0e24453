"""Fault 5: malformed Slurm output fed through the REAL parsing path.

The real ``SlurmAdapter`` (and, for the tick, the real ``Reconciler`` on a real SQLite
store) reads canned squeue/sacct output from a runner that answers like Slurm would --
but with the row of our job damaged: truncated, an unknown base state, an odd node
list, an impossible time, a shifted column, a comment with a leading zero, a name in
the wrong case. Every command the adapter runs is recorded. Each case must end in a
clear error (ProtocolError: the tick changes no job) or a foreign/unknown observation,
and never in a Slurm write (scancel, scontrol update/release/...) nor an sbatch.

The JSON dialects (every version under ``testdata/slurm``) get the same treatment:
truncated at many points, nested past Python's recursion limit, unknown base states and
flags, odd node lists, leading-zero comments and wrong-case names.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from controller.errors import ErrConflict, ErrNotFound, ProtocolError
from controller.metrics import Metrics
from controller.model.obs import CauseKind, ObjectRef, State
from controller.model.spec import parse_job_document
from controller.reconcile.plan import Current, Desired, JobState, Phase
from controller.reconcile.policy import parse_policy
from controller.reconcile.tick import Reconciler, TickSettings
from controller.runner.base import CommandResult
from controller.slurm import dialects
from controller.slurm.adapter import SlurmAdapter
from controller.slurm.classify import classify
from controller.slurm.script import StartSettings
from controller.store import repo
from controller.store.db import Store
from tests.fault_support import FaultRow, ListSink, RecordingRunner, emit, record_row

ROOT = Path(__file__).resolve().parent.parent
JOB = "01JZ8Q2N5V00000000000000AA"
NAME = "dj-" + JOB
SLURM_ID = 4101
SUBMIT_TEXT = "2026-11-30T12:00:00"
SUBMIT = dialects.parse_text_time(SUBMIT_TEXT)
assert SUBMIT is not None
NOW = SUBMIT + 120
REF = ObjectRef("lab", NAME, SLURM_ID, SUBMIT)
DOC = {"command": ["sleep", "100"], "workdir": "/tmp"}


def squeue_row(**over: str) -> str:
    """One ``squeue -O <SQUEUE_TEXT_FORMAT>`` row of our running job, fields overridable."""
    fields = {
        "JobID": str(SLURM_ID), "Name": NAME, "UserName": "dispatch", "StateCompact": "R",
        "State": "RUNNING", "Reason": "None", "SubmitTime": SUBMIT_TEXT,
        "EligibleTime": SUBMIT_TEXT, "StartTime": "2026-11-30T12:00:01", "EndTime": "NONE",
        "PreemptTime": "N/A", "TimeLimit": "UNLIMITED", "Requeue": "0", "RestartCnt": "0",
        "exit_code": "0", "NodeList": "vm", "Cluster": "lab", "Comment": "dispatch:s=1;a=0",
    }
    fields.update(over)
    return "".join(fields[c] + "|" for c in dialects.SQUEUE_TEXT_COLUMNS)


GOOD = squeue_row()
OTHER = squeue_row(JobID="4102", Name="dj-01JZ8Q2N5V00000000000000BB",
                   Comment="dispatch:s=1;a=0")


class CannedSlurm:
    """A runner answering as Slurm would from canned squeue text (sacct: no rows)."""

    def __init__(self, live: str) -> None:
        self.live = live

    async def run(self, argv: Sequence[str], *, stdin: str | None = None,
                  timeout: float | None = None, env: Any = None) -> CommandResult:
        args = tuple(argv)
        if args[0] == "squeue" and "-j" in args:
            wanted = args[args.index("-j") + 1]
            rows = [line for line in self.live.splitlines()
                    if line.split("|", 1)[0] == wanted]
            if not rows:
                return CommandResult(args, 1, "", "slurm_load_jobs error: Invalid job id "
                                     "specified\n", 0.01)
            return CommandResult(args, 0, "\n".join(rows) + "\n", "", 0.01)
        if args[0] == "squeue":
            return CommandResult(args, 0, self.live, "", 0.01)
        if args[0] == "sacct":
            return CommandResult(args, 0, "", "", 0.01)
        return CommandResult(args, 0, "", "", 0.01)  # a write: recorded, must never happen

    async def run_script(self, script: str, *, timeout: float | None = None) -> CommandResult:
        return CommandResult(("/bin/sh", "-s"), 1, "", "refused by the test\n", 0.01)

    async def close(self) -> None:
        return None


@dataclass(frozen=True)
class Case:
    name: str
    row: str  # our job's row as Slurm printed it
    outcome: str  # "error" | "foreign" | "unknown" | "unknown-state"


CASES = [
    Case("truncated-row", GOOD[: len(GOOD) // 2 + 40], "error"),
    Case("truncated-no-final-bar", GOOD[:-1], "error"),
    Case("truncated-inside-name", GOOD[:20], "unknown"),
    Case("unknown-base-state", squeue_row(State="TELEPORTING", StateCompact="TP"),
         "unknown-state"),
    Case("unknown-flag-as-state", squeue_row(State="RECONFIGURING_FED", StateCompact="RF2"),
         "unknown-state"),
    Case("state-disagrees-with-compact", squeue_row(State="RUNNING", StateCompact="PD"),
         "error"),
    Case("odd-node-list-open", squeue_row(NodeList="vm[1-"), "error"),
    Case("odd-node-list-reversed", squeue_row(NodeList="vm[3-1]"), "error"),
    Case("odd-node-list-nested", squeue_row(NodeList="vm[1-[2]]"), "error"),
    Case("odd-node-list-garbage", squeue_row(NodeList="vm,,x"), "error"),
    Case("impossible-submit-time", squeue_row(SubmitTime="2026-02-30T00:00:00"), "error"),
    Case("garbage-restart-count", squeue_row(RestartCnt="-1"), "error"),
    Case("comment-leading-zero", squeue_row(Comment="dispatch:s=01;a=0"), "foreign"),
    Case("comment-leading-zero-attempt", squeue_row(Comment="dispatch:s=1;a=00"), "foreign"),
    Case("name-upper-case-prefix", squeue_row(Name="DJ-" + JOB), "unknown"),
    Case("name-lower-case-ulid", squeue_row(Name="dj-" + JOB.lower()), "unknown"),
    Case("other-user-same-name", squeue_row(UserName="dispatch-other"), "unknown"),
]


def _store(tmp: Path, *, policy: dict[str, Any] | None = None) -> Store:
    store = Store(f"sqlite:///{tmp}/malformed.db")
    store.migrate()
    spec = parse_job_document(DOC)
    state = JobState(job_id=JOB, generation=1, desired=Desired.RUN, spec=spec,
                     policy=parse_policy(policy), phase=Phase.RUNNING, submission=1,
                     attempt=0, current=Current(1, 0, SUBMIT, REF),
                     object_state=State.RUNNING, started_at=SUBMIT + 1, nodes=("vm",),
                     observed_generation=1)
    with store.transaction() as tx:
        repo.insert_job(tx, job_id=JOB, document=DOC, policy=policy, now=SUBMIT)
        repo.save_status(tx, state, exists=False, now=SUBMIT)
        repo.record_submitted(tx, JOB, 1, REF)
    return store


def _adapter(live: str) -> tuple[SlurmAdapter, ListSink]:
    sink = ListSink()
    runner = RecordingRunner(CannedSlurm(live), sink)
    adapter = SlurmAdapter(runner, cluster="lab", settings=StartSettings(
        output_dir="/tmp/dispatch-fault-output"), user="dispatch", clock=lambda: NOW,
        stop_confirm_s=0.1)
    return adapter, sink


def _status(store: Store) -> dict[str, Any]:
    with store.transaction() as tx:
        (view,) = repo.list_jobs(tx, job_id=JOB)
    return view.to_json()


RESULTS: dict[str, tuple[str, int, int, bool]] = {}


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
async def test_malformed_live_row(case: Case, tmp_path: Path) -> None:
    live = OTHER + "\n" + case.row + "\n"
    adapter, sink = _adapter(live)

    # 1. the batched live read: a clear error, or our job absent/foreign/unknown
    try:
        found = await adapter.find_many([JOB])
        read_error = None
    except ProtocolError as exc:
        found, read_error = {}, exc
    if case.outcome == "error":
        assert read_error is not None, found
        assert str(read_error)  # says what is wrong
    else:
        assert read_error is None
        ours = found[JOB]
        if case.outcome == "unknown":
            assert ours == []
        elif case.outcome == "foreign":
            assert [o.foreign for o in ours] == [True]
        else:
            assert [(o.state, o.cause.kind) for o in ours] == [(State.ENDED, CauseKind.UNKNOWN)]

    # 2. every write, aimed straight at the ref: nothing is written
    for operation in (adapter.stop(REF), adapter.hold(REF, 1), adapter.release(REF)):
        with contextlib.suppress(ErrNotFound, ErrConflict, ProtocolError):
            await operation

    # 3. a whole tick of the real reconciler on a real store
    store = _store(tmp_path)
    before = _status(store)
    reconciler = Reconciler(store, adapter, metrics=Metrics(), clock=lambda: NOW,
                            settings=TickSettings(unknown_grace_s=600))
    report = await reconciler.tick()
    after = _status(store)
    store.dispose()
    RESULTS[case.name] = ((case.outcome if read_error is None
                           else f"error: {str(read_error)[:60]}"),
                          len(sink.writes()), sink.sbatches(),
                          case.outcome == "error" and after != before)
    assert sink.writes() == [], sink.writes()
    assert sink.sbatches() == 0
    if case.outcome == "error":
        assert not report.slurm_ok
        assert after == before  # no job changed on data that could not be read
    elif case.outcome in ("unknown", "foreign"):
        assert report.slurm_ok
        assert after["phase"] == "running" and after["slurm_job_id"] == SLURM_ID
        observed = {c["type"]: c for c in after["conditions"]}
        assert observed["Observed"]["status"] is False
        if case.outcome == "foreign":
            assert observed["ForeignObjects"]["status"] is True
    else:  # a live row in a state nobody knows: never guessed, never finished on
        assert (after["phase"], after["cause"]) == ("running", "none")
        observed = {c["type"]: c for c in after["conditions"]}
        assert (observed["Observed"]["status"], observed["Observed"]["reason"]) == (
            False, "UnknownState")


async def test_live_unknown_state_is_not_resubmitted_while_in_squeue(tmp_path: Path) -> None:
    live = squeue_row(State="TELEPORTING", StateCompact="TP") + "\n"
    adapter, sink = _adapter(live)
    store = _store(tmp_path, policy={"causes": {"unknown": {"action": "resubmit",
                                                            "budget": 1}},
                                     "backoff": {"initial_s": 0}})
    reconciler = Reconciler(store, adapter, metrics=Metrics(), clock=lambda: NOW)
    await reconciler.tick()
    await reconciler.tick()
    store.dispose()
    assert sink.sbatches() == 0


# ---------------------------------------------------------------- the JSON dialects

JSON_FILES = sorted(p for p in (ROOT / "testdata" / "slurm").glob("*/*.json"))


def _parser(path: Path) -> Any:
    is_sacct = "sacct" in path.name
    return dialects.parse_sacct if is_sacct else dialects.parse_squeue


def _json_mutations(doc: dict[str, Any], sacct: bool,
                    index: int) -> list[tuple[str, dict[str, Any], str]]:
    """(name, mutated document, expected: error | unknown | foreign) of ``jobs[index]``."""
    out: list[tuple[str, dict[str, Any], str]] = []
    dialect = dialects.detect_dialect(doc)

    def mutated(change: Any) -> dict[str, Any]:
        copy = json.loads(json.dumps(doc))
        copy["jobs"] = [copy["jobs"][index]]
        change(copy["jobs"][0])
        return copy

    def set_state(words: list[str]) -> Any:
        def change(job: dict[str, Any]) -> None:
            value: Any = words if dialect.list_states else words[0]
            if sacct:
                job["state"]["current"] = value
            else:
                job["job_state"] = value
        return change

    out.append(("unknown-base-state", mutated(set_state(["TELEPORTING"])), "unknown"))
    if dialect.list_states:
        base = "COMPLETED"
        out.append(("unknown-flag", mutated(set_state([base, "WARP_DRIVE"])), "unknown"))
    out.append(("odd-node-list", mutated(lambda j: j.__setitem__("nodes", "vm[2-")), "error"))
    out.append(("name-wrong-case", mutated(
        lambda j: j.__setitem__("name", "DJ-01JZ8Q2N5V0000000000000000")), "foreign"))

    def leading_zero(job: dict[str, Any]) -> None:
        job["name"] = "dj-01JZ8Q2N5V0000000000000000"
        if isinstance(job.get("comment"), dict):
            job["comment"]["job"] = "dispatch:s=01;a=0"
        else:
            job["comment"] = "dispatch:s=01;a=0"
    out.append(("comment-leading-zero", mutated(leading_zero), "foreign"))
    out.append(("job-id-string", mutated(lambda j: j.__setitem__("job_id", "12")), "error"))
    return out


@pytest.mark.parametrize("path", JSON_FILES, ids=[f"{p.parent.name}/{p.name}"
                                                  for p in JSON_FILES])
def test_malformed_json_dialects(path: Path) -> None:
    parse = _parser(path)
    text = path.read_text()
    try:
        parse(text)
    except ProtocolError:
        pytest.skip("not a document this parser reads (a probe or an error sample)")
    # truncated anywhere: always a clear error, never a partial list of jobs
    cuts = sorted({max(1, len(text) * k // 23) for k in range(1, 23)} | {len(text) - 2})
    for cut in cuts:
        with pytest.raises(ProtocolError):
            parse(text[:cut])
    # nested past the recursion limit, and a number past the int-string limit
    with pytest.raises(ProtocolError):
        parse("[" * 200_000)
    with pytest.raises(ProtocolError):
        parse('{"meta": ' + "1" * 5000 + "}")
    doc = json.loads(text)
    sacct = parse is dialects.parse_sacct
    source = "accounting" if sacct else "live"
    usable = []
    for index, job in enumerate(parse(text)):
        try:
            classify(job, source=source, cluster="lab", now=NOW)
            usable.append(index)
        except ProtocolError:
            continue
    if not usable:
        return
    for name, mutated, expected in _json_mutations(doc, sacct, usable[0]):
        try:
            jobs = parse(json.dumps(mutated))
        except ProtocolError:
            assert expected == "error", name
            continue
        assert expected != "error", name
        try:
            obs = classify(jobs[0], source=source, cluster="lab", now=NOW)
        except ProtocolError:
            assert expected == "unknown", name  # sacct refuses what it cannot tell apart
            continue
        if expected == "foreign":
            assert obs.foreign, name
        else:
            assert obs.cause.kind is CauseKind.UNKNOWN and obs.state is State.ENDED, name


def test_zz_malformed_figures(capsys: pytest.CaptureFixture[str]) -> None:
    """The row of fault 5 in the summary table."""
    assert len(RESULTS) == len(CASES), "run the whole module for the figures"
    counts: dict[str, int] = {}
    for outcome, _, _, _ in RESULTS.values():
        key = outcome.split(":", 1)[0]
        counts[key] = counts.get(key, 0) + 1
    writes = sum(r[1] + r[2] for r in RESULTS.values())
    changed = sum(1 for r in RESULTS.values() if r[3])
    emit("\nfault 5, per case: " + "; ".join(f"{k}={v[0]}" for k, v in sorted(RESULTS.items())),
         capsys)
    record_row(FaultRow(
        fault="5 malformed Slurm output", jobs_in_flight=len(CASES), lost=0,
        duplicates=0, wrong_writes=writes + changed, recovery_s=None,
        notes=(f"{len(CASES)} damaged squeue rows through find_many, stop/hold/release and "
               f"a real tick: {counts.get('error', 0)} clear errors (no job changed), "
               f"{counts.get('foreign', 0)} foreign, "
               f"{counts.get('unknown', 0) + counts.get('unknown-state', 0)} unknown; "
               f"{writes} Slurm writes/sbatch, {changed} jobs changed on unreadable data; "
               f"{len(JSON_FILES)} JSON samples truncated at 23 "
               "points each + nested/huge-number + 6 mutations")), capsys)

