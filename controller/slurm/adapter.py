"""The Slurm adapter: SPEC §2-§5 against a real cluster, every command through a ``Runner``.

``SlurmAdapter`` implements ``controller.reconcile.ports.SlurmPort`` and the rest of the
operations a client of one Slurm cluster needs (Inspect, Requeue, Output, Preflight). It
owns three things nothing else may do:

* **which Slurm command answers which question** (one argv list each; quoting happens
  only in the sh scripts of Start, Output and missing_paths);
* **the identity check** before every write (SPEC §2): the job with the ref's id is read
  from slurmctld *now* -- a single-id ``squeue -j <id>`` (slurmctld's cheap
  ``slurm_load_job`` path), or, for the checks of concurrent writes joined into one
  command (``coalesce``), ``squeue --me -j <id>,<id>,...`` (one RPC for our user's jobs)
  -- and the write goes ahead only when the id, the exact name and
  the submit time (equal, or later when the restart count is above zero) agree, the job
  belongs to our user and its comment is ours. Anything else acts on nothing. Where the
  cluster's writes take a SLUID (26.05: Preflight's ``identity == "sluid"``) the write
  then names the job by it (``_write``), not by the reusable numeric id, and a ref that
  recorded a SLUID must match it: a stale ref can touch no other job even if the check
  above were wrong. 24.11 records the SLUID in sacct only (read, never written by);
  22.05 has none;
* **error mapping**: Slurm's messages become ``controller.errors`` here, once, in
  ``slurm_failure``; no other module matches Slurm's text.

Writes of many jobs
-------------------
Releases and cancels issued together (a burst's gates opening, a sweep) share one
command per kind after their joined identity read: ``scontrol release <t>,<t>,...`` and
``scancel --user=<us> <id> <id> ...`` (or ``scancel <sluid> ...``). Only targets that
passed their own check are named; when the joined command fails, which job made it fail
is not read from the text: each job is checked again and written alone. Holds (a begin
time per job) and requeues stay one command each.

Reading the queue
-----------------
Find and FindMany make **one** command for any number of jobs::

    squeue -h --me --states=all -O <dialects.SQUEUE_TEXT_FORMAT>

and keep, byte for byte, the rows named ``dj-<ULID>`` that were asked for and belong to
our user. The text form is the reader on every supported version (22.05 .. 26.05):

* ``--me`` is applied by slurmctld in the text form on every version (squeue sends the
  one-user RPC), so the answer holds only our jobs. 22.05's ``--json`` ignores every
  filter and dumps every job of every user -- on a busy cluster that is the most
  expensive call there is, and the only correct use of it would be client-side
  filtering of everybody's jobs;
* from 24.05.1 ``squeue --json`` honours the filters too, but it serialises every field
  of every job through the data_parser (kilobytes per job, against ~250 bytes of text
  for the 18 columns we read), and its shape changes with each data_parser version.
  slurmctld's work is the same either way (the same RPC), so text is the cheaper read
  for the same answer, and one code path is exercised by the real-cluster tests on
  every version;
* the text form cannot print a '|' in a name safely, so only rows that start
  ``<id>|dj-<ULID>|`` are parsed at all: no other job of the user, whatever its name,
  can break or shift a read of ours.

So there is no JSON reader and no per-version choice of one: ``dialects`` parses the two
text forms, and Preflight records what differs between versions that the text reader
uses (the SLUID columns, ``Capabilities.identity``).

Accounting
----------
Once a job has left slurmctld's memory (``MinJobAge``), Inspect and InspectMany read
``sacct -X -D -P -n -o <dialects.SACCT_TEXT_FIELDS> -j <ids> -S <since>`` (text, because
22.05's sacct JSON reports exit code 0 for every normal exit). ``-D`` returns every
record of a reused id; the record of *this* object is chosen by ``pick_record``: the
chain of records that starts at the ref's exact submit time with the ref's name, and
continues only through records that Slurm requeued (REQUEUED, NODE_FAIL, PREEMPTED) and
whose comment names the same submission. The newest record of that chain is the
object's state. A record of a job that reused the id (even one of the same dispatch
job) is never taken for it: Inspect also cuts the chain at the submit time of the live
job that holds the id now, and where neither that nor the comments can tell (a newer
record still pending or running, so without its comment) sacct's row is refused by
``classify`` rather than reported.

Start
-----
Each Start script (``script.render_start_script``, unchanged) runs as a shell function
in its own subshell, and the same runner call reads the new job back; Starts issued
together share one call (``batch_script``): one round trip, one process spawn, one
read-back squeue for many submissions, each keeping its own exit status and messages.
An outcome that is not known (the call failed, timed out, the shell died before the
script reported) is resolved by rediscovery by name and submission, never by
submitting again.

Output
------
Output lists a submission's execution files and reads new bytes by offset on the Slurm
host (``tail -c +N | head -c M | base64``), so binary output survives any transport.

Times
-----
Slurm's clients print and parse times in the local time zone; the runners run every
command with ``TZ=UTC`` and this module formats every time it sends as UTC
``YYYY-MM-DDTHH:MM:SS``. A hold is read back after it is set, to confirm the exact second.
"""

from __future__ import annotations

import asyncio
import base64
import enum
import logging
import posixpath
import re
import shlex
import statistics
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Final, Literal

from controller.errors import (
    CommandFailed,
    DispatchError,
    ErrBackPressure,
    ErrConflict,
    ErrInvalid,
    ErrNotFound,
    ErrUnsupported,
    ProtocolError,
    TransientError,
)
from controller.model.obs import ObjectObs, ObjectRef, Source, StartRequest, State
from controller.reconcile.ports import ClusterStats
from controller.runner.base import DEFAULT_COMMAND_TIMEOUT_S, CommandResult, Runner
from controller.slurm import dialects, holds, naming, script
from controller.slurm.classify import DEFAULT_SLURM_UIDS, classify, valid_until
from controller.slurm.coalesce import Coalescer
from controller.slurm.record import SlurmJob

log = logging.getLogger(__name__)

Sleep = Callable[[float], Awaitable[None]]
Stream = Literal["stdout", "stderr"]

SUPPORTED_MIN: Final = (22, 5)
SUPPORTED_MAX: Final = (26, 5)
SACCT_ARG_LIMIT: Final = 100_000  # bytes of the ``-j`` list per sacct call
MISSING_PATHS_SCRIPT_LIMIT: Final = 60_000  # bytes of one missing_paths script
OUTPUT_CHUNK: Final = 4 * 1024 * 1024  # bytes of one file read per output poll
REDISCOVERY_WINDOW_S: Final = 900  # sacct -S before the Start began
RECENT_START_WINDOW_S: Final = 3600  # cluster_stats: "started recently"
# Bytes of Start scripts in one shared shell call (``batch_script``). The 90 KiB limit
# (script.MAX_SCRIPT_BYTES) is per script; a batch is cut into calls of at most this many
# bytes (a single script always goes, alone if need be). The script reaches ``sh -s`` on
# stdin, never argv, so ARG_MAX (~2 MiB) does not apply; 1 MiB stays under asyncssh's
# default 2 MiB channel window, so a call is written without waiting for window updates,
# and bounds what one lost connection leaves unknown.
START_BATCH_BYTES: Final = 1024 * 1024

# Jobs named in one joined identity read (``squeue -j``) or joined write (``scontrol
# release``, ``scancel``): at most ~8 KiB of ids on a command line.
JOINED_LIMIT: Final = 512

# A joined write: (operation, target, the job's dispatch name).
_WriteKey = tuple[str, str, str]


class _Alone(Exception):
    """A joined write failed: the job is checked again and written alone."""


# A row of ours in squeue/sacct text: the id, then a discovery-shaped name, then '|'.
_OUR_ROW = re.compile(r"([0-9]+)\|(dj-[0-9A-Z]{26})\|")
_PARSABLE = re.compile(r"([0-9]+)(?:;(\S+))?")
_VERSION = re.compile(r"(?:slurm(?:-wlm)?\s+)?([0-9]+)\.([0-9]+)(?:\.([0-9]+))?")
_SLUID = re.compile(r"s[0-9A-Z]{10,30}")  # as dialects reads it

# find_many's memory of one squeue row: (its job id, its observation or None for another
# user's job, the second it was classified, the second from which it may no longer hold).
_RowMemo = tuple[str, ObjectObs | None, int, int]
_FOREVER: Final = 2**63

# Where an ended record of accounting continues as the same Slurm job (a requeue).
_REQUEUE_RECORD_STATES: Final = frozenset({"REQUEUED", "NODE_FAIL", "PREEMPTED"})
_NOT_STARTED: Final = frozenset({State.GATED, State.HELD, State.PENDING})
_WAITING_FOR_RESOURCES: Final = frozenset({
    "", "None", "Priority", "Resources", "ReqNodeNotAvail", "Reservation", "Licenses", "NodeDown",
    "PartitionDown", "PartitionInactive", "Constraints", "JobArrayTaskLimit",
})


# --------------------------------------------------------------------------------------
# Capabilities and versions


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What Preflight found on one cluster (SPEC §4.4; slurm-reference §4.8).

    Every version is read through the same text forms (module docstring): nothing here
    chooses a reader. ``accounting_history`` is true when sacct answered; ``job_comment``
    when ``AccountingStoreFlags`` keeps the comment, so a finished job's submission and
    attempt are known. ``None`` means the cluster did not say.
    """

    slurm_version: str
    accounting_history: bool = False
    job_comment: bool = False
    min_job_age: int | None = None
    max_job_id: int | None = None
    first_job_id: int | None = None
    job_requeue: bool | None = None
    max_batch_requeue: int | None = None
    whoami: bool = False
    output_dir_writable: bool = False
    cluster_name: str | None = None
    warnings: tuple[str, ...] = ()
    slurm_user_uid: int | None = None  # SlurmUser's uid: its cancels are Slurm's own
    missing_commands: tuple[str, ...] = ()  # Slurm commands the host does not have
    # How a job is told apart from a later one with the same id (IDENTITY_*): "sluid"
    # (26.05+: squeue prints the SLUID and scancel/scontrol take it: every write names
    # the job by it), "sluid-accounting" (24.11: sacct records it, 25.11: squeue too; read
    # and recorded, never written by), "id+name+submit" (22.05: SPEC §2's check only).
    identity: str = "id+name+submit"
    squeue_sluid: bool = False  # ``squeue -O SLUID`` accepted (probed)
    sacct_sluid: bool = False  # ``sacct -o SLUID`` accepted (probed)

    @property
    def version(self) -> tuple[int, int, int]:
        return parse_slurm_version(self.slurm_version)


IDENTITY_SLUID: Final = "sluid"
IDENTITY_SLUID_ACCOUNTING: Final = "sluid-accounting"
IDENTITY_CLASSIC: Final = "id+name+submit"
# scancel and scontrol take a SLUID from 26.05 (Slurm's changelog; tried on 26.05.5).
SLUID_WRITES_SINCE: Final = (26, 5)


def identity_for(version: tuple[int, int, int], *, squeue_sluid: bool,
                 sacct_sluid: bool) -> str:
    """The identity a cluster supports, from what Preflight probed (module docstring)."""
    if squeue_sluid and version[:2] >= SLUID_WRITES_SINCE:
        return IDENTITY_SLUID
    if squeue_sluid or sacct_sluid:
        return IDENTITY_SLUID_ACCOUNTING
    return IDENTITY_CLASSIC


# The commands the daemon runs on the Slurm host (sinfo and scontrol are checked by running
# them in preflight itself).
REQUIRED_COMMANDS: Final = ("sbatch", "squeue", "scancel", "scontrol", "sinfo")


def preflight_problems(caps: Capabilities) -> list[str]:
    """What the daemon needs and the cluster lacks, from Preflight's findings; empty when
    it can run. Pure: the daemon calls it at start and on gaining leadership, and
    ``dispatchctl preflight`` exits non-zero when it is not empty.

    Needed: a supported Slurm version; every command of ``REQUIRED_COMMANDS``; ``squeue
    --me`` (every read of the queue uses it); a writable ``output.dir`` (every Start writes
    its manifest there). Not needed (warnings only): accounting (jobs that leave squeue end
    unknown after a grace window instead of with their outcome), ``job_comment``, a
    cluster name that differs from the configured one.
    """
    problems: list[str] = []
    try:
        version = caps.version
    except ProtocolError:
        problems.append(f"unreadable Slurm version {caps.slurm_version!r}")
    else:
        if not SUPPORTED_MIN <= version[:2] <= SUPPORTED_MAX:
            problems.append(f"Slurm {caps.slurm_version} is outside the supported "
                            "22.05 .. 26.05")
    if caps.missing_commands:
        problems.append("missing on the Slurm host: " + ", ".join(caps.missing_commands))
    if not caps.whoami:
        problems.append("squeue --me does not work: the daemon cannot read its jobs")
    if not caps.output_dir_writable:
        problems.append("output.dir is not writable on the Slurm host: Start cannot write "
                        "its manifest")
    return problems


def parse_slurm_version(text: str) -> tuple[int, int, int]:
    """``(22, 5, 8)`` from ``22.05.8``, ``slurm 25.11.0`` or ``slurm-wlm 22.05.8``."""
    match = _VERSION.search(text.strip())
    if match is None:
        raise ProtocolError(f"not a Slurm version: {text.strip()!r:.80}")
    return int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)


# --------------------------------------------------------------------------------------
# Error mapping: the one place that reads Slurm's messages


class _Kind(enum.Enum):
    BACK_PRESSURE = "back-pressure"
    RATE_LIMITED = "rate-limited"
    TRANSIENT = "transient"
    NOT_FOUND = "not-found"
    CONFLICT = "conflict"
    UNSUPPORTED = "unsupported"
    INVALID = "invalid"


# First match wins; transient first, because "Batch job submission failed: Unable to
# contact slurm controller" is about reaching Slurm, not about the request. Submit limits
# (a count of jobs that frees itself as jobs leave) are back-pressure: sbatch prints the
# limit's reason on a line of its own, then the generic policy message (recorded on
# 22.05.8 with AccountingStorageEnforce=limits: AssocMaxSubmitJobLimit,
# QOSMaxSubmitJobPerUserLimit, AssocGrpSubmitJobsLimit). A per-job size or time limit
# (``...PerJob...``, ``...WallDuration...``) never frees itself: invalid. The generic
# message alone says "job submit limit" first and is taken as back-pressure: a wrong guess
# there keeps the intent backing off (visible) instead of failing a job that would run.
_FAILURES: Final[tuple[tuple[re.Pattern[str], _Kind], ...]] = tuple(
    (re.compile(pattern), kind) for pattern, kind in (
        (r"Unable to contact slurm controller", _Kind.TRANSIENT),
        (r"\b(?:Assoc|QOS)\w*SubmitJobs?\w*Limit\b", _Kind.BACK_PRESSURE),
        (r"\b(?:Assoc|QOS)\w*(?:PerJob|PerNode|WallDuration|Min\w+)\w*Limit\b", _Kind.INVALID),
        (r"Job violates accounting/QOS policy \(job submit limit", _Kind.BACK_PRESSURE),
        (r"Slurm job queue full", _Kind.BACK_PRESSURE),
        (r"Socket timed out", _Kind.TRANSIENT),
        (r"backup controller in standby mode", _Kind.TRANSIENT),
        (r"Unable to create job record, try again", _Kind.TRANSIENT),
        (r"temporarily unable to accept job", _Kind.TRANSIENT),
        (r"can not be altered now, try again later", _Kind.TRANSIENT),
        (r"Job creation temporarily disabled", _Kind.TRANSIENT),
        (r"Resource temporarily unavailable", _Kind.TRANSIENT),
        (r"Zero Bytes were transmitted or received", _Kind.TRANSIENT),
        (r"Communication connection failure", _Kind.TRANSIENT),
        (r"Problem talking to the database", _Kind.TRANSIENT),
        (r"Connection refused", _Kind.TRANSIENT),
        (r"Transport endpoint is not connected", _Kind.TRANSIENT),
        (r"Unexpected message received", _Kind.TRANSIENT),  # scontrol, slurmctld down
        (r"Invalid job id specified", _Kind.NOT_FOUND),
        (r"Job is no longer pending execution", _Kind.CONFLICT),
        (r"Job is pending execution", _Kind.CONFLICT),
        (r"Job/step already completing or completed", _Kind.CONFLICT),
        (r"Requested operation is presently disabled", _Kind.UNSUPPORTED),
        (r"Requested operation not supported on this system", _Kind.UNSUPPORTED),
        (r"Only batch jobs are accepted or processed", _Kind.UNSUPPORTED),
        (r"accounting storage is disabled", _Kind.UNSUPPORTED),
        (r"Batch job submission failed: (Invalid|Requested|Node count|CPU count|Memory"
         r"|Time limit|Pathname|Job violates|More processors)", _Kind.INVALID),
        (r"breached requested QOS usage threshold", _Kind.INVALID),
        (r"sbatch: error: ([Ii]nvalid|Memory specification can not be satisfied"
         r"|Unable to allocate)", _Kind.INVALID),
    )
)


def slurm_failure(result: CommandResult, *, operation: str) -> DispatchError:
    """The error a failed Slurm command means (slurm-reference §4.7), for ``raise``.

    Unreachable slurmctld or slurmdbd, and a missing command on the host, are transient;
    an unrecognised failure is ``CommandFailed`` carrying the command's stderr.
    """
    text = (result.stderr + "\n" + result.stdout).strip()
    detail = " ".join(text.split())[:500] or f"exit status {result.returncode}"
    message = f"{operation}: {detail}"
    if result.returncode in (126, 127):
        return TransientError(f"{operation}: command not usable on the Slurm host: {detail}",
                              retry_after=60.0)
    for pattern, kind in _FAILURES:
        if pattern.search(text):
            match kind:
                case _Kind.BACK_PRESSURE:
                    return ErrBackPressure(message)
                case _Kind.TRANSIENT:
                    return TransientError(message)
                case _Kind.NOT_FOUND:
                    return ErrNotFound(message)
                case _Kind.CONFLICT:
                    return ErrConflict(message)
                case _Kind.UNSUPPORTED:
                    return ErrUnsupported(message)
                case _Kind.INVALID:
                    return ErrInvalid(message)
    return CommandFailed(message, argv=result.argv, returncode=result.returncode,
                         stderr=result.stderr)


# --------------------------------------------------------------------------------------
# Pure helpers


def utc_text(epoch: int | float) -> str:
    """``YYYY-MM-DDTHH:MM:SS`` in UTC: the form Slurm's clients parse under ``TZ=UTC``."""
    return datetime.fromtimestamp(int(epoch), UTC).strftime("%Y-%m-%dT%H:%M:%S")


def parse_parsable(stdout: str) -> int | None:
    """The job id of ``sbatch --parsable`` output (``<id>[;<cluster>]``), or None."""
    lines = [line.strip() for line in stdout.splitlines() if line.strip()]
    if not lines:
        return None
    match = _PARSABLE.fullmatch(lines[-1])
    return int(match.group(1)) if match else None


def our_rows(text: str, *, names: Collection[str] | None = None) -> list[str]:
    """The lines of squeue/sacct text that start ``<id>|dj-<ULID>|`` (and, when ``names``
    is given, carry one of those names); every other line is not ours and is skipped."""
    rows: list[str] = []
    for line in text.splitlines():
        match = _OUR_ROW.match(line)
        if match is None or naming.job_id_of_name(match.group(2)) is None:
            continue
        if names is not None and match.group(2) not in names:
            continue
        rows.append(line)
    return rows


def pick_record(ref: ObjectRef, records: Sequence[SlurmJob], *, user: str,
                before: int | None = None) -> SlurmJob | None:
    """The accounting record that is ``ref``'s object now, or None (module docstring).

    ``records`` are sacct rows of ``ref.id`` in any order. The chain starts at the record
    with ``ref``'s name, our user and exactly ``ref.submit``; a later record continues it
    only when the one before was requeued by Slurm and the comments (when both are known)
    name the same submission. ``before``, when given, is the submit time of a live job
    that holds the id now and is not ours: nothing from then on belongs to ``ref``.
    The text sacct that Inspect reads prints a requeued record's state as the one word
    ``REQUEUED`` (read as a flag in place of the base state) on 22.05, 24.11 and 26.05
    alike, as recorded, and the chain follows it (``_requeued_record``).
    """
    candidates = sorted(
        (rec for rec in records
         if rec.job_id == ref.id and rec.name == ref.uid and rec.user == user
         and rec.submit_time is not None and rec.submit_time >= ref.submit
         and (before is None or rec.submit_time < before)),
        key=lambda rec: rec.submit_time or 0)
    if not candidates or candidates[0].submit_time != ref.submit:
        return None
    first = candidates[0]
    if ref.sluid is not None and first.sluid is not None and first.sluid != ref.sluid:
        return None  # the same id, name and submit second, but another job
    # (each requeue gives the job a new SLUID: the chain's later records have their own)
    chain = [candidates[0]]
    submission = naming.parse_comment(candidates[0].comment)
    for rec in candidates[1:]:
        if not _requeued_record(chain[-1]):
            break
        parsed = naming.parse_comment(rec.comment)
        if parsed is not None and submission is not None and parsed[0] != submission[0]:
            break
        if submission is None:
            submission = parsed
        chain.append(rec)
    return chain[-1]


def _requeued_record(record: SlurmJob) -> bool:
    """An accounting record that Slurm requeued: the same Slurm job continues in a later
    record. Text sacct prints ``REQUEUED`` (a flag in place of the base); a node failure
    or preemption of a requeueable job is written as its own base state."""
    return record.base_state in _REQUEUE_RECORD_STATES or "REQUEUED" in record.flags


def _median(values: Sequence[float]) -> float | None:
    return float(statistics.median(values)) if values else None


def _config_value(config: dict[str, str], key: str) -> str | None:
    value = config.get(key)
    if value is None or value in ("(null)", "N/A", ""):
        return None
    return value


def _config_int(config: dict[str, str], key: str) -> int | None:
    value = _config_value(config, key)
    if value is None:
        return None
    match = re.match(r"([0-9]+)", value)
    return int(match.group(1)) if match else None


def parse_show_config(text: str) -> dict[str, str]:
    """``Key = Value`` lines of ``scontrol show config``."""
    config: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() and " " not in key.strip():
            config[key.strip()] = value.strip()
    return config


# --------------------------------------------------------------------------------------
# Start batches: several Start scripts in one shell, each in its own subshell

_MARK = "@@dispatch-start"
_READBACK = "@@dispatch-readback"
_MARK_LINE = re.compile(rf"{_MARK} ([0-9]+) ([0-9]+)")


@dataclass(frozen=True, slots=True)
class _Queued:
    text: str
    future: asyncio.Future[_Outcome]
    size: int  # bytes of ``text``


@dataclass(frozen=True, slots=True)
class _Outcome:
    """One Start script's part of a shared runner call: its own exit status, stdout and
    stderr, and what the read-back found; or ``error`` when the call as a whole failed
    (its outcome is unknown)."""

    result: CommandResult
    readback: dict[int, SlurmJob]
    error: TransientError | None = None

    @staticmethod
    def unknown(error: TransientError) -> _Outcome:
        return _Outcome(CommandResult(("/bin/sh", "-s"), -1, "", "", 0.0), {}, error)


def batch_script(scripts: Sequence[str],
                 squeue_format: str = dialects.SQUEUE_TEXT_FORMAT) -> str:
    """One sh script that runs each Start script unchanged as a function in its own
    subshell, one after another, then reads every new job back with one squeue.

    Protocol (stdout): per script ``@@dispatch-start <i> <exit status>`` and its stdout
    (sbatch's ``<id>[;cluster]``); then ``@@dispatch-readback`` and the squeue rows.
    stderr carries ``@@dispatch-start <i>`` before each script's own messages.
    """
    parts = ["# dispatch Start batch: each submission's own script, in its own subshell\n"]
    for index, text in enumerate(scripts, start=1):
        parts.append(f"dispatch_start_{index}() {{\n{text}}}\n")
    parts.append("ids=\n")
    for index in range(1, len(scripts) + 1):
        parts.append(
            f"printf '{_MARK} {index}\\n' >&2\n"
            f"o=$(dispatch_start_{index}); rc=$?\n"
            f"printf '{_MARK} {index} %s\\n%s\\n' \"$rc\" \"$o\"\n"
            'if [ "$rc" -eq 0 ]; then id=${o%%;*}; case $id in'
            " ''|*[!0-9]*) ;; *) ids=$ids,$id ;; esac; fi\n")
    parts.append(
        'if [ -n "$ids" ]; then\n'
        f" printf '{_READBACK}\\n'; printf '{_READBACK}\\n' >&2\n"
        ' squeue -h --me -j "${ids#,}" --states=all -O '
        f"{shlex.quote(squeue_format)} || true\n"
        "fi\n")
    return "".join(parts)


def parse_batch_output(result: CommandResult, count: int, *, user: str,
                       columns: tuple[str, ...] = dialects.SQUEUE_TEXT_COLUMNS,
                       ) -> list[_Outcome]:
    """Each script's outcome from a ``batch_script`` run; a script with no section of its
    own (the shell died, the connection dropped) has an unknown outcome."""
    stdout: dict[int, tuple[int, list[str]]] = {}
    rows: list[str] = []
    current: list[str] | None = None
    for line in result.stdout.split("\n"):
        match = _MARK_LINE.fullmatch(line)
        if match is not None:
            current = []
            stdout[int(match.group(1))] = (int(match.group(2)), current)
        elif line == _READBACK:
            current = rows
        elif current is not None:
            current.append(line)
    stderr: dict[int, list[str]] = {}
    err_current: list[str] | None = None
    for line in result.stderr.split("\n"):
        if line.startswith(_MARK + " ") and line[len(_MARK) + 1:].isdigit():
            err_current = stderr.setdefault(int(line[len(_MARK) + 1:]), [])
        elif line == _READBACK:
            err_current = None
        elif err_current is not None:
            err_current.append(line)
    readback: dict[int, SlurmJob] = {}
    for line in our_rows("\n".join(rows)):
        try:
            jobs = dialects.parse_squeue_text(line + "\n", columns=columns)
        except ProtocolError:
            continue  # Start reads that job again on its own, and reports the error
        readback.update((job.job_id, job) for job in jobs if job.user == user)
    outcomes: list[_Outcome] = []
    for index in range(1, count + 1):
        if index not in stdout:
            outcomes.append(_Outcome.unknown(TransientError(
                f"the Start batch stopped before submission {index} reported "
                f"(exit status {result.returncode}: "
                f"{' '.join(result.stderr.split())[-300:]}); its outcome is unknown")))
            continue
        returncode, lines = stdout[index]
        text = "\n".join(lines[:-1] if lines and lines[-1] == "" else lines)
        outcomes.append(_Outcome(
            CommandResult(result.argv, returncode, text + "\n" if text else "",
                          "\n".join(stderr.get(index, [])), result.duration_s),
            readback))
    return outcomes


# --------------------------------------------------------------------------------------
# The adapter


class SlurmAdapter:
    """One Slurm cluster, reached through ``runner``, acting as Slurm user ``user``.

    ``cluster`` is ``ObjectRef.cluster`` of every object; a ref of another cluster is never
    found and never acted on. ``capabilities`` (from ``preflight``) is optional: without it
    the adapter asks sacct and maps its answer. Every command is bounded by
    ``command_timeout`` seconds. ``sleep``, ``poll_interval`` (Output's follow) and
    ``stop_confirm_s`` (how long Stop waits for the job to end) are injectable for tests.
    Concurrent Starts are coalesced into shared runner calls of at most ``start_batch``
    scripts and ``start_batch_bytes`` bytes of them, at most ``start_parallel`` calls in
    flight (see ``start``).
    """

    def __init__(self, runner: Runner, *, cluster: str, settings: script.StartSettings,
                 user: str, clock: Callable[[], float] = time.time,
                 capabilities: Capabilities | None = None,
                 command_timeout: float = DEFAULT_COMMAND_TIMEOUT_S,
                 sleep: Sleep = asyncio.sleep, poll_interval: float = 2.0,
                 stop_confirm_s: float = 10.0, start_batch: int = 32,
                 start_parallel: int = 2,
                 write_guard: Callable[[], None] | None = None,
                 start_batch_bytes: int = START_BATCH_BYTES) -> None:
        if not cluster:
            raise ErrInvalid("must not be empty", field="cluster")
        if not user:
            raise ErrInvalid("must not be empty", field="user")
        if start_batch < 1 or start_parallel < 1 or start_batch_bytes < 1:
            raise ErrInvalid("must be at least 1",
                             field="start_batch/start_parallel/start_batch_bytes")
        script.check_output_dir(settings.output_dir)
        self.cluster = cluster
        self.user = user
        self.capabilities = capabilities
        self._runner = runner
        self._settings = settings
        self._clock = clock
        self._timeout = float(command_timeout)
        self._sleep = sleep
        self._poll_interval = poll_interval
        self._stop_confirm_s = stop_confirm_s
        self._start_batch = start_batch
        self._start_parallel = start_parallel
        self._start_batch_bytes = start_batch_bytes
        # called right before every command that changes Slurm (sbatch, scancel, scontrol
        # update/release/requeue): raises LeaseLost when this process may no longer write
        self._write_guard = write_guard
        self._queued: list[_Queued] = []
        self._flushing = 0
        self._kick_scheduled = False
        self._flushes: set[asyncio.Task[None]] = set()
        # identity reads and releases/cancels of concurrent callers, joined (coalesce)
        self._identity_reads: Coalescer[int, SlurmJob | None] = Coalescer(
            self._read_ours_many, limit=JOINED_LIMIT, parallel=2)
        self._joined_writes: Coalescer[_WriteKey, CommandResult] = Coalescer(
            self._run_joined_writes, limit=JOINED_LIMIT, parallel=2)
        self._live_rows: dict[str, _RowMemo] = {}  # find_many's rows of the last read
        self._valid_ids: list[str] = []  # find_many's ids of the last call (checked)

    # ------------------------------------------------------------ commands

    async def _run(self, argv: Sequence[str]) -> CommandResult:
        return await self._runner.run(argv, timeout=self._timeout)

    async def _checked_run(self, argv: Sequence[str], operation: str) -> CommandResult:
        result = await self._run(argv)
        if not result.ok:
            raise slurm_failure(result, operation=operation)
        return result

    def _now(self) -> int:
        return int(self._clock())

    def _guard_write(self) -> None:
        """Raise (``LeaseLost``) when this process may no longer write to Slurm."""
        if self._write_guard is not None:
            self._write_guard()

    # ------------------------------------------------------------ SLUID (capabilities)
    # Only what a successful Preflight found counts: without it, nothing asks for the
    # SLUID (squeue on 24.11/22.05 answers an unknown field with an error and NO rows,
    # exit status 0) and every write names the numeric id.

    # Each read takes the columns once, before its command runs, and parses with those:
    # a Preflight that finishes meanwhile changes the next read, never this one.

    def _squeue_columns(self) -> tuple[str, ...]:
        caps = self.capabilities
        if caps is not None and caps.squeue_sluid:
            return dialects.SQUEUE_TEXT_COLUMNS_SLUID
        return dialects.SQUEUE_TEXT_COLUMNS

    def _sacct_columns(self) -> tuple[str, ...]:
        caps = self.capabilities
        if caps is not None and caps.sacct_sluid:
            return dialects.SACCT_TEXT_COLUMNS_SLUID
        return dialects.SACCT_TEXT_COLUMNS

    def _target(self, ref: ObjectRef, job: SlurmJob) -> str:
        """What a write names the identity-checked ``job`` (``ref``'s object) by: its
        SLUID as just read where the cluster's writes take one (the live one: each requeue
        gives the job a new SLUID, so a ref's may be an earlier run's), else its numeric
        id. Requeued between the read and the write, the job is not found: nothing done."""
        caps = self.capabilities
        if caps is not None and caps.identity == IDENTITY_SLUID and job.sluid is not None:
            return job.sluid
        return str(ref.id)

    async def _write(self, operation: str, target: str, *, uid: str,
                     begin: int | None = None) -> CommandResult:
        """The one place a command that changes a job runs (after the write guard).
        ``target`` is a SLUID or a numeric id; ``operation`` one of ``cancel``,
        ``hold`` (``StartTime=<begin>``), ``start-now``, ``release``, ``requeue``.
        Callers pass only a target that passed the identity check; a SLUID names
        one job forever, so even a stale one can touch no other job."""
        sluid = _SLUID.fullmatch(target) is not None
        if not sluid and not target.isdigit():
            raise ErrInvalid(f"not a job id or SLUID: {target!r:.40}", field="target")
        match operation:
            case "cancel":
                # with a SLUID, scancel --name cancels nothing on 26.05 (tried): the
                # name filter is the numeric id's belt only
                argv = ["scancel", target] if sluid else ["scancel", f"--name={uid}", target]
            case "hold":
                if begin is None:
                    raise ErrInvalid("hold needs a begin time", field="begin")
                argv = ["scontrol", "update", f"JobId={target}", f"StartTime={utc_text(begin)}"]
            case "start-now":
                argv = ["scontrol", "update", f"JobId={target}", "StartTime=now"]
            case "release" | "requeue":
                argv = ["scontrol", operation, target]
            case _:
                raise ErrInvalid(f"unknown write {operation!r}", field="operation")
        self._guard_write()
        return await self._run(argv)

    async def _checked_write(self, operation: str, target: str, *, uid: str,
                             begin: int | None = None, what: str) -> CommandResult:
        result = await self._write(operation, target, uid=uid, begin=begin)
        if not result.ok:
            raise slurm_failure(result, operation=what)
        return result

    async def _joined_write(self, operation: str, target: str, *, uid: str,
                            what: str) -> CommandResult:
        """A ``release`` or ``cancel`` of one identity-checked target, joined with the
        concurrent ones of the same kind into one command (``_write_many``). _Alone when
        a joined command failed: the caller checks its job again and writes it alone."""
        result = await self._joined_writes.call((operation, target, uid))
        if not result.ok:
            raise slurm_failure(result, operation=what)
        return result

    async def _run_joined_writes(self, keys: Sequence[_WriteKey]
                                 ) -> dict[_WriteKey, CommandResult | BaseException]:
        groups: dict[tuple[str, bool], list[_WriteKey]] = {}
        for key in keys:
            groups.setdefault((key[0], _SLUID.fullmatch(key[1]) is not None), []).append(key)
        answers: dict[_WriteKey, CommandResult | BaseException] = {}
        for (operation, _), group in groups.items():
            try:
                if len(group) == 1:
                    result = await self._write(operation, group[0][1], uid=group[0][2])
                else:
                    result = await self._write_many(operation, [key[1] for key in group])
            except Exception as exc:  # e.g. LeaseLost: each caller raises it
                answers.update(dict.fromkeys(group, exc))
                continue
            if len(group) > 1 and not result.ok:
                # which job made it fail, and whether the others were written, is not
                # told apart from the text: each is checked again and written alone
                answers.update((key, _Alone(result.stderr.strip()[:200])) for key in group)
            else:
                answers.update(dict.fromkeys(group, result))
        return answers

    async def _write_many(self, operation: str, targets: Sequence[str]) -> CommandResult:
        """One command that releases or cancels every identity-checked target (all
        numeric ids, or all SLUIDs). A cancel of numeric ids is restricted to our user
        (``scancel --user``): the per-job ``--name`` belt of ``_write`` takes one name."""
        for target in targets:
            if _SLUID.fullmatch(target) is None and not target.isdigit():
                raise ErrInvalid(f"not a job id or SLUID: {target!r:.40}", field="target")
        match operation:
            case "release":
                argv = ["scontrol", "release", ",".join(targets)]
            case "cancel" if _SLUID.fullmatch(targets[0]) is not None:
                argv = ["scancel", *targets]
            case "cancel":
                argv = ["scancel", f"--user={self.user}", *targets]
            case _:
                raise ErrInvalid(f"no joined write {operation!r}", field="operation")
        self._guard_write()
        return await self._run(argv)

    # ------------------------------------------------------------ live reads

    async def _read_job(self, job_id: int) -> SlurmJob | None:
        """The job with this id as slurmctld holds it now, when it has a name of ours;
        None when slurmctld does not know the id or the job there is not named ``dj-…``."""
        columns = self._squeue_columns()
        result = await self._run(["squeue", "-h", "-j", str(job_id), "--states=all",
                                  "-O", _squeue_format(columns)])
        if not result.ok:
            error = slurm_failure(result, operation=f"squeue -j {job_id}")
            if isinstance(error, ErrNotFound):
                return None
            raise error
        for line in our_rows(result.stdout):
            for job in dialects.parse_squeue_text(line + "\n", columns=columns):
                if job.job_id == job_id:
                    return job
        return None

    async def _read_ours(self, job_id: int) -> SlurmJob | None:
        """The job with this id as slurmctld holds it now when it is ours and named
        ``dj-…`` (else None), for an identity check before a write: concurrent checks are
        joined into one command (``_read_ours_many``)."""
        return await self._identity_reads.call(job_id)

    async def _read_ours_many(self, job_ids: Sequence[int]) -> dict[int, SlurmJob | None]:
        """Each of ``job_ids`` (one id: ``_read_job``; several: one ``squeue --me -j``,
        whose job list squeue filters on our user's jobs, one RPC for all)."""
        if len(job_ids) == 1:
            return {job_ids[0]: await self._read_job(job_ids[0])}
        columns = self._squeue_columns()
        result = await self._run(["squeue", "-h", "--me", "--states=all",
                                  "-j", ",".join(str(i) for i in job_ids),
                                  "-O", _squeue_format(columns)])
        if not result.ok:
            error = slurm_failure(result, operation=f"squeue -j ({len(job_ids)} ids)")
            if not isinstance(error, ErrNotFound):
                raise error
            # an id slurmctld no longer knows made the list fail: each on its own
            found = await asyncio.gather(*(self._read_job(i) for i in job_ids))
            return dict(zip(job_ids, found, strict=True))
        wanted = set(job_ids)
        jobs: dict[int, SlurmJob | None] = dict.fromkeys(job_ids)
        for line in our_rows(result.stdout):
            for job in dialects.parse_squeue_text(line + "\n", columns=columns):
                if job.job_id in wanted and job.user == self.user:
                    jobs[job.job_id] = job
        return jobs

    async def _read_mine(self, *, names: Collection[str],
                         name_filter: str | None = None) -> list[SlurmJob]:
        """Every job of ours in slurmctld's memory, any state, whose name is in ``names``
        (one squeue call; ``name_filter`` narrows it server-side to one name)."""
        argv = ["squeue", "-h", "--me", "--states=all"]
        if name_filter is not None:
            argv.append(f"--name={name_filter}")
        columns = self._squeue_columns()
        argv += ["-O", _squeue_format(columns)]
        result = await self._checked_run(argv, "squeue --me")
        jobs: list[SlurmJob] = []
        for line in our_rows(result.stdout, names=names):
            jobs.extend(job for job in dialects.parse_squeue_text(line + "\n", columns=columns)
                        if job.user == self.user)
        return jobs

    def _same_object(self, ref: ObjectRef, job: SlurmJob) -> bool:
        """SPEC §2's identity check, plus: the job is our user's."""
        if ref.cluster != self.cluster or job.job_id != ref.id or job.name != ref.uid:
            return False
        if job.user != self.user or job.submit_time is None:
            return False
        if job.submit_time == ref.submit:
            # a SLUID is never reused: a different one is another job, whatever else
            # matches (a requeue gives the job a new SLUID and a new submit time: below)
            return ref.sluid is None or job.sluid is None or ref.sluid == job.sluid
        return (job.restart_count or 0) > 0 and job.submit_time >= ref.submit

    async def _identified(self, ref: ObjectRef, operation: str) -> SlurmJob:
        """The live job that is ``ref``'s object and ours to write, or ErrNotFound."""
        job = None if ref.cluster != self.cluster else await self._read_ours(ref.id)
        if job is None or not self._same_object(ref, job):
            raise ErrNotFound(f"{operation}: no job {ref.id} named {ref.uid} submitted at "
                              f"{ref.submit} on cluster {ref.cluster}; nothing was done")
        if naming.parse_comment(job.comment) is None:
            raise ErrNotFound(f"{operation}: job {ref.id} ({ref.uid}) has a comment that is "
                              f"not ours ({job.comment!r:.80}): foreign, never written")
        return job

    def _observe(self, job: SlurmJob, source: Source = Source.LIVE, *,
                 now: int | None = None) -> ObjectObs:
        return classify(job, source=source, cluster=self.cluster,
                        now=self._now() if now is None else now, slurm_uids=self._slurm_uids())

    def _slurm_uids(self) -> frozenset[int]:
        """Whose cancels are Slurm's own: root, and the SlurmUser preflight found."""
        caps = self.capabilities
        if caps is None or caps.slurm_user_uid is None:
            return DEFAULT_SLURM_UIDS
        return DEFAULT_SLURM_UIDS | {caps.slurm_user_uid}

    def _ref(self, job: SlurmJob) -> ObjectRef:
        if job.submit_time is None:
            raise ProtocolError(f"job {job.job_id} has no submit time")
        return ObjectRef(cluster=self.cluster, uid=job.name, id=job.job_id,
                         submit=job.submit_time, sluid=job.sluid)

    # ------------------------------------------------------------ accounting reads

    def _accounting_known_off(self) -> bool:
        return self.capabilities is not None and not self.capabilities.accounting_history

    async def _sacct(self, selection: Sequence[str], *, since: int) -> list[SlurmJob]:
        """sacct text records (allocations, every record of a reused id) of our rows."""
        start = min(since, self._now())
        columns = self._sacct_columns()
        result = await self._checked_run(
            ["sacct", "-X", "-D", "-P", "-n", "-o", ",".join(columns),
             "-S", utc_text(start), *selection], "sacct")
        jobs: list[SlurmJob] = []
        for line in our_rows(result.stdout):
            jobs.extend(job for job in dialects.parse_sacct_text(line + "\n", columns=columns)
                        if job.user == self.user)
        return jobs

    # ------------------------------------------------------------ Start

    async def start(self, request: StartRequest) -> ObjectRef:
        """Submit one Slurm job for ``request`` and return its ref (SPEC §3).

        Refusals (ErrInvalid/ErrUnsupported) happen before anything runs. When the outcome
        is ambiguous (transport failure, timeout, a transient Slurm error) the job is
        rediscovered by name and submission number, never submitted again; if it cannot
        be found, TransientError: the caller keeps its intent.

        The Start script runs unchanged, as a shell function in its own subshell, and the
        same runner call reads the new job back (``squeue --me -j <ids>``): one round trip
        per Start instead of two. Starts that are issued together (``asyncio.gather``, a
        reconcile tick) share that call: ``start_batch`` scripts run one after another in
        one shell, each with its own exit status, stdout and stderr, and one squeue reads
        them all back. That is what makes Start about as fast as a bare ``sbatch`` loop
        locally and many times faster than one SSH connection per job.
        """
        text = script.render_start_script(request, self._settings)
        name = naming.discovery_name(request.job_id)
        began = self._now()
        outcome = await self._submit(text)
        if outcome.error is not None:
            return await self._rediscover(request, name, began=began, cause=outcome.error)
        result = outcome.result
        if not result.ok:
            error = slurm_failure(result, operation="sbatch")
            if isinstance(error, TransientError) and not isinstance(error, ErrBackPressure):
                return await self._rediscover(request, name, began=began, cause=error)
            raise error  # a refusal: sbatch created nothing (ErrBackPressure: retry later)
        job_id = parse_parsable(result.stdout)
        if job_id is None:
            return await self._rediscover(request, name, began=began, cause=ProtocolError(
                f"sbatch printed no job id: {result.stdout.strip()!r:.200}"))
        job = outcome.readback.get(job_id)
        if job is None:
            try:
                job = await self._read_job(job_id)
            except TransientError as exc:
                return await self._rediscover(request, name, began=began, cause=exc)
        if job is None or not self._is_submission(job, name, request.submission):
            raise ProtocolError(
                f"sbatch reported job {job_id} for {name} submission {request.submission}, "
                f"but job {job_id} reads back as "
                + ("unknown" if job is None else
                   f"{job.name!r} of {job.user!r} with comment {job.comment!r:.80}"))
        if naming.parse_comment(job.comment) != (request.submission, request.attempt):
            raise ProtocolError(f"job {job_id} reads back with comment {job.comment!r:.80}, "
                                f"not submission {request.submission} attempt "
                                f"{request.attempt}")
        ref = self._ref(job)
        log.info("slurm job submitted", extra={"job": request.job_id, "slurm_id": ref.id,
                                               "submission": request.submission})
        return ref

    # ------------------------------------------------------------ Start batching

    async def _submit(self, text: str) -> _Outcome:
        """Run one Start script in the next shared runner call; its own outcome."""
        future: asyncio.Future[_Outcome] = asyncio.get_running_loop().create_future()
        self._queued.append(_Queued(text, future, len(text.encode())))
        self._schedule_kick()
        return await future

    def _schedule_kick(self) -> None:
        # On the next loop iteration, so every Start issued in this one joins the batch.
        if not self._kick_scheduled:
            self._kick_scheduled = True
            asyncio.get_running_loop().call_soon(self._kick)

    def _kick(self) -> None:
        self._kick_scheduled = False
        self._queued = [item for item in self._queued if not item.future.done()]
        while self._queued and self._flushing < self._start_parallel:
            free = self._start_parallel - self._flushing
            count = min(self._start_batch, -(-len(self._queued) // free))
            size = total = 0
            for item in self._queued[:count]:  # and at most start_batch_bytes (>= 1 script)
                if size and total + item.size > self._start_batch_bytes:
                    break
                size += 1
                total += item.size
            batch, self._queued = self._queued[:size], self._queued[size:]
            self._flushing += 1
            task = asyncio.get_running_loop().create_task(self._flush(batch))
            self._flushes.add(task)
            task.add_done_callback(self._flushes.discard)

    async def _flush(self, batch: list[_Queued]) -> None:
        try:
            columns = self._squeue_columns()
            text = batch_script([item.text for item in batch], _squeue_format(columns))
            timeout = self._timeout + 2.0 * (len(batch) - 1)
            self._guard_write()  # the batch may have waited: the last moment to refuse
            try:
                result = await self._runner.run_script(text, timeout=timeout)
            except TransientError as exc:
                outcomes = [_Outcome.unknown(exc)] * len(batch)
            else:
                outcomes = parse_batch_output(result, len(batch), user=self.user,
                                              columns=columns)
            for item, outcome in zip(batch, outcomes, strict=True):
                if not item.future.done():
                    item.future.set_result(outcome)
        except asyncio.CancelledError:
            for item in batch:  # the script may have run: unknown, so each rediscovers
                if not item.future.done():
                    item.future.set_result(_Outcome.unknown(TransientError(
                        "the Start batch was cancelled; its outcome is unknown")))
            raise
        except Exception as exc:  # e.g. HostKeyError: each Start raises it
            for item in batch:
                if not item.future.done():
                    item.future.set_exception(exc)
        finally:
            self._flushing -= 1
            if self._queued:
                self._schedule_kick()

    def _is_submission(self, job: SlurmJob, name: str, submission: int) -> bool:
        parsed = naming.parse_comment(job.comment)
        return (job.name == name and job.user == self.user and parsed is not None
                and parsed[0] == submission)

    async def _rediscover(self, request: StartRequest, name: str, *, began: int,
                          cause: DispatchError) -> ObjectRef:
        """After an ambiguous Start: the job of this submission, found by name, or
        TransientError (ProtocolError when sbatch's own answer was unreadable)."""
        log.warning("start outcome unknown; rediscovering by name",
                    extra={"job": request.job_id, "submission": request.submission,
                           "error": str(cause)})
        problems: list[str] = []
        try:
            live = [job for job in await self._read_mine(names={name}, name_filter=name)
                    if self._is_submission(job, name, request.submission)]
            if live:
                return self._ref(min(live, key=lambda j: (j.submit_time or 0, j.job_id)))
        except TransientError as exc:
            problems.append(f"squeue: {exc}")
        if not self._accounting_known_off():
            try:
                records = [job for job in await self._sacct(
                    [f"--name={name}"], since=began - REDISCOVERY_WINDOW_S)
                    if self._is_submission(job, name, request.submission)]
                if records:
                    return self._ref(min(records,
                                         key=lambda j: (j.submit_time or 0, j.job_id)))
            except DispatchError as exc:
                problems.append(f"sacct: {exc}")
        message = (f"start of {name} submission {request.submission}: outcome unknown "
                   f"({cause}); no such job found" + (f" ({'; '.join(problems)})"
                                                      if problems else ""))
        if isinstance(cause, ProtocolError) and not problems:
            raise ProtocolError(message) from cause
        raise TransientError(message) from cause

    # ------------------------------------------------------------ Find, Inspect

    async def find(self, job_id: str) -> list[ObjectObs]:
        """Every live object of dispatch job ``job_id`` (one squeue call)."""
        return (await self.find_many([job_id]))[job_id]

    async def find_many(self, job_ids: Collection[str], *,
                        strays: dict[str, list[ObjectObs]] | None = None,
                        ) -> dict[str, list[ObjectObs]]:
        """Every live object of each dispatch job, with ONE squeue call for all of them.

        Only our user's jobs whose name is exactly ``dj-<ULID>`` of an asked-for id are
        returned; a job whose comment is not ours is returned with ``foreign=True``.
        With ``strays``, the objects named ``dj-<ULID>`` of ids NOT asked for are put there
        (from the same read): the late objects that no tracked record owns.

        A row byte-identical to one of the previous call's gives back the very same
        ``ObjectObs`` (its ``observed_at`` is when that row was first classified), unless
        its classification could have changed with the clock since: a start or end time
        that was still ahead then and is not now, or a clock that went back (see
        ``_classified_rows``). Only the rows of the last read are remembered.
        """
        ids = list(job_ids)
        if ids != self._valid_ids:  # usually the very same ids as the last call's
            for job_id in set(ids).difference(self._valid_ids):
                naming.discovery_name(job_id)  # ErrInvalid for a malformed id, as ever
            self._valid_ids = ids
        found: dict[str, list[ObjectObs]] = {job_id: [] for job_id in ids}
        if ids or strays is not None:
            await self._classified_rows(found, strays)
        return found

    async def _classified_rows(self, found: dict[str, list[ObjectObs]],
                               strays: dict[str, list[ObjectObs]] | None = None) -> None:
        """Append to ``found[job id]`` the observation of each row of ours that
        ``_read_mine(names=<the names of found's ids>)`` would return, reusing the
        previous read's observation of each byte-identical row while it still holds:
        parsing and classifying 100k rows every tick would cost more than everything else
        together.

        A row's observation depends on the clock only through ``classify``'s comparisons
        of the start and end times with ``now`` (Slurm's estimates are None, a preemption
        grace ends): it holds from the second it was made until the first of those times
        that was still ahead. A row that fails to parse raises as before and nothing is
        remembered of that read.
        """
        columns = self._squeue_columns()
        argv = ["squeue", "-h", "--me", "--states=all", "-O", _squeue_format(columns)]
        result = await self._checked_run(argv, "squeue --me")
        now = self._now()
        before = self._live_rows.get
        remembered: dict[str, _RowMemo] = {}
        wanted = found.get
        for line in result.stdout.splitlines():
            memo = before(line)
            if memo is None or not memo[2] <= now < memo[3]:
                match = _OUR_ROW.match(line)
                if match is None or naming.job_id_of_name(match.group(2)) is None:
                    continue
                if strays is None and match.group(2)[len(naming.NAME_PREFIX):] not in found:
                    continue
                memo = self._classify_row(line, now, columns)
            remembered[line] = memo
            obs = memo[1]
            if obs is not None:
                into = wanted(memo[0])
                if into is not None:
                    into.append(obs)
                elif strays is not None:
                    strays.setdefault(memo[0], []).append(obs)
        self._live_rows = remembered

    def _classify_row(self, line: str, now: int,
                      columns: tuple[str, ...] = dialects.SQUEUE_TEXT_COLUMNS) -> _RowMemo:
        """One squeue row of ours: its job id, its observation (None: another user's job),
        the second it was made, and the second from which it may no longer hold."""
        name = ""
        obs = None
        until = _FOREVER
        for job in dialects.parse_squeue_text(line + "\n", columns=columns):
            if job.user != self.user:
                continue
            name = job.name[len(naming.NAME_PREFIX):]
            obs = self._observe(job, now=now)
            expires = valid_until(job, now=now)  # classify's own clock rules
            if expires is not None:
                until = min(until, expires)
        return name, obs, now, until

    async def inspect(self, ref: ObjectRef) -> ObjectObs:
        """The object ``ref`` names, from squeue, or from sacct once it has left squeue.

        ErrNotFound when neither holds it (or accounting is off and squeue does not).
        A sacct record that is still pending or running is refused (ProtocolError).
        """
        if ref.cluster != self.cluster:
            raise ErrNotFound(f"inspect: ref of cluster {ref.cluster}, not {self.cluster}")
        job = await self._read_job(ref.id)
        before = None
        if job is not None:
            if self._same_object(ref, job):
                return self._observe(job)
            if job.submit_time is not None and job.submit_time > ref.submit:
                before = job.submit_time  # the id was reused: later records are not ours
        if self._accounting_known_off():
            raise ErrNotFound(f"inspect: job {ref.id} ({ref.uid}) is not in squeue and "
                              "accounting is off")
        try:
            records = await self._sacct(["-j", str(ref.id)], since=ref.submit)
        except ErrUnsupported as exc:
            raise ErrNotFound(f"inspect: job {ref.id} ({ref.uid}) is not in squeue and "
                              f"accounting is unavailable: {exc}") from exc
        record = pick_record(ref, records, user=self.user, before=before)
        if record is None:
            raise ErrNotFound(f"inspect: no job {ref.id} named {ref.uid} submitted at "
                              f"{ref.submit} in squeue or sacct")
        return self._observe(record, Source.ACCOUNTING)

    async def inspect_many(self, refs: Sequence[ObjectRef], *,
                           since: int) -> dict[ObjectRef, ObjectObs]:
        """Accounting observations of objects that left squeue: ONE sacct call (per
        ~100 KB of ids). Refs with no record of their own (or a record sacct cannot
        classify yet) are left out. ErrUnsupported without accounting."""
        if self._accounting_known_off():
            raise ErrUnsupported("inspect_many: this cluster has no accounting history")
        ours = [ref for ref in refs if ref.cluster == self.cluster]
        ids = sorted({ref.id for ref in ours})
        if not ids:
            return {}
        records: dict[int, list[SlurmJob]] = {}
        chunk: list[str] = []
        size = 0
        chunks: list[list[str]] = []
        for job_id in map(str, ids):
            if chunk and size + len(job_id) + 1 > SACCT_ARG_LIMIT:
                chunks.append(chunk)
                chunk, size = [], 0
            chunk.append(job_id)
            size += len(job_id) + 1
        chunks.append(chunk)
        for part in chunks:
            for row in await self._sacct(["-j", ",".join(part)], since=since):
                records.setdefault(row.job_id, []).append(row)
        observed: dict[ObjectRef, ObjectObs] = {}
        for ref in ours:
            record = pick_record(ref, records.get(ref.id, ()), user=self.user)
            if record is None:
                continue
            try:
                observed[ref] = self._observe(record, Source.ACCOUNTING)
            except ProtocolError as exc:
                log.info("accounting record not classifiable yet",
                         extra={"slurm_id": ref.id, "uid": ref.uid, "error": str(exc)})
        return observed

    # ------------------------------------------------------------ writes

    async def stop(self, ref: ObjectRef) -> None:
        """Cancel ``ref``'s object by name AND id, then confirm it ended (~10 s).

        When the identity check fails (gone, id reused, not ours) nothing is cancelled and
        Stop succeeds. TransientError when the job is still running after the wait.
        Concurrent Stops share their identity read and their scancel.
        """
        await self._stop(ref, alone=False)

    async def _stop(self, ref: ObjectRef, *, alone: bool) -> None:
        try:
            job = await self._identified(ref, "stop")
        except ErrNotFound:
            log.info("stop: nothing to cancel", extra={"slurm_id": ref.id, "uid": ref.uid})
            return
        if self._observe(job).state is State.ENDED:
            return
        target = self._target(ref, job)
        if alone:
            await self._checked_write("cancel", target, uid=ref.uid, what="scancel")
        else:
            try:
                await self._joined_write("cancel", target, uid=ref.uid, what="scancel")
            except _Alone:
                await self._stop(ref, alone=True)
                return
        # bounded by the time slept, not by the clock: an injected clock may stand still
        waited = 0.0
        delay = 0.2
        while True:
            job_now = await self._read_ours(ref.id)
            if job_now is None or not self._same_object(ref, job_now) or _ending(
                    self._observe(job_now), job_now):
                return
            if waited >= self._stop_confirm_s:
                raise TransientError(f"stop: job {ref.id} ({ref.uid}) is still "
                                     f"{job_now.state_text} {self._stop_confirm_s:g}s after "
                                     "scancel", retry_after=self._stop_confirm_s)
            await self._sleep(delay)
            waited += delay
            delay = min(delay * 2, 2.0)

    async def hold(self, ref: ObjectRef, instance: int) -> None:
        """Hold a pending object with ``instance`` as a far-future start time (SPEC §5).

        ErrNotFound when the identity check fails; ErrConflict when the job is not
        pending, or when the hold does not read back as ``instance``.
        """
        holds.encode_hold(1, instance)  # refuses a bad instance before anything runs
        job = await self._identified(ref, "hold")
        obs = self._observe(job)
        if obs.state not in _NOT_STARTED:
            raise ErrConflict(f"hold: job {ref.id} is {obs.state} ({job.state_text}); only "
                              "a pending job can be held")
        if job.submit_time is None:
            raise ProtocolError(f"hold: job {ref.id} has no submit time")
        begin = holds.encode_hold(job.submit_time, instance)
        await self._checked_write("hold", self._target(ref, job), uid=ref.uid, begin=begin,
                                  what="scontrol update StartTime")
        after = await self._identified(ref, "hold")
        got = self._observe(after).hold_instance
        if got != instance:
            raise ErrConflict(
                f"hold: job {ref.id} reads back with hold instance {got} (begin "
                f"{after.eligible_time}, submit {after.submit_time}), not {instance}: the job "
                "changed under the hold (requeued or started); re-observe")

    async def release(self, ref: ObjectRef) -> None:
        """Open the gate (``scontrol release``) and/or lift a dispatch hold
        (``StartTime=now``). Idempotent; ErrNotFound when the identity check fails.
        Concurrent Releases share their identity read and their ``scontrol release``."""
        await self._release(ref, alone=False)

    async def _release(self, ref: ObjectRef, *, alone: bool) -> None:
        job = await self._identified(ref, "release")
        obs = self._observe(job)
        if obs.state not in _NOT_STARTED:
            return
        target = self._target(ref, job)
        if obs.hold_instance is not None:
            result = await self._write("start-now", target, uid=ref.uid)
            if not result.ok:
                error = slurm_failure(result, operation="scontrol update StartTime=now")
                if isinstance(error, ErrConflict):
                    return  # it started meanwhile: released
                raise error
        if job.reason == "JobHeldUser" and (job.restart_count or 0) == 0:
            if alone:
                await self._checked_write("release", target, uid=ref.uid,
                                          what="scontrol release")
                return
            try:
                await self._joined_write("release", target, uid=ref.uid,
                                         what="scontrol release")
            except _Alone:
                await self._release(ref, alone=True)

    async def requeue(self, ref: ObjectRef) -> None:
        """``scontrol requeue`` of ``ref``'s object. ErrConflict when it is pending;
        ErrUnsupported when requeue is disabled for it (``--no-requeue``)."""
        job = await self._identified(ref, "requeue")
        await self._checked_write("requeue", self._target(ref, job), uid=ref.uid,
                                  what="scontrol requeue")

    # ------------------------------------------------------------ Output

    async def output(self, ref: ObjectRef, stream: Stream, *, follow: bool = False,
                     submission: int) -> AsyncIterator[bytes]:
        """The bytes of one stream of ``ref``'s executions, in restart order (SPEC §3.4).

        Reads the manifest ``D/s<N>.manifest``, lists the execution files of ``ref.id``
        under its prefix and suffix (r10 after r9) and yields their contents. With
        ``follow`` it polls every ``poll_interval`` seconds for new bytes and new
        executions until the job has ended (then reads once more and stops).
        """
        if stream not in ("stdout", "stderr"):
            raise ErrInvalid("must be stdout or stderr", field="stream")
        job_id = naming.job_id_of_name(ref.uid)
        if job_id is None:
            raise ErrInvalid(f"not a discovery name: {ref.uid!r:.60}", field="ref.uid")
        manifest = script.manifest_path(self._settings, job_id, submission)
        stdout_files, stderr_files = script.parse_manifest(await self._cat(manifest))
        files = stdout_files if stream == "stdout" else stderr_files
        directory, prefix = files.locate(posixpath.dirname(manifest))
        offsets: dict[str, int] = {}
        while True:
            ended = await self._output_finished(ref) if follow else True
            more = True
            while more:
                chunks, more = await self._read_new(directory, prefix, files.suffix,
                                                    ref.id, offsets)
                for chunk in chunks:
                    yield chunk
            if ended:
                return
            await self._sleep(self._poll_interval)

    async def _cat(self, path: str) -> str:
        result = await self._runner.run_script(
            f"exec cat -- {script.shell_path(path)}\n", timeout=self._timeout)
        if not result.ok:
            if "No such file" in result.stderr:
                raise ErrNotFound(f"output: no manifest {path}")
            raise slurm_failure(result, operation=f"cat {path}")
        return result.stdout

    async def _output_finished(self, ref: ObjectRef) -> bool:
        try:
            return (await self.inspect(ref)).state is State.ENDED
        except ErrNotFound:
            return True
        except ProtocolError:
            return False  # sacct says it is still pending/running

    async def _read_new(self, directory: str, prefix: str, suffix: str, slurm_id: int,
                        offsets: dict[str, int]) -> tuple[list[bytes], bool]:
        """New bytes of every execution file of ``slurm_id``, in restart order; and
        whether a file has more than one chunk still to read."""
        cases = "".join(f"  {shlex.quote(name)}) off={offset} ;;\n"
                        for name, offset in sorted(offsets.items()))
        pattern = shlex.quote(prefix) + "*" + (shlex.quote(suffix) if suffix else "")
        text = (
            f"cd -- {script.shell_path(directory)} 2>/dev/null || exit 0\n"
            f"for f in {pattern}; do\n"
            ' [ -f "$f" ] || continue\n'
            ' case $f in *"\n"*) continue ;; esac\n'
            " off=0\n"
            + (f" case $f in\n{cases} esac\n" if cases else "")
            + ' size=$(wc -c <"$f") || continue\n'
            " n=$((size - off))\n"
            f" [ \"$n\" -gt {OUTPUT_CHUNK} ] && n={OUTPUT_CHUNK}\n"
            ' [ "$n" -lt 0 ] && n=0\n'
            " printf '%s %s %s\\n' \"$off\" \"$n\" \"$f\"\n"
            ' if [ "$n" -gt 0 ]; then tail -c +$((off + 1)) -- "$f" | head -c "$n" |'
            " base64 | tr -d '\\n'; fi\n"
            " printf '\\n'\n"
            "done\n")
        result = await self._runner.run_script(text, timeout=self._timeout)
        if not result.ok:
            raise slurm_failure(result, operation=f"output of job {slurm_id}")
        lines = result.stdout.split("\n")
        data: dict[str, bytes] = {}
        more = False
        for header, body in zip(lines[0::2], lines[1::2], strict=False):
            parts = header.split(" ", 2)
            if len(parts) != 3 or not parts[0].isdigit() or not parts[1].isdigit():
                continue
            off, count, name = int(parts[0]), int(parts[1]), parts[2]
            parsed = script.parse_execution_file(name, prefix, suffix)
            if parsed is None or parsed[0] != slurm_id or off != offsets.get(name, 0):
                continue
            try:
                chunk = base64.b64decode(body, validate=True)
            except ValueError as exc:
                raise ProtocolError(f"output: unreadable bytes of {name}: {exc}") from exc
            data[name] = chunk
            more = more or count >= OUTPUT_CHUNK
        chunks: list[bytes] = []
        for name in script.sort_execution_files(data, prefix, suffix):
            offsets[name] = offsets.get(name, 0) + len(data[name])
            if data[name]:
                chunks.append(data[name])
        return chunks, more

    # ------------------------------------------------------------ paths, stats

    async def started_evidence(self, ref: ObjectRef, submission: int) -> bool:
        """Whether ``ref``'s object of ``submission`` ever started: slurmstepd creates its
        ``--output`` file (``D/s<N>-<id>.slurm``, script.py) when the batch step starts, so
        its absence says it never ran -- given that ``output.dir`` is the same file system
        on the nodes and here, which ``logs`` needs as well."""
        job_id = naming.job_id_of_name(ref.uid)
        if job_id is None:
            raise ErrInvalid(f"not a dispatch name: {ref.uid!r:.60}", field="ref.uid")
        path = posixpath.join(script.output_dir(self._settings, job_id),
                              f"s{submission}-{ref.id}.slurm")
        return not await self.missing_paths([path])

    async def missing_paths(self, paths: Sequence[str]) -> list[str]:
        """The paths that do not exist on the Slurm host (one sh script per ~60 KB)."""
        missing: list[str] = []
        start = 0
        while start < len(paths):
            lines: list[str] = []
            size = 0
            end = start
            while end < len(paths) and (not lines or size < MISSING_PATHS_SCRIPT_LIMIT):
                path = paths[end]
                if not path or "\0" in path:
                    raise ErrInvalid(f"not a path: {path!r:.60}", field=f"paths[{end}]")
                word = script.shell_path(path) if path.startswith("~") else shlex.quote(path)
                line = f"[ -e {word} ] || echo {end - start}"
                lines.append(line)
                size += len(line) + 1
                end += 1
            result = await self._runner.run_script("\n".join(lines) + "\n",
                                                   timeout=self._timeout)
            if not result.ok:
                raise slurm_failure(result, operation="missing_paths")
            for token in result.stdout.split():
                if not token.isdigit() or int(token) >= end - start:
                    raise ProtocolError(f"missing_paths: unexpected output {token!r:.40}")
                missing.append(paths[start + int(token)])
            start = end
        return missing

    async def cluster_stats(self) -> ClusterStats:
        """Running and pending jobs of all users, down/drained nodes, and waits: one
        squeue over every user's pending and running jobs plus one sinfo."""
        queue, nodes = await asyncio.gather(
            self._checked_run(["squeue", "-h", "-a", "--states=PENDING,RUNNING",
                               "-O", "JobID:|,StateCompact:|,SubmitTime:|,StartTime:|,"
                               "Reason:|"], "squeue (cluster stats)"),
            self._checked_run(["sinfo", "-h", "-N", "-o", "%N|%T"], "sinfo"))
        now = self._now()
        running = pending = 0
        estimates: list[float] = []
        recent: list[float] = []
        for line in queue.stdout.splitlines():
            fields = line.split("|", 4)
            if len(fields) != 5:
                continue
            _, compact, submit_text, start_text, reason = fields
            reason = re.split(r"[,:(]", reason.rstrip("|"), maxsplit=1)[0].strip()
            try:
                submit = dialects.parse_text_time(submit_text)
                start = dialects.parse_text_time(start_text)
            except ProtocolError:
                continue
            if compact == "PD":
                pending += 1
                if reason in _WAITING_FOR_RESOURCES and start is not None:
                    estimates.append(float(max(0, start - now)))
            elif compact == "R":
                running += 1
                if (start is not None and submit is not None
                        and now - RECENT_START_WINDOW_S <= start <= now):
                    recent.append(float(max(0, start - submit)))
        down: set[str] = set()
        for line in nodes.stdout.splitlines():
            name, _, state = line.partition("|")
            base = state.strip().lower().rstrip("*~#!%$@^-+")
            if name and (state.strip().endswith("*")
                         or base.startswith(("down", "drain", "fail", "no_respond"))):
                down.add(name.strip())
        return ClusterStats(
            running=running, pending=pending, down_nodes=frozenset(down),
            estimated_wait_s=_median(estimates), observed_wait_s=_median(recent),
            extra={"pending_with_estimate": str(len(estimates)),
                   "recent_starts": str(len(recent))})

    # ------------------------------------------------------------ Preflight

    async def preflight(self) -> Capabilities:
        """Probe the cluster: version, configuration, accounting, ``squeue --me``, whether
        ``output.dir`` is writable, and which identity it supports (``squeue -O SLUID``
        and ``sacct -o SLUID`` accepted or refused: ``identity_for``). Also becomes
        ``self.capabilities`` (only when every probe answered; a failure raises and keeps
        the last). A transient sacct failure (slurmdbd down) keeps what the last
        Preflight found about accounting: it never turns accounting off."""
        warnings: list[str] = []
        out_dir = script.check_output_dir(self._settings.output_dir)
        probe = (f"D={script.shell_path(out_dir)}\n"
                 f"for c in {' '.join(REQUIRED_COMMANDS)}; do command -v \"$c\" >/dev/null"
                 " || echo \"missing $c\"; done\n"
                 'mkdir -p -- "$D" && P="$D/.dispatch-preflight.$$" && '
                 "printf 'probe\\n' >\"$P\" && rm -f -- \"$P\"\n")
        version_res, config_res, whoami_res, dir_res, sluid_res = await asyncio.gather(
            self._checked_run(["sinfo", "--version"], "sinfo --version"),
            self._checked_run(["scontrol", "show", "config"], "scontrol show config"),
            self._run(["squeue", "--me", "-h", "-o", "%i"]),
            self._runner.run_script(probe, timeout=self._timeout),
            # 24.11 and 22.05 refuse the field with a message on stderr, exit status 0
            self._run(["squeue", "--me", "-h", "-O", "JobID:|,SLUID:|"]))
        squeue_sluid = sluid_res.ok and "invalid" not in sluid_res.stderr.lower()
        version = parse_slurm_version(version_res.stdout)
        slurm_version = f"{version[0]}.{version[1]:02d}.{version[2]}"
        if not SUPPORTED_MIN <= version[:2] <= SUPPORTED_MAX:
            warnings.append(f"Slurm {slurm_version} is outside the supported 22.05 .. 26.05")
        config = parse_show_config(config_res.stdout)
        storage = _config_value(config, "AccountingStorageType") or ""
        flags = (_config_value(config, "AccountingStoreFlags") or "").split(",")
        accounting = False
        sacct_sluid = False
        if storage.endswith("slurmdbd"):
            since = utc_text(self._now() - 3600)
            probe_res = await self._run(["sacct", "-X", "-n", "-P", "-o", "JobIDRaw,SLUID",
                                         "-S", since])
            sacct_sluid = probe_res.ok
            if not probe_res.ok and "invalid field" in probe_res.stderr.lower():
                probe_res = await self._run(["sacct", "-X", "-n", "-P", "-o", "JobIDRaw",
                                             "-S", since])  # before 24.11: no SLUID
            accounting = probe_res.ok
            if not accounting:
                failure = slurm_failure(probe_res, operation="sacct")
                before = self.capabilities
                if isinstance(failure, TransientError):
                    # slurmdbd down for now: what the last Preflight found still holds
                    # (never turn accounting off on a transient failure)
                    accounting = before.accounting_history if before is not None else True
                    sacct_sluid = before.sacct_sluid if before is not None else False
                    warnings.append("sacct does not answer for now (kept accounting "
                                    f"{'on' if accounting else 'off'}): "
                                    f"{' '.join(probe_res.stderr.split())[:200]}")
                else:
                    warnings.append("sacct does not answer: jobs that leave squeue cannot "
                                    "be observed "
                                    f"({' '.join(probe_res.stderr.split())[:200]})")
        else:
            warnings.append(f"no accounting ({storage or 'none'}): a job that leaves squeue "
                            "after MinJobAge cannot be observed")
        job_comment = "job_comment" in [flag.strip() for flag in flags]
        if accounting and not job_comment:
            warnings.append("AccountingStoreFlags lacks job_comment: finished jobs read from "
                            "sacct have unknown submission and attempt")
        min_job_age = _config_int(config, "MinJobAge")
        if min_job_age is not None and min_job_age < 60 and not accounting:
            warnings.append(f"MinJobAge={min_job_age}s without accounting: ended jobs vanish "
                            "before a tick may see them")
        missing = tuple(line.split(" ", 1)[1] for line in dir_res.stdout.splitlines()
                        if line.startswith("missing "))
        if missing:
            warnings.append("missing on the Slurm host: " + ", ".join(missing))
        slurm_user = re.fullmatch(r".*\(([0-9]+)\)", _config_value(config, "SlurmUser") or "")
        requeue_text = _config_value(config, "JobRequeue")
        cluster_name = _config_value(config, "ClusterName")
        if cluster_name is not None and cluster_name != self.cluster:
            warnings.append(f"the cluster calls itself {cluster_name!r}, configured as "
                            f"{self.cluster!r}")
        if not whoami_res.ok:
            warnings.append("squeue --me fails: "
                            + " ".join(whoami_res.stderr.split())[:200])
        if not dir_res.ok:
            warnings.append(f"output.dir {out_dir} is not writable on the Slurm host: "
                            + " ".join(dir_res.stderr.split())[:200])
        capabilities = Capabilities(
            slurm_version=slurm_version,
            accounting_history=accounting,
            job_comment=job_comment,
            min_job_age=min_job_age,
            max_job_id=_config_int(config, "MaxJobId"),
            first_job_id=_config_int(config, "FirstJobId"),
            job_requeue=None if requeue_text is None else requeue_text.strip() == "1",
            max_batch_requeue=_config_int(config, "MaxBatchRequeue"),
            whoami=whoami_res.ok,
            output_dir_writable=dir_res.ok,
            cluster_name=cluster_name,
            warnings=tuple(warnings),
            slurm_user_uid=int(slurm_user.group(1)) if slurm_user else None,
            missing_commands=missing,
            identity=identity_for(version, squeue_sluid=squeue_sluid,
                                  sacct_sluid=sacct_sluid),
            squeue_sluid=squeue_sluid,
            sacct_sluid=sacct_sluid,
        )
        self.capabilities = capabilities
        return capabilities

    async def check_preflight(self) -> list[str]:
        """Preflight, then what the daemon needs and the cluster lacks
        (``preflight_problems``): the shape ``daemon.service`` calls at start and on
        gaining leadership. What it found is logged."""
        caps = await self.preflight()
        log.info("preflight: what the cluster supports", extra={"capabilities": asdict(caps)})
        return preflight_problems(caps)


def _squeue_format(columns: tuple[str, ...]) -> str:
    """The ``squeue -O`` argument of these columns (width 0, ``|`` after each)."""
    return ",".join(f"{column}:|" for column in columns)


def _ending(obs: ObjectObs, job: SlurmJob) -> bool:
    """Ended, or (after our scancel) COMPLETING: the text form prints a cancelled job
    that is still cleaning up as COMPLETING, hiding its CANCELLED base state."""
    return obs.state is State.ENDED or "COMPLETING" in job.flags
