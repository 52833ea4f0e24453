"""The Slurm output the adapter reads, normalised into one ``SlurmJob`` record.

Pure: text in, records out. The reader is text on every supported version (22.05, 24.11,
26.05; the adapter's module docstring says why not JSON), in two forms (SPEC §4.4):

* squeue text: ``squeue -h --states=all -O <SQUEUE_TEXT_FORMAT>`` (or
  ``SQUEUE_TEXT_FORMAT_SLUID``, where Preflight found the SLUID column);
* sacct text: ``sacct -P -n -D -o <SACCT_TEXT_FIELDS>`` (step rows are skipped).

Anything malformed (a truncated or shifted row, a missing field, a number that is none,
an unknown node-list form, an impossible time) raises ProtocolError and yields no record at
all. Unknown state *names* are not an error here: they are kept raw and ``classify``
reports them as unknown.

Normalisation rules worth knowing (the rest is in the helpers' docstrings):

* times are read as UTC; ``N/A``, ``Unknown``, ``None`` and ``0`` become None;
* Slurm's reason ``None`` (WAIT_NO_REASON) becomes ``""``; comments ``""``/``(null)`` None;
* a state may print a *flag* in place of the base state when one is set (squeue's
  ``COMPLETING`` for any ending or requeueing job, sacct's ``REQUEUED`` for a requeued
  record); such a record has ``base_state == ""`` (not reported) and the flag in
  ``flags``. A state of several comma-separated words (``CANCELLED,COMPLETING``) is base
  then flags;
* exit codes become ``return_code`` (normal exit) or ``signal`` (killed): squeue's
  ``exit_code`` is the raw wait status (768 = exit 3, 15 = SIGTERM), sacct's ``ExitCode``
  is ``code:signal``. Both print the true return code (22.05's sacct JSON, never read,
  reports 0 for every normal exit).
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Final

from controller.errors import ProtocolError
from controller.slurm.hostlist import expand_hostlist
from controller.slurm.record import SlurmJob

# --------------------------------------------------------------------------------------
# Slurm's state vocabulary (slurm.h: the job states and state flags its clients print)

BASE_STATES: Final = frozenset({
    "PENDING", "RUNNING", "SUSPENDED", "COMPLETED", "CANCELLED", "FAILED", "TIMEOUT",
    "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY",
})

# The state flags (data_parser v0.0.44's list, plus UPDATE_DB of older releases): a first
# state word that is one of them stands in for the base state.
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


def squeue_format(columns: tuple[str, ...]) -> str:
    """The argument of ``squeue -h --states=all -O`` for these columns: width 0 (":")
    prints each field whole, and "|" is its suffix, so every row ends with "|"."""
    return ",".join(f"{column}:|" for column in columns)


SQUEUE_TEXT_FORMAT: Final = squeue_format(SQUEUE_TEXT_COLUMNS)
# With Slurm's unique job id, where squeue has it (25.11+; 24.11 and 22.05 refuse the
# field -- squeue prints an error and NO rows but exits 0 -- so ask only after Preflight
# found it). Still Comment last.
SQUEUE_TEXT_COLUMNS_SLUID: Final = (*SQUEUE_TEXT_COLUMNS[:-1], "SLUID", "Comment")
SQUEUE_TEXT_FORMAT_SLUID: Final = squeue_format(SQUEUE_TEXT_COLUMNS_SLUID)

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
# States


def split_state_words(words: list[str]) -> tuple[str, tuple[str, ...]]:
    """(base, flags) of state words. A first word that is a flag means the base state
    was not reported (``""``); any other unknown first word is kept raw as the base."""
    first, rest = words[0], tuple(words[1:])
    if first in KNOWN_FLAGS:
        return "", (first, *rest)
    return first, rest


def _word(value: str, path: str) -> str:
    if not value or value != value.strip():
        raise ProtocolError(f"{path}: expected a state name, got {value!r:.80}")
    return value


# --------------------------------------------------------------------------------------
# Exit codes

_NO_VAL = 0xFFFFFFFE  # NO_VAL (uint32): "not set"


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


# --------------------------------------------------------------------------------------
# Strings


def _reason(text: str) -> str:
    return "" if text == NO_REASON else text


def _comment(text: str) -> str | None:
    return None if text in ("", "(null)") else text


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


def utc_text(epoch: int | float) -> str:
    """``YYYY-MM-DDTHH:MM:SS`` in UTC: the form Slurm's clients parse under ``TZ=UTC``
    (the runners run every command with it), the inverse of ``parse_text_time``."""
    return datetime.fromtimestamp(int(epoch), UTC).strftime("%Y-%m-%dT%H:%M:%S")


def parse_text_time(text: str, *, path: str = "time") -> int | None:
    """A CLI time: ``YYYY-MM-DDTHH:MM:SS`` read as UTC (the reader runs Slurm's commands
    with ``TZ=UTC``), or epoch seconds (``SLURM_TIME_FORMAT=%s``); N/A, Unknown, None → None."""
    if text in _EMPTY_TIMES:
        return None
    if text.isascii() and text.isdigit():  # ("²".isdigit(): int() refuses it)
        return int(text) or None
    epoch = None if _ISO_TIME_RE.fullmatch(text) is None else _utc_epoch(text)
    if epoch is None:
        raise ProtocolError(f"{path}: not a Slurm time: {text!r:.80}")
    return epoch


_MONTH_DAYS: Final = (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def _utc_epoch(text: str) -> int | None:
    """Epoch seconds of ``YYYY-MM-DDTHH:MM:SS`` (digits checked) read as UTC
    (``calendar.timegm``), None for a time ``datetime`` refuses (month 13, 2026-02-30,
    24:00:00, year 0): plain arithmetic, as many times as a 100k-job queue prints."""
    year, month, day = int(text[0:4]), int(text[5:7]), int(text[8:10])
    hour, minute, second = int(text[11:13]), int(text[14:16]), int(text[17:19])
    if not (1 <= month <= 12 and day >= 1 and hour < 24 and minute < 60 and second < 60
            and year >= 1):
        return None
    leap = year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
    if day > _MONTH_DAYS[month - 1] + (month == 2 and leap):
        return None
    # days since 1970-01-01 of the proleptic Gregorian calendar, years counted from March
    y = year - (month <= 2)
    era, year_of_era = divmod(y, 400)
    day_of_year = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    day_of_era = (year_of_era * 365 + year_of_era // 4 - year_of_era // 100
                  + day_of_year)
    return (era * 146097 + day_of_era - 719468) * 86400 + hour * 3600 + minute * 60 + second


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
    if not (text.isascii() and text.isdigit()):  # ("²".isdigit(), and int() refuses it)
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
    if not isinstance(text, str):
        raise ProtocolError(f"expected squeue text, got {type(text).__name__}")
    parser = SqueueLines(columns)
    line = parser.line
    return [line(body, number) for number, body in enumerate(text.splitlines(), start=1)
            if body.strip()]


class SqueueLines:
    """The parser of one read's squeue lines (``parse_squeue_text``, one line at a time).

    A queue of 100k jobs prints a few distinct values in most columns (states, times to
    the second, node lists, limits, comments): each distinct field text is decoded and
    checked once per parser and its value reused for every other line that prints it.
    A field that fails is never remembered, so every bad line raises with its own line
    number, as before. Make one per read: what it remembers is that read's values."""

    def __init__(self, columns: tuple[str, ...] = SQUEUE_TEXT_COLUMNS) -> None:
        _check_columns(columns, _SQUEUE_REQUIRED, SQUEUE_TEXT_COLUMNS_SLUID, "squeue")
        self.columns = columns
        self._width = len(columns)
        # a column the read did not ask for reads as "" (an extra field after the last)
        at = {column: index for index, column in enumerate(columns)}
        self._at = {column: at.get(column, len(columns)) for column in _SQUEUE_FIELDS}
        self._at["State\0"] = len(columns) + 1  # the State|StateCompact key, after ""
        self._compact = "StateCompact" in at
        # (field index, that column's decoded values by text, decoder, column) of the
        # memoized fields, in ``_MEMOIZED`` order
        # (the time columns share one: a job's submit and eligible times are often alike)
        times: dict[str, Any] = {}
        self._plan: list[tuple[int, dict[str, Any], Callable[[str, str], Any], str]] = [
            (self._at[column], times if decode is _time_field else {}, decode, column)
            for column, decode in _MEMOIZED]
        # the texts of all memoized fields of a line at once: lines that print the same
        # ones (a queue's jobs mostly differ in id, name and node list) are decoded with
        # one lookup; at most ``_LINE_KINDS`` such keys are kept (each holds its texts)
        self._key = operator.itemgetter(*(index for index, _, _, _ in self._plan))
        self._kinds: dict[tuple[str, ...], list[Any]] = {}
        # The fast path (``line``), for columns that start JobID, Name and hold NodeList
        # after UserName (every read of ours): a line with exactly one '|' per column is
        # cut into its id, its name, the texts between the name and NodeList (one
        # string), NodeList and the columns after it. All but the id, name, node list
        # and SLUID are the key of the record's other values, taken from the first line
        # with that key, which went the whole way (``_whole``); the node lists are
        # decoded once each (NodeList's memo of ``_plan``).
        nodes_at = at.get("NodeList", -1)
        self._fast = columns[:2] == ("JobID", "Name") and nodes_at >= 3
        after = len(columns) - nodes_at - 1  # columns after NodeList
        self._cuts = after + 2  # rest.rsplit("|", cuts): [head, nodes, *after, ""]
        sluid_at = at.get("SLUID", -1)
        self._sluid_part = 2 + sluid_at - nodes_at - 1 if sluid_at > nodes_at else -1
        self._fast_key = operator.itemgetter(0, *(
            2 + j for j in range(after) if 2 + j != self._sluid_part))
        self._fast &= sluid_at < 0 or sluid_at > nodes_at  # (a SLUID before: no use)
        memo = {column: known for _, known, _, column in self._plan}
        self._nodes: dict[str, Any] = memo["NodeList"]
        self._records: dict[Any, SlurmJob] = {}  # its other values: any line's record
        # ... and when that key is new (a real queue's jobs print times of their own): the
        # line split whole, the texts of every column but the id, name, node list, SLUID
        # and times key the record's other values, and each time text is decoded once
        # (its column's memo of ``_plan``)
        own = {"JobID", "Name", "NodeList", "SLUID", *_TIME_COLUMNS}
        self._timeless_key = operator.itemgetter(*(
            index for index, column in enumerate(columns) if column not in own))
        self._times = tuple((at.get(column, len(columns)), memo[column], column)
                            for column in _TIME_COLUMNS)
        self._timeless: dict[Any, SlurmJob] = {}

    def line(self, line: str, number: int) -> SlurmJob:
        """The record of one line (with or without its newline)."""
        body = line.rstrip("\n")
        if not (self._fast and body[-1:] == "|" and body.count("|") == self._width):
            return self._whole(body, number)
        jid, name, rest = body.split("|", 2)
        parts = rest.rsplit("|", self._cuts)
        key = self._fast_key(parts)
        t = self._records.get(key)
        if t is not None:
            sluid_text = "" if self._sluid_part < 0 else parts[self._sluid_part]
            return self._like(t, (t.submit_time, t.eligible_time, t.start_time, t.end_time,
                                  t.preempt_time), jid=jid, name=name, nodes_text=parts[1],
                              sluid_text=sluid_text, number=number)
        fields = body[:-1].split("|")
        fields.append("")  # (a column the read did not ask for reads as "")
        timeless = self._timeless_key(fields)
        t = self._timeless.get(timeless)
        if t is None:
            job = self._whole(body, number)
            if len(self._timeless) < _LINE_KINDS:
                self._timeless[timeless] = job
        else:
            times = []
            for index, known, column in self._times:
                text = fields[index]
                value = known.get(text, _MISS)
                if value is _MISS:
                    value = known[text] = _time_field(text, f"squeue line {number} {column}")
                times.append(value)
            at = self._at
            job = self._like(t, times, jid=jid, name=name, nodes_text=fields[at["NodeList"]],
                             sluid_text=fields[at["SLUID"]], number=number)
        if len(self._records) < _LINE_KINDS:
            self._records[key] = job
        return job

    def _like(self, t: SlurmJob, times: Sequence[int | None], *, jid: str, name: str,
              nodes_text: str, sluid_text: str, number: int) -> SlurmJob:
        """The record of a line that prints what ``t``'s line printed but for its own id,
        name, node list, SLUID and ``times`` (submit, eligible, start, end, preempt):
        those checked in ``_whole``'s order, so a line with several bad fields fails on
        the same one."""
        nodes = self._nodes.get(nodes_text)
        if nodes is None:
            nodes = self._nodes[nodes_text] = _nodes_field(
                nodes_text, f"squeue line {number} NodeList")
        job_id = int(jid) if jid.isascii() and jid.isdigit() else 0
        if not job_id:
            _text_job_id(jid, f"squeue line {number} JobID")
        sluid = _text_sluid(sluid_text, f"squeue line {number} SLUID") if sluid_text else None
        submit, eligible, start, end, preempt = times
        return SlurmJob(job_id, name, t.user, t.base_state, t.flags, t.reason, t.description,
                        t.comment, submit, eligible, start, end, preempt, t.restart_count,
                        nodes, t.return_code, t.signal, t.time_limit_s, t.requeue, t.cluster,
                        t.kill_request_user, t.requester_recorded, t.state_text, sluid)

    def _whole(self, body: str, number: int) -> SlurmJob:
        """The record of one line without its newline, every field checked."""
        if not body.endswith("|"):
            raise ProtocolError(f"squeue line {number}: truncated (no final '|')")
        fields = body[:-1].split("|", self._width - 1)
        if len(fields) != self._width:
            raise ProtocolError(f"squeue line {number}: expected {self._width} fields, "
                                f"got {len(fields)}: {body!r:.200}")
        at = self._at
        fields.append("")
        state_text = fields[at["State"]]
        fields.append(f"{state_text}\0{fields[at['StateCompact']]}" if self._compact
                      else f"{state_text}\0{_NO_COMPACT}")  # the key of ``_state_field``
        key = self._key(fields)
        values = self._kinds.get(key)
        if values is None:
            values = []
            for index, known, decode, column in self._plan:
                text = fields[index]
                value = known.get(text, _MISS)
                if value is _MISS:
                    value = known[text] = decode(text, f"squeue line {number} {column}")
                values.append(value)
            if len(self._kinds) < _LINE_KINDS:
                self._kinds[key] = values
        ((base, flags), (return_code, signal), (reason, description), comment, submit,
         eligible, start, end, preempt, restarts, nodes, time_limit, requeue,
         cluster) = values
        return SlurmJob(
            job_id=_text_job_id(fields[at["JobID"]], f"squeue line {number} JobID"),
            name=fields[at["Name"]],
            user=fields[at["UserName"]] or None,
            base_state=base,
            flags=flags,
            reason=reason,
            description=description,
            comment=comment,
            submit_time=submit,
            eligible_time=eligible,
            start_time=start,
            end_time=end,
            preempt_time=preempt,
            restart_count=restarts,
            nodes=nodes,
            return_code=return_code,
            signal=signal,
            time_limit_s=time_limit,
            requeue=requeue,
            cluster=cluster,
            state_text=state_text,
            sluid=_text_sluid(fields[at["SLUID"]], f"squeue line {number} SLUID"),
        )


_NO_COMPACT: Final = "\1"  # a read without the StateCompact column (``_state_field``)


def _state_field(text: str, path: str) -> tuple[str, tuple[str, ...]]:
    """(base, flags) of ``State<NUL>StateCompact`` (``_NO_COMPACT`` for a read without the
    compact column); the two must agree."""
    state_text, _, compact = text.rpartition("\0")
    where = path.rsplit(" ", 1)[0]
    words = [_word(word, f"{where} State") for word in state_text.split(",")]
    if compact != _NO_COMPACT and not _compact_agrees(words, compact):
        raise ProtocolError(
            f"{where}: State {state_text!r} disagrees with StateCompact {compact!r}")
    return split_state_words(words)


def _exit_field(text: str, path: str) -> tuple[int | None, int | None]:
    return _text_exit_code(text, path)


def _reason_field(text: str, path: str) -> tuple[str, str]:
    return _text_reason(text)


def _comment_field(text: str, path: str) -> str | None:
    return _comment(text)


def _time_field(text: str, path: str) -> int | None:
    return parse_text_time(text, path=path)


def _duration_field(text: str, path: str) -> int | None:
    return parse_duration(text, path=path)


def _nodes_field(text: str, path: str) -> tuple[str, ...]:
    try:
        return expand_hostlist(text)
    except ProtocolError as exc:
        raise ProtocolError(f"{path}: {exc}") from exc


def _cluster_field(text: str, path: str) -> str:
    return _text_cluster(text)


_MISS: Final = object()
_TIME_COLUMNS: Final = ("SubmitTime", "EligibleTime", "StartTime", "EndTime", "PreemptTime")
_LINE_KINDS: Final = 4096  # distinct memoized-field combinations a parser keeps
# every column a record reads; "" where the read did not ask for it (``SqueueLines``)
_SQUEUE_FIELDS: Final = (*SQUEUE_TEXT_COLUMNS_SLUID, "State\0")
# the fields ``SqueueLines`` decodes once per distinct text, in the order it unpacks them
_MEMOIZED: Final[tuple[tuple[str, Callable[[str, str], Any]], ...]] = (
    ("State\0", _state_field), ("exit_code", _exit_field), ("Reason", _reason_field),
    ("Comment", _comment_field), ("SubmitTime", _time_field),
    ("EligibleTime", _time_field), ("StartTime", _time_field), ("EndTime", _time_field),
    ("PreemptTime", _time_field), ("RestartCnt", _text_int), ("NodeList", _nodes_field),
    ("TimeLimit", _duration_field), ("Requeue", _text_bool), ("Cluster", _cluster_field),
)


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
            nodes=_nodes_field(row["NodeList"], f"{where} NodeList"),
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
