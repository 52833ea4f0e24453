"""The two text forms the reader reads (squeue ``-O``, sacct ``-P``), normalised into
SlurmJob (SPEC §4.4).

22.05 inputs are recorded output (testdata/slurm/22.05, copied from the lab captures);
testdata/slurm/text is hand-written and mirrors the recorded jobs where it can.
"""

from __future__ import annotations

import calendar
from datetime import datetime
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controller.errors import ProtocolError
from controller.slurm.dialects import (
    SACCT_TEXT_COLUMNS,
    SACCT_TEXT_FIELDS,
    SQUEUE_TEXT_COLUMNS,
    SQUEUE_TEXT_COLUMNS_SLUID,
    SQUEUE_TEXT_FORMAT,
    SqueueLines,
    parse_duration,
    parse_sacct_text,
    parse_squeue_text,
    parse_text_time,
)
from controller.slurm.record import SlurmJob

DATA = Path(__file__).resolve().parent.parent / "testdata" / "slurm"
R22 = DATA / "22.05"

# The -O columns of the recorded 22.05 squeue text (captures-22.05/INDEX.md).
CAPTURED_SQUEUE_COLUMNS = ("JobID", "Name", "StateCompact", "State", "Reason", "SubmitTime",
                           "StartTime", "EndTime", "Comment", "NodeList", "Requeue",
                           "RestartCnt")
CAPTURED_SACCT_COLUMNS = ("JobID", "JobName", "State", "ExitCode", "Comment", "Submit",
                          "Start", "End", "NodeList", "Reason")


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def by_id(jobs: list[SlurmJob]) -> dict[int, SlurmJob]:
    return {job.job_id: job for job in jobs}


def captured_section(path: Path, marker: str) -> str:
    """The output lines that follow the command line containing ``marker``."""
    lines = read(path).splitlines()
    start = next(i for i, line in enumerate(lines)
                 if line.startswith(("#", "$")) and marker in line)
    out = []
    for line in lines[start + 1:]:
        if line.startswith(("rc=", "#", "$")):
            break
        out.append(line)
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------------------
# text: the formats the reader asks for


def test_text_format_constants() -> None:
    assert SQUEUE_TEXT_FORMAT.split(",")[:3] == ["JobID:|", "Name:|", "UserName:|"]
    assert SQUEUE_TEXT_FORMAT.endswith("Comment:|")
    assert len(SQUEUE_TEXT_FORMAT.split(",")) == len(SQUEUE_TEXT_COLUMNS)
    assert SACCT_TEXT_FIELDS.split(",") == list(SACCT_TEXT_COLUMNS)
    assert SACCT_TEXT_COLUMNS[-1] == "Comment"


def test_squeue_text_records() -> None:
    jobs = parse_squeue_text(read(DATA / "text" / "squeue.txt"))
    assert [j.job_id for j in jobs][:4] == [1, 2, 3, 5]
    got = by_id(jobs)
    assert got[9] == SlurmJob(
        job_id=9, name="dj-fail", user="root", base_state="FAILED", flags=(),
        reason="NonZeroExitCode", description="", comment="dispatch:s=9;a=0",
        submit_time=1796041112, eligible_time=1796041112, start_time=1796041113,
        end_time=1796041113, preempt_time=None, restart_count=0, nodes=("vm",),
        return_code=3, signal=None, time_limit_s=None, requeue=True, cluster="lab",
        state_text="FAILED")
    assert (got[26].base_state, got[26].flags, got[26].reason, got[26].description) == (
        "", ("REQUEUE_HOLD",), "JobHoldMaxRequeue",
        "launch failure limit exceeded requeued held")
    assert (got[22].reason, got[22].description, got[22].signal) == (
        "RaisedSignal", "RaisedSignal:9(Killed)", 9)
    assert got[30].time_limit_s == 100000 * 60
    assert got[2].time_limit_s == 60
    assert got[21].preempt_time == 1796050100


@pytest.mark.parametrize(("capture", "job_id", "fields"), [
    pytest.param("failed-exit3", 9, {"base_state": "FAILED", "reason": "NonZeroExitCode",
                                     "submit_time": 1796041112, "end_time": 1796041113,
                                     "requeue": True, "restart_count": 0,
                                     "return_code": None}, id="failed"),
    pytest.param("pending-held", 3, {"base_state": "PENDING", "reason": "JobHeldUser",
                                     "start_time": None, "end_time": None, "nodes": ()},
                 id="held"),
    pytest.param("running", 6, {"base_state": "RUNNING", "end_time": None, "nodes": ("vm",)},
                 id="running"),
    pytest.param("requeuehold-running", 6,
                 {"base_state": "PENDING", "reason": "JobHeldUser",
                  "description": "job requeued in held state", "restart_count": 1,
                  "submit_time": 1796041129}, id="requeue-hold-description"),
    pytest.param("nodefail-norequeue", 13, {"base_state": "NODE_FAIL", "reason": "NodeDown",
                                            "requeue": False}, id="node-fail"),
    pytest.param("cancelled", 10, {"base_state": "CANCELLED", "comment": "dispatch:s=10;a=0"},
                 id="cancelled"),
])
def test_recorded_22_05_squeue_text(capture: str, job_id: int,
                                    fields: dict[str, object]) -> None:
    text = captured_section(R22 / f"{capture}.squeue-text.txt", "-O")
    [job] = parse_squeue_text(text, columns=CAPTURED_SQUEUE_COLUMNS)
    assert job.job_id == job_id
    assert {key: getattr(job, key) for key in fields} == fields


def test_recorded_22_05_sacct_text() -> None:
    text = captured_section(R22 / "sacct-text.txt", "sacct -D")
    body = "\n".join(text.splitlines()[1:])  # that capture kept sacct's header line
    jobs = parse_sacct_text(body, columns=CAPTURED_SACCT_COLUMNS)
    assert [(j.job_id, j.state_text) for j in jobs] == [
        (10, "COMPLETED"), (11, "FAILED"), (12, "CANCELLED by 0"), (13, "COMPLETED"),
        (14, "NODE_FAIL"), (15, "NODE_FAIL"), (16, "CANCELLED by 0"), (14, "CANCELLED by 0"),
        (17, "TIMEOUT"), (18, "REQUEUED"), (18, "PENDING")]
    got = {(j.job_id, j.submit_time): j for j in jobs}
    failed = got[11, 1796041338]
    assert (failed.return_code, failed.signal, failed.comment) == (3, None, "dispatch:s=22;a=0")
    held = got[16, 1796041338]
    assert (held.nodes, held.start_time, held.reason, held.base_state) == (
        (), None, "JobHeldUser", "CANCELLED")
    assert held.kill_request_user is None  # no UID column: the requester cannot be compared
    pending = got[18, 1796041367]
    assert (pending.comment, pending.start_time, pending.end_time) == (None, None, None)
    requeued = got[18, 1796041362]
    assert (requeued.base_state, requeued.flags) == ("", ("REQUEUED",))


def test_sacct_text_records() -> None:
    jobs = parse_sacct_text(read(DATA / "text" / "sacct.txt"))
    assert [j.job_id for j in jobs] == [10, 11, 12, 15, 41, 42, 43, 44, 45, 46, 47]
    got = by_id(jobs)
    assert got[41].kill_request_user == "uid=1001"
    assert got[12].kill_request_user == "root"
    assert got[41].signal == 15 and got[41].return_code is None
    assert got[11].return_code == 3
    assert got[42].time_limit_s == 3600
    assert got[43].comment is None


SQ_ROW = ("7|dj-x|svc|R|RUNNING|None|2026-11-30T12:00:00|2026-11-30T12:00:00|"
          "2026-11-30T12:00:01|NONE|N/A|UNLIMITED|1|0|0|vm|lab|dispatch:s=1;a=0|")


@pytest.mark.parametrize(("compact", "state", "base", "flags"), [
    pytest.param("R", "RUNNING,FUTURE_FLAG", "RUNNING", ("FUTURE_FLAG",), id="unknown-flag"),
    pytest.param("WP", "WARPED", "WARPED", (), id="unknown-base"),
    pytest.param("PD", "PENDING,EXPEDITING", "PENDING", ("EXPEDITING",), id="known-flag"),
    pytest.param("SO", "STAGE_OUT", "", ("STAGE_OUT",), id="flag-in-place-of-base"),
])
def test_unknown_states_are_kept_raw(compact: str, state: str, base: str,
                                     flags: tuple[str, ...]) -> None:
    """Never refused here: classify reports an unknown state as unknown."""
    [job] = parse_squeue_text(SQ_ROW.replace("|R|RUNNING|", f"|{compact}|{state}|"))
    assert (job.base_state, job.flags) == (base, flags)


def test_not_text() -> None:
    with pytest.raises(ProtocolError):
        parse_squeue_text(None)  # type: ignore[arg-type]
    with pytest.raises(ProtocolError):
        parse_sacct_text(b"1|x")  # type: ignore[arg-type]


@pytest.mark.parametrize(("text", "message"), [
    pytest.param(SQ_ROW[:-1], "truncated", id="no-final-separator"),
    pytest.param(SQ_ROW[:60] + "|", "fields", id="cut-short"),
    pytest.param(SQ_ROW.replace("|R|", "|PD|"), "StateCompact", id="compact-disagrees"),
    pytest.param(SQ_ROW.replace("7|", "7_1|", 1), "JobID", id="array-id"),
    pytest.param(SQ_ROW.replace("|0|0|vm|", "|x|0|vm|"), "RestartCnt", id="bad-restarts"),
    pytest.param(SQ_ROW.replace("|0|vm|", "|boom|vm|"), "exit_code", id="bad-exit-code"),
    pytest.param(SQ_ROW.replace("2026-11-30T12:00:01", "yesterday"), "StartTime",
                 id="bad-time"),
    pytest.param(SQ_ROW.replace("UNLIMITED", "forever"), "TimeLimit", id="bad-limit"),
    pytest.param(SQ_ROW.replace("|1|0|0|", "|maybe|0|0|"), "Requeue", id="bad-requeue"),
    pytest.param(SQ_ROW.replace("|vm|", "|vm[1-|"), "unbalanced", id="bad-nodes"),
    pytest.param(SQ_ROW.replace("|RUNNING|", "||"), "state name", id="empty-state"),
])
def test_malformed_squeue_text(text: str, message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        parse_squeue_text(text)


def test_squeue_text_comment_may_hold_separators() -> None:
    [job] = parse_squeue_text(SQ_ROW.replace("dispatch:s=1;a=0", "a|b|c"))
    assert job.comment == "a|b|c"
    [job] = parse_squeue_text(SQ_ROW.replace("dispatch:s=1;a=0", "(null)"))
    assert job.comment is None


def test_squeue_text_epoch_times_and_blank_lines() -> None:
    row = SQ_ROW.replace("2026-11-30T12:00:00", "1796040000")
    [job] = parse_squeue_text(f"\n{row}\n\n")
    assert job.submit_time == 1796040000


SA_ROW = ("7|dj-x|svc|1000|COMPLETED|None|2026-11-30T12:00:00|2026-11-30T12:00:00|"
          "2026-11-30T12:00:01|2026-11-30T12:00:09|0:0|vm|01:00:00|lab|dispatch:s=1;a=0")


@pytest.mark.parametrize(("text", "message"), [
    pytest.param(SA_ROW.replace("|0:0|", "|0|"), "ExitCode", id="exit-not-pair"),
    pytest.param(SA_ROW.replace("|COMPLETED|", "|completed?|"), "state", id="odd-state"),
    pytest.param(SA_ROW.replace("7|", "7+0|", 1), "JobIDRaw", id="het-id"),
    pytest.param("|".join(SA_ROW.split("|")[:8]), "fields", id="cut-short"),
    pytest.param(SA_ROW.replace("|vm|", "|vm,,x|"), "sacct line 1 NodeList: .*empty element",
                 id="bad-nodes"),
    pytest.param(SA_ROW.replace("|1000|COMPLETED|", "|x|CANCELLED by 5|"), "UID",
                 id="bad-uid"),
])
def test_malformed_sacct_text(text: str, message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        parse_sacct_text(text)


def test_sacct_text_skips_steps_and_keeps_order() -> None:
    rows = [SA_ROW.replace("7|", "9|", 1), "9.batch|batch||||||||||vm|||",
            "9.extern|extern||||||||||vm|||", "9.0|sleep||||||||||vm|||", SA_ROW]
    assert [j.job_id for j in parse_sacct_text("\n".join(rows))] == [9, 7]


@pytest.mark.parametrize("columns", [
    pytest.param(("JobID", "Name"), id="missing-required"),
    pytest.param((*SQUEUE_TEXT_COLUMNS, "Shoes"), id="unknown-column"),
    pytest.param((*SQUEUE_TEXT_COLUMNS, "JobID"), id="repeated"),
])
def test_squeue_text_columns_checked(columns: tuple[str, ...]) -> None:
    with pytest.raises(ProtocolError, match="columns"):
        parse_squeue_text(SQ_ROW, columns=columns)


@pytest.mark.parametrize(("text", "expected"), [
    pytest.param("2026-11-30T12:18:23", 1796041103, id="iso-as-utc"),
    pytest.param("1796041103", 1796041103, id="epoch"),
    pytest.param("N/A", None, id="na"),
    pytest.param("Unknown", None, id="unknown"),
    pytest.param("NONE", None, id="none-upper"),
    pytest.param("None", None, id="none"),
    pytest.param("", None, id="empty"),
    pytest.param("0", None, id="zero"),
])
def test_parse_text_time(text: str, expected: int | None) -> None:
    assert parse_text_time(text) == expected


@pytest.mark.parametrize("text", ["2026-11-30 12:18:23", "12:18:23", "2026-13-01T00:00:00",
                                  "-5", "2026-11-30T12:18:23Z"])
def test_parse_text_time_refuses(text: str) -> None:
    with pytest.raises(ProtocolError):
        parse_text_time(text)


@pytest.mark.parametrize(("text", "seconds"), [
    pytest.param("UNLIMITED", None, id="unlimited"),
    pytest.param("Partition_Limit", None, id="partition-limit"),
    pytest.param("1:00", 60, id="minutes-seconds"),
    pytest.param("01:00:00", 3600, id="hours"),
    pytest.param("1:00:00", 3600, id="hours-short"),
    pytest.param("2-03:04:05", 2 * 86400 + 3 * 3600 + 4 * 60 + 5, id="days"),
    pytest.param("2-03", 2 * 86400 + 3 * 3600, id="days-hours"),
    pytest.param("2-03:04", 2 * 86400 + 3 * 3600 + 4 * 60, id="days-hours-minutes"),
    pytest.param("90", 5400, id="bare-minutes"),
])
def test_parse_duration(text: str, seconds: int | None) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["1h", "1:2:3:4", "-1", "1-", "INVALID"])
def test_parse_duration_refuses(text: str) -> None:
    with pytest.raises(ProtocolError):
        parse_duration(text)


# --------------------------------------------------------------------------------------
# the reader's own formats, recorded on the 22.05 lab cluster (22.05/probe.when.txt)


def test_recorded_full_squeue_text() -> None:
    from_text = parse_squeue_text(read(R22 / "probe.squeue-text.txt"))
    assert [(j.job_id, j.base_state, j.reason, j.return_code) for j in from_text] == [
        (1, "FAILED", "NonZeroExitCode", 3), (2, "PENDING", "JobHeldUser", 0),
        (3, "RUNNING", "", 0)]
    assert from_text[1].eligible_time == 1796043182 + 3650 * 86400


def test_recorded_full_squeue_text_after_cancel() -> None:
    jobs = by_id(parse_squeue_text(read(R22 / "probe-after-cancel.squeue-text.txt")))
    assert (jobs[3].base_state, jobs[3].signal, jobs[3].end_time) == (
        "CANCELLED", 15, 1796043187)


def test_recorded_full_sacct_text() -> None:
    jobs = parse_sacct_text(read(R22 / "probe.sacct-text.txt"))
    assert [j.job_id for j in jobs] == [1, 3]
    # the failed job's true exit code (22.05's sacct JSON reported it as 0)
    assert [j.return_code for j in jobs] == [3, None]


def test_squeue_lines_decode_each_line_on_its_own() -> None:
    """``SqueueLines`` reuses the decoded value of a field text it saw before (a 100k-job
    queue prints few distinct ones), yet every line keeps its own values, and a bad field
    fails with the number of its own line, also after good lines with the same layout."""
    other = (SQ_ROW.replace("7|", "8|", 1).replace("|R|RUNNING|", "|PD|PENDING|")
             .replace("2026-11-30T12:00:01", "2026-11-30T12:00:05"))
    jobs = parse_squeue_text(f"{SQ_ROW}\n{other}\n{SQ_ROW}\n")
    assert [(j.job_id, j.base_state, j.start_time) for j in jobs] == [
        (7, "RUNNING", 1796040001), (8, "PENDING", 1796040005), (7, "RUNNING", 1796040001)]
    assert jobs[0] == jobs[2] and jobs[0] is not jobs[2]
    bad = SQ_ROW.replace("2026-11-30T12:00:01", "yesterday")
    with pytest.raises(ProtocolError, match="squeue line 3 StartTime"):
        parse_squeue_text(f"{SQ_ROW}\n{other}\n{bad}\n{SQ_ROW}\n")
    with pytest.raises(ProtocolError, match="squeue line 2: State"):
        parse_squeue_text(f"{SQ_ROW}\n{SQ_ROW.replace('|R|', '|PD|')}\n")


# (the SLUID layout's row: SQ_ROW with a SLUID before the comment)
SQ_ROW_SLUID = SQ_ROW.replace("|lab|", "|lab|sE0HM8R59HN500|")
_FIELD_TEXT = st.text(alphabet="|0123456789,:-T_[]NAUKnoelvmsdR\u00b2 ", max_size=24)


def _outcome(parse: object, line: str) -> object:
    try:
        return parse(line, 1)  # type: ignore[operator]
    except ProtocolError as exc:
        return ("refused", str(exc))


@settings(max_examples=400, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(sluid=st.booleans(), field=st.integers(min_value=0, max_value=18),
       text=_FIELD_TEXT, other=st.integers(min_value=0, max_value=18),
       other_text=st.none() | _FIELD_TEXT, twice=st.booleans())
def test_squeue_lines_fast_path_reads_as_the_whole_path(sluid: bool, field: int, text: str,
                                                          other: int, other_text: str | None,
                                                          twice: bool) -> None:
    """``SqueueLines.line`` cuts a line into its id, name, node list, SLUID and the rest
    (the key of a record decoded before): whatever a field holds -- an extra '|', a digit
    int() refuses, a bad time -- it reads as the parser that checks every field of every
    line (``_whole``), after a good line of the same layout as well as on its own."""
    columns = SQUEUE_TEXT_COLUMNS_SLUID if sluid else SQUEUE_TEXT_COLUMNS
    good = SQ_ROW_SLUID if sluid else SQ_ROW
    fields = good[:-1].split("|")
    fields[field % len(fields)] = text
    if other_text is not None:  # (two fields changed: the first bad one is reported)
        fields[other % len(fields)] = other_text
    line = "|".join(fields) + "|"
    fast, whole = SqueueLines(columns), SqueueLines(columns)
    for parser in (fast, whole):
        assert parser.line(good, 1) == parser._whole(good, 1)
    assert _outcome(fast.line, line) == _outcome(whole._whole, line)
    if twice:  # the second time, from the record the first one left
        assert _outcome(fast.line, line) == _outcome(whole._whole, line)


def test_squeue_lines_fast_path_takes_each_lines_own_id_name_nodes_and_sluid() -> None:
    parser = SqueueLines(SQUEUE_TEXT_COLUMNS_SLUID)
    first = parser.line(SQ_ROW_SLUID, 1)
    other = (SQ_ROW_SLUID.replace("7|dj-x|", "8|dj-y|", 1).replace("|vm|", "|vm[1-2]|")
             .replace("sE0HM8R59HN500", "sE0HM8R59HN501"))
    second = parser.line(other, 2)
    assert (first.job_id, first.name, first.nodes, first.sluid) == (
        7, "dj-x", ("vm",), "sE0HM8R59HN500")
    assert (second.job_id, second.name, second.nodes, second.sluid) == (
        8, "dj-y", ("vm1", "vm2"), "sE0HM8R59HN501")
    assert second == parser._whole(other, 2)
    with pytest.raises(ProtocolError, match="squeue line 3 JobID: job id 0"):
        parser.line(other.replace("8|", "0|", 1), 3)
    with pytest.raises(ProtocolError, match="squeue line 4 SLUID"):
        parser.line(other.replace("sE0HM8R59HN501", "bogus"), 4)
    with pytest.raises(ProtocolError, match=r"squeue line 5 NodeList: unbalanced '\]'"):
        parser.line(other.replace("|vm[1-2]|", "|vm1-2]|"), 5)
    with pytest.raises(ProtocolError, match=r"squeue line 6 NodeList: nested '\['"):
        parser._whole(other.replace("|vm[1-2]|", "|vm[[1-2]|"), 6)


@settings(max_examples=2000, deadline=None, database=None)
@given(year=st.sampled_from([0, 1, 1600, 1900, 1969, 1970, 2000, 2024, 2026, 2100, 2400, 9999])
       | st.integers(min_value=0, max_value=9999),
       month=st.integers(min_value=0, max_value=13), day=st.integers(min_value=0, max_value=32),
       hour=st.integers(min_value=0, max_value=25), minute=st.integers(min_value=0, max_value=61),
       second=st.integers(min_value=0, max_value=61))
def test_a_calendar_time_reads_as_timegm_and_datetime_would(year: int, month: int, day: int,
                                                            hour: int, minute: int,
                                                            second: int) -> None:
    """``parse_text_time``'s arithmetic gives ``calendar.timegm``'s epoch for every time
    ``datetime`` accepts and refuses every time it refuses (leap years, month ends)."""
    text = f"{year:04d}-{month:02d}-{day:02d}T{hour:02d}:{minute:02d}:{second:02d}"
    try:
        datetime(year, month, day, hour, minute, second)
    except ValueError:
        with pytest.raises(ProtocolError, match="not a Slurm time"):
            parse_text_time(text)
    else:
        assert parse_text_time(text) == calendar.timegm(
            (year, month, day, hour, minute, second))
