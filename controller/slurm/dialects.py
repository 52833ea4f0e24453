"""Every Slurm output dialect the adapter reads, normalised into one ``SlurmJob`` record.

Pure: text in, records out. Covered (SPEC §4.4):

* squeue / ``scontrol show job`` JSON: 22.05's ``openapi/v0.0.37``/``v0.0.38`` and the
  ``data_parser`` versions v0.0.39 (23.02) .. v0.0.44 (25.11, 26.05), plus v0.0.45;
* sacct JSON: 22.05's ``openapi/dbv0.0.37``/``dbv0.0.38`` and data_parser v0.0.39 .. v0.0.45;
* squeue text: ``squeue -h --states=all -O <SQUEUE_TEXT_FORMAT>``;
* sacct text: ``sacct -P -n -D -o <SACCT_TEXT_FIELDS>`` (step rows are skipped).

The dialect of a JSON document comes from its ``meta`` block; the shape of every field
the adapter uses is then checked against that dialect. Anything malformed (bad JSON,
a missing required field, a wrong type, an unknown node-list form, an unsupported
version) raises ProtocolError and yields no record at all. Unknown state *names* are
not an error here: they are kept raw and ``classify`` reports them as unknown.

Normalisation rules worth knowing (the rest is in the helpers' docstrings):

* times: ``0``, ``{"set": false}`` and ``{"infinite": true}`` become None;
* Slurm's reason ``None`` (WAIT_NO_REASON) becomes ``""``; comments ``""``/``(null)`` None;
* single-string states (22.05, v0.0.39, squeue text) print a *flag* in place of the base
  state when one is set (``COMPLETING`` for any ending or requeueing job); such a
  record has ``base_state == ""`` (not reported) and the flag in ``flags``. A text state
  of several comma-separated words (``CANCELLED,COMPLETING``) is base then flags;
* exit codes become ``return_code`` (normal exit) or ``signal`` (killed). 22.05 squeue
  JSON prints the raw wait status (768 = exit 3, 15 = SIGTERM). sacct JSON before
  v0.0.40 reports ``SUCCESS``/0 for every normal exit, even exit 3 (a Slurm bug), so
  there its return code is None (unknown); the sacct *text* form prints the truth.
"""

from __future__ import annotations

import calendar
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Final, TypeGuard

from controller.errors import ProtocolError
from controller.slurm.hostlist import expand_hostlist
from controller.slurm.record import SlurmJob

# --------------------------------------------------------------------------------------
# Slurm's state vocabulary (slurm.h; data_parser v0.0.40..v0.0.45 JOB_STATE names)

BASE_STATES: Final = frozenset({
    "PENDING", "RUNNING", "SUSPENDED", "COMPLETED", "CANCELLED", "FAILED", "TIMEOUT",
    "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY",
})

# v0.0.44's flags, plus UPDATE_DB, which v0.0.40 and v0.0.41 still print.
KNOWN_FLAGS: Final = frozenset({
    "LAUNCH_FAILED", "UPDATE_DB", "REQUEUED", "REQUEUE_HOLD", "SPECIAL_EXIT", "RESIZING",
    "CONFIGURING", "COMPLETING", "STOPPED", "RECONFIG_FAIL", "POWER_UP_NODE", "REVOKED",
    "REQUEUE_FED", "RESV_DEL_HOLD", "SIGNALING", "STAGE_OUT", "EXPEDITING",
})

# squeue's compact state codes (job_state_string_compact), used to cross-check a text row.
_COMPACT: Final[Mapping[str, str]] = {
    "PENDING": "PD", "RUNNING": "R", "SUSPENDED": "S", "COMPLETED": "CD", "CANCELLED": "CA",
    "FAILED": "F", "TIMEOUT": "TO", "NODE_FAIL": "NF", "PREEMPTED": "PR", "BOOT_FAIL": "BF",
    "DEADLINE": "DL", "OUT_OF_MEMORY": "OOM", "COMPLETING": "CG", "STAGE_OUT": "SO",
    "CONFIGURING": "CF", "RESIZING": "RS", "REQUEUED": "RQ", "REQUEUE_FED": "RF",
    "REQUEUE_HOLD": "RH", "SPECIAL_EXIT": "SE", "STOPPED": "ST", "REVOKED": "RV",
    "RESV_DEL_HOLD": "RD", "SIGNALING": "SI",
}

NO_REASON = "None"  # Slurm's WAIT_NO_REASON, normalised to ""

# --------------------------------------------------------------------------------------
# The text forms the reader asks for. Comment is last so a '|' inside it stays in it.

SQUEUE_TEXT_COLUMNS: Final = (
    "JobID", "Name", "UserName", "StateCompact", "State", "Reason", "SubmitTime",
    "EligibleTime", "StartTime", "EndTime", "PreemptTime", "TimeLimit", "Requeue",
    "RestartCnt", "exit_code", "NodeList", "Cluster", "Comment",
)
# The argument of ``squeue -h --states=all -O``: width 0 (":") prints each field whole,
# and "|" is its suffix, so every row ends with "|".
SQUEUE_TEXT_FORMAT: Final = ",".join(f"{column}:|" for column in SQUEUE_TEXT_COLUMNS)
# With Slurm's unique job id, where squeue has it (25.11+; 24.11 and 22.05 refuse the
# field -- squeue prints an error and NO rows but exits 0 -- so ask only after Preflight
# found it). Still Comment last.
SQUEUE_TEXT_COLUMNS_SLUID: Final = (*SQUEUE_TEXT_COLUMNS[:-1], "SLUID", "Comment")
SQUEUE_TEXT_FORMAT_SLUID: Final = ",".join(f"{column}:|"
                                           for column in SQUEUE_TEXT_COLUMNS_SLUID)

SACCT_TEXT_COLUMNS: Final = (
    "JobIDRaw", "JobName", "User", "UID", "State", "Reason", "Submit", "Eligible", "Start",
    "End", "ExitCode", "NodeList", "Timelimit", "Cluster", "Comment",
)
# The argument of ``sacct -P -n -D -o`` (parsable: '|' between fields, none at the end).
SACCT_TEXT_FIELDS: Final = ",".join(SACCT_TEXT_COLUMNS)
# With the SLUID, where sacct has it (24.11+; 22.05 refuses the field).
SACCT_TEXT_COLUMNS_SLUID: Final = (*SACCT_TEXT_COLUMNS[:-1], "SLUID", "Comment")
SACCT_TEXT_FIELDS_SLUID: Final = ",".join(SACCT_TEXT_COLUMNS_SLUID)

# --------------------------------------------------------------------------------------
# JSON dialects

_MIN_VERSION, _MAX_VERSION = 37, 45
_NO_VAL = 0xFFFFFFFE  # NO_VAL (uint32): "not set"
_NO_VAL64 = 0xFFFFFFFFFFFFFFFE
_INFINITE64 = 0xFFFFFFFFFFFFFFFF
_DATA_PARSER_RE = re.compile(r"(?:data_parser/)?v0\.0\.([0-9]+)")
_OPENAPI_RE = re.compile(r"openapi/(db)?v0\.0\.([0-9]+)")


@dataclass(frozen=True, slots=True)
class JsonDialect:
    """Which serialiser printed a JSON document, from its ``meta`` block."""

    number: int  # 38 for v0.0.38 / dbv0.0.38, 44 for data_parser v0.0.44
    accounting: bool  # openapi/dbv0.0.3x: 22.05's sacct plugin
    release: str | None  # "22.05.8", when meta says

    @property
    def version(self) -> str:
        prefix = "dbv" if self.accounting else "v"
        return f"{prefix}0.0.{self.number}"

    @property
    def list_states(self) -> bool:
        """v0.0.40+: ``job_state`` is a list (base first, then flags)."""
        return self.number >= 40

    @property
    def struct_times(self) -> bool:
        """v0.0.40+: squeue times are ``{set, infinite, number}``."""
        return self.number >= 40


class SlurmReportedError(ProtocolError):
    """The JSON document carries Slurm's own ``errors[]``: no job in it is trusted.

    ``errors`` holds ``(error_number, description)`` pairs, so the adapter can map, say,
    ``ESLURM_INVALID_JOB_ID`` (2017) to ErrNotFound.
    """

    def __init__(self, errors: tuple[tuple[int | None, str], ...]) -> None:
        self.errors = errors
        text = "; ".join(f"{number}: {description}" for number, description in errors)
        super().__init__(f"Slurm reported errors: {text}")


def detect_version(text: str) -> str:
    """The serialiser version of a squeue/scontrol/sacct JSON document: ``v0.0.38``,
    ``dbv0.0.38`` (22.05's sacct), ``v0.0.39`` .. ``v0.0.45``. For Preflight."""
    return detect_dialect(_load(text)).version


def slurm_release(text: str) -> str | None:
    """``meta.slurm.release`` (``"22.05.8"``) of a JSON document, when it says."""
    return detect_dialect(_load(text)).release


def detect_dialect(document: object) -> JsonDialect:
    """The dialect named by ``document["meta"]``; ProtocolError when none is supported."""
    top = _obj(document, "document")
    meta = _obj(_req(top, "meta", "document"), "meta")
    plugin = _obj(_req(meta, "plugin", "meta"), "meta.plugin")
    slurm = meta.get("slurm", meta.get("Slurm"))
    release = None
    if isinstance(slurm, dict) and isinstance(slurm.get("release"), str):
        release = slurm["release"] or None

    data_parser = plugin.get("data_parser")
    if isinstance(data_parser, str) and data_parser:
        match = _DATA_PARSER_RE.fullmatch(data_parser.split("+", 1)[0])
        if match is None:
            raise ProtocolError(f"unknown meta.plugin.data_parser {data_parser!r:.80}")
        dialect = JsonDialect(int(match.group(1)), accounting=False, release=release)
        if dialect.number < 39:
            raise ProtocolError(f"data_parser version {data_parser!r} does not exist")
    else:
        kind = plugin.get("type")
        match = _OPENAPI_RE.fullmatch(kind) if isinstance(kind, str) else None
        if match is None:
            raise ProtocolError(f"meta.plugin names no known serialiser: {plugin!r:.200}")
        dialect = JsonDialect(int(match.group(2)), accounting=match.group(1) == "db",
                              release=release)
        if dialect.number > 38:
            raise ProtocolError(f"openapi plugin {kind!r} is not a 22.05 CLI serialiser")
    if not _MIN_VERSION <= dialect.number <= _MAX_VERSION:
        raise ProtocolError(f"unsupported Slurm JSON version {dialect.version}")
    return dialect


def parse_squeue(text: str) -> list[SlurmJob]:
    """Records of ``squeue --json`` / ``scontrol show job --json`` output, in order."""
    document = _load(text)
    dialect = detect_dialect(document)
    if dialect.accounting:
        raise ProtocolError(f"{dialect.version} is sacct output, not squeue output")
    jobs, cluster = _envelope(document)
    return [_squeue_job(raw, dialect, f"jobs[{index}]", cluster)
            for index, raw in enumerate(jobs)]


def parse_sacct(text: str) -> list[SlurmJob]:
    """Records of ``sacct --json`` output (allocations; steps are nested and ignored)."""
    document = _load(text)
    dialect = detect_dialect(document)
    if dialect.number <= 38 and not dialect.accounting:
        raise ProtocolError(f"{dialect.version} is squeue output, not sacct output")
    jobs, cluster = _envelope(document)
    return [_sacct_job(raw, dialect, f"jobs[{index}]", cluster)
            for index, raw in enumerate(jobs)]


def _load(text: str) -> object:
    if not isinstance(text, str):
        raise ProtocolError(f"expected JSON text, got {type(text).__name__}")
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, the int-digits limit,
        # and nesting past the recursion limit (RecursionError is no ValueError)
        raise ProtocolError(f"malformed JSON from Slurm: {str(exc)[:200]}") from exc


def _envelope(document: object) -> tuple[list[object], str]:
    """``jobs[]`` and the cluster named in ``meta``; refuses a document with errors."""
    top = _obj(document, "document")
    errors = top.get("errors", [])
    if not isinstance(errors, list):
        raise ProtocolError("document.errors is not a list")
    if errors:
        raise SlurmReportedError(tuple(_slurm_error(item) for item in errors))
    jobs = _req(top, "jobs", "document")
    if not isinstance(jobs, list):
        raise ProtocolError("document.jobs is not a list")
    meta = _obj(top["meta"], "meta")
    slurm = meta.get("slurm", meta.get("Slurm"))
    cluster = ""
    if isinstance(slurm, dict) and isinstance(slurm.get("cluster"), str):
        cluster = slurm["cluster"]
    return jobs, cluster


def _slurm_error(item: object) -> tuple[int | None, str]:
    if not isinstance(item, dict):
        return None, repr(item)[:200]
    number = item.get("error_number", item.get("errno"))
    description = item.get("description") or item.get("error") or ""
    return (number if _is_int(number) else None), str(description)


def _squeue_job(raw: object, dialect: JsonDialect, path: str, cluster: str) -> SlurmJob:
    job = _obj(raw, path)
    base, flags, state_text = _json_state(_req(job, "job_state", path), dialect,
                                          f"{path}.job_state")
    time_of = _struct_time if dialect.struct_times else _int_time
    return_code, signal = (_process_exit_code if dialect.number >= 40 else _raw_exit_code)(
        _req(job, "exit_code", path), f"{path}.exit_code")
    return SlurmJob(
        job_id=_job_id(_req(job, "job_id", path), f"{path}.job_id"),
        name=_str(_req(job, "name", path), f"{path}.name"),
        user=_opt_str(job.get("user_name"), f"{path}.user_name") or None,
        base_state=base,
        flags=flags,
        reason=_reason(_str(_req(job, "state_reason", path), f"{path}.state_reason")),
        description=_opt_str(job.get("state_description"), f"{path}.state_description"),
        comment=_comment(_opt_str(job.get("comment"), f"{path}.comment")),
        submit_time=time_of(_req(job, "submit_time", path), f"{path}.submit_time"),
        eligible_time=time_of(_req(job, "eligible_time", path), f"{path}.eligible_time"),
        start_time=time_of(_req(job, "start_time", path), f"{path}.start_time"),
        end_time=time_of(_req(job, "end_time", path), f"{path}.end_time"),
        preempt_time=(time_of(job["preempt_time"], f"{path}.preempt_time")
                      if "preempt_time" in job else None),
        restart_count=_count(_req(job, "restart_cnt", path), f"{path}.restart_cnt"),
        nodes=expand_hostlist(_str(_req(job, "nodes", path), f"{path}.nodes")),
        return_code=return_code,
        signal=signal,
        time_limit_s=_minutes(job.get("time_limit"), f"{path}.time_limit"),
        requeue=_opt_bool(job.get("requeue"), f"{path}.requeue"),
        cluster=_opt_str(job.get("cluster"), f"{path}.cluster") or cluster,
        state_text=state_text,
    )


def _sacct_job(raw: object, dialect: JsonDialect, path: str, cluster: str) -> SlurmJob:
    job = _obj(raw, path)
    state = _obj(_req(job, "state", path), f"{path}.state")
    base, flags, state_text = _json_state(_req(state, "current", f"{path}.state"), dialect,
                                          f"{path}.state.current")
    times = _obj(_req(job, "time", path), f"{path}.time")
    comment = job.get("comment")
    job_comment = None
    if comment is not None:
        comments = _obj(comment, f"{path}.comment")
        job_comment = _comment(_opt_str(comments.get("job"), f"{path}.comment.job"))
    restart = job.get("restart_cnt")  # v0.0.42+
    return_code, signal = (_process_exit_code if dialect.number >= 40 else _legacy_exit_code)(
        _req(job, "exit_code", path), f"{path}.exit_code")
    return SlurmJob(
        job_id=_job_id(_req(job, "job_id", path), f"{path}.job_id"),
        name=_str(_req(job, "name", path), f"{path}.name"),
        user=_opt_str(job.get("user"), f"{path}.user") or None,
        base_state=base,
        flags=flags,
        reason=_reason(_str(_req(state, "reason", f"{path}.state"), f"{path}.state.reason")),
        description="",
        comment=job_comment,
        submit_time=_int_time(_req(times, "submission", f"{path}.time"),
                              f"{path}.time.submission"),
        eligible_time=_int_time(times.get("eligible"), f"{path}.time.eligible"),
        start_time=_int_time(_req(times, "start", f"{path}.time"), f"{path}.time.start"),
        end_time=_int_time(_req(times, "end", f"{path}.time"), f"{path}.time.end"),
        preempt_time=None,
        restart_count=None if restart is None else _count(restart, f"{path}.restart_cnt"),
        nodes=expand_hostlist(_str(_req(job, "nodes", path), f"{path}.nodes")),
        return_code=return_code,
        signal=signal,
        time_limit_s=_minutes(times.get("limit"), f"{path}.time.limit"),
        requeue=None,
        cluster=_opt_str(job.get("cluster"), f"{path}.cluster") or cluster,
        kill_request_user=_opt_str(job.get("kill_request_user"),
                                   f"{path}.kill_request_user") or None,
        requester_recorded="kill_request_user" in job,
        state_text=state_text,
    )


# --------------------------------------------------------------------------------------
# States


def split_state_words(words: list[str]) -> tuple[str, tuple[str, ...]]:
    """(base, flags) of state words. A first word that is a flag means the base state
    was not reported (``""``); any other unknown first word is kept raw as the base."""
    first, rest = words[0], tuple(words[1:])
    if first in KNOWN_FLAGS:
        return "", (first, *rest)
    return first, rest


def _json_state(value: object, dialect: JsonDialect,
                path: str) -> tuple[str, tuple[str, ...], str]:
    if dialect.list_states:
        if not isinstance(value, list) or not value:
            raise ProtocolError(f"{path}: expected a non-empty list of state names")
        words = [_word(item, path) for item in value]
    else:
        words = [_word(value, path)]
    base, flags = split_state_words(words)
    return base, flags, ",".join(words)


def _word(value: object, path: str) -> str:
    if not isinstance(value, str) or not value or value != value.strip():
        raise ProtocolError(f"{path}: expected a state name, got {value!r:.80}")
    return value


# --------------------------------------------------------------------------------------
# Exit codes


def _wait_status(status: int) -> tuple[int | None, int | None]:
    """(return code, signal) of a raw wait status (768 → exit 3; 15 → SIGTERM)."""
    if status >= _NO_VAL:
        return None, None
    low = status & 0x7F
    if low == 0:
        return (status >> 8) & 0xFF, None
    if low != 0x7F:
        return None, low
    return None, None  # stopped / invalid


def _raw_exit_code(value: object, path: str) -> tuple[int | None, int | None]:
    """22.05 and v0.0.39 squeue: the raw wait status as an integer."""
    return _wait_status(_count(value, path))


def _legacy_exit_code(value: object, path: str) -> tuple[int | None, int | None]:
    """22.05 / v0.0.39 sacct: ``{status, return_code, signal: {signal_id, name}}``.

    Slurm reports ``SUCCESS``/0 for every normal exit here, so a zero return code is
    unknown (None), never 0.
    """
    exit_code = _obj(value, path)
    status = _str(_req(exit_code, "status", path), f"{path}.status")
    return_code = exit_code.get("return_code")
    code = None if return_code is None else _count(return_code, f"{path}.return_code")
    signal = None
    signal_obj = exit_code.get("signal")
    if signal_obj is not None:
        signal_id = _obj(signal_obj, f"{path}.signal").get("signal_id")
        if signal_id is not None:
            signal = _count(signal_id, f"{path}.signal.signal_id") or None
    if status == "SIGNALED":
        return None, signal
    return (code or None), signal


def _process_exit_code(value: object, path: str) -> tuple[int | None, int | None]:
    """v0.0.40+: ``{status: [...], return_code: {set,infinite,number},
    signal: {id: {set,infinite,number}, name}}``."""
    exit_code = _obj(value, path)
    status = _req(exit_code, "status", path)
    if not isinstance(status, list) or not all(isinstance(item, str) for item in status):
        raise ProtocolError(f"{path}.status: expected a list of strings")
    code = _struct_number(_req(exit_code, "return_code", path), f"{path}.return_code")
    signal = None
    signal_obj = exit_code.get("signal")
    if signal_obj is not None:
        signal_map = _obj(signal_obj, f"{path}.signal")
        if "id" in signal_map:
            signal = _struct_number(signal_map["id"], f"{path}.signal.id") or None
    if "SIGNALED" in status or "CORE_DUMPED" in status:
        return None, signal
    return code, signal


# --------------------------------------------------------------------------------------
# Times and numbers


def _int_time(value: object, path: str) -> int | None:
    """Epoch seconds printed as an integer (0 / null / NO_VAL64 / INFINITE64 → None)."""
    if value is None:
        return None
    number = _count(value, path)
    if number == 0 or number in (_NO_VAL64, _INFINITE64):
        return None
    return number


def _struct_time(value: object, path: str) -> int | None:
    """``{set, infinite, number}`` epoch seconds; unset, infinite or 0 → None."""
    number = _struct_number(value, path)
    return number or None


def _struct_number(value: object, path: str) -> int | None:
    struct = _obj(value, path)
    is_set = _req(struct, "set", path)
    infinite = _req(struct, "infinite", path)
    if not isinstance(is_set, bool) or not isinstance(infinite, bool):
        raise ProtocolError(f"{path}: 'set' and 'infinite' must be booleans")
    number = _count(_req(struct, "number", path), f"{path}.number")
    if not is_set or infinite:
        return None
    return number


def _minutes(value: object, path: str) -> int | None:
    """A time limit in minutes (int, null or struct; NO_VAL/INFINITE → None) → seconds."""
    if value is None:
        return None
    minutes = _struct_number(value, path) if isinstance(value, dict) else _count(value, path)
    if minutes is None or minutes >= _NO_VAL:
        return None
    return minutes * 60


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _count(value: object, path: str) -> int:
    if not _is_int(value) or value < 0:
        raise ProtocolError(f"{path}: expected a non-negative integer, got {value!r:.80}")
    return value


def _job_id(value: object, path: str) -> int:
    number = _count(value, path)
    if number == 0:
        raise ProtocolError(f"{path}: job id 0")
    return number


# --------------------------------------------------------------------------------------
# Strings and objects


def _reason(text: str) -> str:
    return "" if text == NO_REASON else text


def _comment(text: str) -> str | None:
    return None if text in ("", "(null)") else text


def _obj(value: object, path: str) -> dict[str, object]:
    if not isinstance(value, dict):
        raise ProtocolError(f"{path}: expected an object, got {type(value).__name__}")
    return value


def _req(mapping: Mapping[str, object], key: str, path: str) -> object:
    if key not in mapping:
        raise ProtocolError(f"{path}: missing required field {key!r}")
    return mapping[key]


def _str(value: object, path: str) -> str:
    if not isinstance(value, str):
        raise ProtocolError(f"{path}: expected a string, got {type(value).__name__}")
    return value


def _opt_str(value: object, path: str) -> str:
    """A string that Slurm may print as null; null → ``""``."""
    return "" if value is None else _str(value, path)


def _opt_bool(value: object, path: str) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    raise ProtocolError(f"{path}: expected a boolean, got {value!r:.80}")


# --------------------------------------------------------------------------------------
# Text dialects

_EMPTY_TIMES = frozenset({"", "N/A", "NONE", "None", "Unknown", "(null)"})
_NO_LIMITS = frozenset({"", "N/A", "NONE", "UNLIMITED", "Partition_Limit", "INFINITE"})
_DURATION_RE = re.compile(
    r"(?:(?P<days>[0-9]+)-(?P<dh>[0-9]+)(?::(?P<dm>[0-9]+)(?::(?P<ds>[0-9]+))?)?)"
    r"|(?:(?P<a>[0-9]+)(?::(?P<b>[0-9]+)(?::(?P<c>[0-9]+))?)?)")
_SACCT_STATE_RE = re.compile(r"(?P<words>[A-Z_]+(?:,[A-Z_]+)*)(?: by (?P<uid>[0-9]+))?")
_STEP_ID_RE = re.compile(r"[0-9]+\.[A-Za-z0-9_+.-]+")
_EXIT_PAIR_RE = re.compile(r"(?P<code>[0-9]+):(?P<signal>[0-9]+)")

# What squeue's Reason column prints when a state description is set (it prints the
# description instead of the reason): the reason each known description goes with.
_DESCRIPTION_REASONS: Final[tuple[tuple[str, str], ...]] = (
    ("job requeued in held state", "JobHeldUser"),
    ("job requeued in special exit state", "JobHeldUser"),
    ("launch failed requeued held", "JobHeldUser"),
    ("user env retrieval failed requeued held", "JobHeldUser"),
    ("launch failure limit exceeded requeued held", "JobHoldMaxRequeue"),
)
_REASON_TOKEN_RE = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
_REASON_PREFIX_RE = re.compile(r"(?P<reason>[A-Za-z][A-Za-z0-9_]*)[:,]")


def parse_text_time(text: str, *, path: str = "time") -> int | None:
    """A CLI time: ``YYYY-MM-DDTHH:MM:SS`` read as UTC (the reader runs Slurm's commands
    with ``TZ=UTC``), or epoch seconds (``SLURM_TIME_FORMAT=%s``); N/A, Unknown, None → None."""
    if text in _EMPTY_TIMES:
        return None
    if text.isdigit():
        return int(text) or None
    if _ISO_TIME_RE.fullmatch(text) is None:
        raise ProtocolError(f"{path}: not a Slurm time: {text!r:.80}")
    try:
        fields = (int(text[0:4]), int(text[5:7]), int(text[8:10]), int(text[11:13]),
                  int(text[14:16]), int(text[17:19]))
        datetime(*fields)  # validates the calendar (no 2026-02-30)
    except ValueError:
        raise ProtocolError(f"{path}: not a Slurm time: {text!r:.80}") from None
    return calendar.timegm(fields)


_ISO_TIME_RE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}")


def parse_duration(text: str, *, path: str = "time limit") -> int | None:
    """A CLI duration in seconds: ``[D-]H:MM:SS``, ``M:SS``, ``D-H[:M]``, bare minutes;
    UNLIMITED, Partition_Limit, N/A → None."""
    if text in _NO_LIMITS:
        return None
    match = _DURATION_RE.fullmatch(text)
    if match is None:
        raise ProtocolError(f"{path}: not a Slurm duration: {text!r:.80}")
    parts = {key: int(value) for key, value in match.groupdict().items() if value is not None}
    if "days" in parts:
        return (((parts["days"] * 24 + parts["dh"]) * 60 + parts.get("dm", 0)) * 60
                + parts.get("ds", 0))
    if "c" in parts:  # H:M:S
        return (parts["a"] * 60 + parts["b"]) * 60 + parts["c"]
    if "b" in parts:  # M:S
        return parts["a"] * 60 + parts["b"]
    return parts["a"] * 60  # M


def _text_rows(text: str, columns: tuple[str, ...], *, trailing_separator: bool,
               command: str) -> list[tuple[int, dict[str, str]]]:
    """(line number, column → field) of every non-empty line. The last column absorbs
    any extra '|'; a line with too few fields is refused."""
    if not isinstance(text, str):
        raise ProtocolError(f"expected {command} text, got {type(text).__name__}")
    rows: list[tuple[int, dict[str, str]]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        body = line
        if trailing_separator:
            if not line.endswith("|"):
                raise ProtocolError(f"{command} line {number}: truncated (no final '|')")
            body = line[:-1]
        fields = body.split("|", len(columns) - 1)
        if len(fields) != len(columns):
            raise ProtocolError(f"{command} line {number}: expected {len(columns)} fields, "
                                f"got {len(fields)}: {line!r:.200}")
        rows.append((number, dict(zip(columns, fields, strict=True))))
    return rows


def _check_columns(columns: tuple[str, ...], required: frozenset[str], known: tuple[str, ...],
                   command: str) -> None:
    missing = required.difference(columns)
    unknown = set(columns).difference(known)
    if missing or unknown or len(set(columns)) != len(columns):
        raise ProtocolError(f"{command} columns {columns!r}: missing {sorted(missing)}, "
                            f"unknown {sorted(unknown)} or repeated")


def _row_time(row: Mapping[str, str], column: str, where: str) -> int | None:
    return parse_text_time(row.get(column, ""), path=f"{where} {column}")


def _text_int(text: str, path: str) -> int:
    if not text.isdigit():
        raise ProtocolError(f"{path}: expected a non-negative integer, got {text!r:.80}")
    return int(text)


def _text_job_id(text: str, path: str) -> int:
    number = _text_int(text, path)
    if number == 0:
        raise ProtocolError(f"{path}: job id 0")
    return number


def _text_bool(text: str, path: str) -> bool | None:
    lowered = text.lower()
    if lowered in ("1", "yes", "true"):
        return True
    if lowered in ("0", "no", "false"):
        return False
    if lowered in ("", "n/a", "(null)"):
        return None
    raise ProtocolError(f"{path}: expected 0 or 1, got {text!r:.80}")


def _text_reason(text: str) -> tuple[str, str]:
    """(reason, description) from squeue's Reason column, which prints the description
    instead of the reason whenever one is set."""
    if text in ("", NO_REASON):
        return "", ""
    if _REASON_TOKEN_RE.fullmatch(text):
        return text, ""
    for description, reason in _DESCRIPTION_REASONS:
        if text.startswith(description):
            return reason, text
    prefix = _REASON_PREFIX_RE.match(text)  # "RaisedSignal:9(Killed)", "ReqNodeNotAvail, ..."
    return (prefix.group("reason") if prefix else ""), text


def _text_exit_code(text: str, path: str) -> tuple[int | None, int | None]:
    """squeue's ``exit_code`` (a raw wait status) or a ``code:signal`` pair."""
    pair = _EXIT_PAIR_RE.fullmatch(text)
    if pair is not None:
        return _exit_pair(pair)
    if text in ("", "N/A"):
        return None, None
    return _wait_status(_text_int(text, path))


def _exit_pair(pair: re.Match[str]) -> tuple[int | None, int | None]:
    code, signal = int(pair.group("code")), int(pair.group("signal"))
    if signal:
        return None, signal
    return code, None


def _compact_agrees(words: list[str], compact: str) -> bool:
    """StateCompact is the code of the base state or of one of the flags printed with it
    (``CANCELLED,COMPLETING`` is ``CG``); a state word we do not know says nothing."""
    codes = [_COMPACT[word] for word in words if word in _COMPACT]
    return not codes or compact in codes


def _text_cluster(text: str) -> str:
    return "" if text in ("(null)", "N/A") else text


_SQUEUE_REQUIRED: Final = frozenset({
    "JobID", "Name", "State", "Reason", "SubmitTime", "StartTime", "RestartCnt", "NodeList",
    "Comment",
})


_SLUID_RE: Final = re.compile(r"s[0-9A-Z]{10,30}")


def _text_sluid(text: str, path: str) -> str | None:
    """A SLUID (``sE0HM8R59HN500``); None when empty/unset. Anything else is refused:
    writes address the job by it."""
    text = text.strip()
    if text in ("", "(null)", "N/A", "0"):
        return None
    if _SLUID_RE.fullmatch(text) is None:
        raise ProtocolError(f"{path}: not a SLUID: {text!r:.80}")
    return text


def parse_squeue_text(text: str, *,
                      columns: tuple[str, ...] = SQUEUE_TEXT_COLUMNS) -> list[SlurmJob]:
    """Records of ``squeue -h --states=all -O <SQUEUE_TEXT_FORMAT>`` output, in order.

    ``columns`` names the ``-O`` fields in order (default: ``SQUEUE_TEXT_COLUMNS``); a
    shorter list must still hold the ones a record cannot do without, and the fields it
    leaves out are None. Times are read as UTC (``parse_text_time``). The Reason column
    prints the state description when one is set; known descriptions give back their
    reason. StateCompact, when present, must agree with State (a shifted column fails).
    """
    _check_columns(columns, _SQUEUE_REQUIRED, SQUEUE_TEXT_COLUMNS_SLUID, "squeue")
    jobs: list[SlurmJob] = []
    for number, row in _text_rows(text, columns, trailing_separator=True, command="squeue"):
        where = f"squeue line {number}"
        state_text = row["State"]
        words = [_word(word, f"{where} State") for word in state_text.split(",")]
        base, flags = split_state_words(words)
        compact = row.get("StateCompact")
        if compact is not None and not _compact_agrees(words, compact):
            raise ProtocolError(
                f"{where}: State {state_text!r} disagrees with StateCompact {compact!r}")
        reason, description = _text_reason(row["Reason"])
        return_code, signal = _text_exit_code(row.get("exit_code", ""), f"{where} exit_code")
        jobs.append(SlurmJob(
            job_id=_text_job_id(row["JobID"], f"{where} JobID"),
            name=row["Name"],
            user=row.get("UserName") or None,
            base_state=base,
            flags=flags,
            reason=reason,
            description=description,
            comment=_comment(row["Comment"]),
            submit_time=_row_time(row, "SubmitTime", where),
            eligible_time=_row_time(row, "EligibleTime", where),
            start_time=_row_time(row, "StartTime", where),
            end_time=_row_time(row, "EndTime", where),
            preempt_time=_row_time(row, "PreemptTime", where),
            restart_count=_text_int(row["RestartCnt"], f"{where} RestartCnt"),
            nodes=expand_hostlist(row["NodeList"]),
            return_code=return_code,
            signal=signal,
            time_limit_s=parse_duration(row.get("TimeLimit", ""), path=f"{where} TimeLimit"),
            requeue=_text_bool(row.get("Requeue", ""), f"{where} Requeue"),
            cluster=_text_cluster(row.get("Cluster", "")),
            state_text=state_text,
            sluid=_text_sluid(row.get("SLUID", ""), f"{where} SLUID"),
        ))
    return jobs


_SACCT_REQUIRED: Final = frozenset({
    "JobName", "State", "Submit", "Start", "End", "ExitCode", "NodeList", "Comment",
})


def parse_sacct_text(text: str, *,
                     columns: tuple[str, ...] = SACCT_TEXT_COLUMNS) -> list[SlurmJob]:
    """Job allocation records of ``sacct -P -n -D -o <SACCT_TEXT_FIELDS>``, in order.

    ``columns`` as for ``parse_squeue_text`` (``JobID`` may stand in for ``JobIDRaw``).
    Step rows (``12.batch``, ``12.0``) are skipped. ``CANCELLED by <uid>`` fills
    ``kill_request_user``: the job's user when the uid is the job's UID, else
    ``uid=<uid>`` (which never equals a user name). ``ExitCode`` ``3:0`` is return code 3.
    """
    _check_columns(columns, _SACCT_REQUIRED, (*SACCT_TEXT_COLUMNS_SLUID, "JobID"), "sacct")
    id_column = "JobIDRaw" if "JobIDRaw" in columns else "JobID"
    if id_column not in columns:
        raise ProtocolError(f"sacct columns {columns!r}: no JobIDRaw")
    jobs: list[SlurmJob] = []
    for number, row in _text_rows(text, columns, trailing_separator=False, command="sacct"):
        where = f"sacct line {number}"
        if _STEP_ID_RE.fullmatch(row[id_column]):
            continue
        job_id = _text_job_id(row[id_column], f"{where} {id_column}")
        state = _SACCT_STATE_RE.fullmatch(row["State"])
        if state is None:
            raise ProtocolError(f"{where}: not a sacct state: {row['State']!r:.80}")
        base, flags = split_state_words(state.group("words").split(","))
        user = row.get("User") or None
        kill_request_user = None
        if state.group("uid") is not None:
            by = int(state.group("uid"))
            if "UID" in row:  # without it the requester cannot be compared: unknown
                uid = _text_int(row["UID"], f"{where} UID")
                kill_request_user = user if by == uid else f"uid={by}"
        pair = _EXIT_PAIR_RE.fullmatch(row["ExitCode"])
        if pair is None:
            raise ProtocolError(f"{where}: ExitCode is not code:signal: {row['ExitCode']!r}")
        return_code, signal = _exit_pair(pair)
        jobs.append(SlurmJob(
            job_id=job_id,
            name=row["JobName"],
            user=user,
            base_state=base,
            flags=flags,
            reason=_reason(row.get("Reason", "")),
            description="",
            comment=_comment(row["Comment"]),
            submit_time=_row_time(row, "Submit", where),
            eligible_time=_row_time(row, "Eligible", where),
            start_time=_row_time(row, "Start", where),
            end_time=_row_time(row, "End", where),
            preempt_time=None,
            restart_count=None,
            nodes=expand_hostlist(row["NodeList"]),
            return_code=return_code,
            signal=signal,
            time_limit_s=parse_duration(row.get("Timelimit", ""), path=f"{where} Timelimit"),
            requeue=None,
            cluster=_text_cluster(row.get("Cluster", "")),
            kill_request_user=kill_request_user,
            requester_recorded="UID" in row,
            state_text=row["State"],
            sluid=_text_sluid(row.get("SLUID", ""), f"{where} SLUID"),
        ))
    return jobs
