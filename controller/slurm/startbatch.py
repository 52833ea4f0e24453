"""Start: submissions batched into shared shell calls, and rediscovery when an outcome
is unknown.

Each Start script (``script.render_start_script``, unchanged) runs as a shell function
in its own subshell, and the same runner call reads the new job back; Starts issued
together share one call (``batch_script``): one round trip, one process spawn, one
read-back squeue for many submissions, each keeping its own exit status and messages
(``parse_batch_output``). ``Starts`` (a part of ``SlurmAdapter``) queues the scripts,
cuts the queue into calls (``_kick``, ``_flush``) and turns each outcome into a ref. An
outcome that is not known (the call failed, timed out, the shell died before the script
reported) is resolved by rediscovery by name and submission, never by submitting again.
"""

from __future__ import annotations

import asyncio
import logging
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from controller.errors import DispatchError, ErrBackPressure, ProtocolError, TransientError
from controller.model.obs import ObjectRef, StartRequest
from controller.runner.base import CommandResult
from controller.slurm import dialects, naming, script
from controller.slurm.base import PER_JOB_RPC_S
from controller.slurm.dialects import squeue_format
from controller.slurm.failures import slurm_failure
from controller.slurm.reads import Reads, our_rows
from controller.slurm.record import SlurmJob

log = logging.getLogger(__name__)

REDISCOVERY_WINDOW_S: Final = 900  # sacct -S before the Start began
# Bytes of Start scripts in one shared shell call (``batch_script``). The 90 KiB limit
# (script.MAX_SCRIPT_BYTES) is per script; a batch is cut into calls of at most this many
# bytes (a single script always goes, alone if need be). The script reaches ``sh -s`` on
# stdin, never argv, so ARG_MAX (~2 MiB) does not apply; 1 MiB stays under asyncssh's
# default 2 MiB channel window, so a call is written without waiting for window updates,
# and bounds what one lost connection leaves unknown.
START_BATCH_BYTES: Final = 1024 * 1024

_PARSABLE = re.compile(r"([0-9]+)(?:;(\S+))?")
_MARK = "@@dispatch-start"
_READBACK = "@@dispatch-readback"
_MARK_LINE = re.compile(rf"{_MARK} ([0-9]+) ([0-9]+)")


@dataclass(frozen=True, slots=True)
class _Queued:
    text: str
    future: asyncio.Future[_Outcome]
    size: int  # bytes of ``text``
    dirs: tuple[str, ...]  # shell words of the directories it makes (script.start_dirs)


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
                 squeue_format: str = dialects.SQUEUE_TEXT_FORMAT,
                 dirs: Sequence[str] = ()) -> str:
    """One sh script that runs each Start script unchanged as a function in its own
    subshell, one after another, then reads every new job back with one squeue.

    ``dirs`` (shell words, ``script.start_dirs`` of each script) are made first by one
    ``mkdir -p``, so no script starts a ``mkdir`` of its own (it makes its directories
    only when they are missing); when that ``mkdir`` fails, each script whose
    directories are missing tries again and reports its own error.

    Protocol (stdout): per script ``@@dispatch-start <i> <exit status>`` and its stdout
    (sbatch's ``<id>[;cluster]``); then ``@@dispatch-readback`` and the squeue rows.
    stderr carries ``@@dispatch-start <i>`` before each script's own messages.
    """
    parts = ["# dispatch Start batch: each submission's own script, in its own subshell\n"]
    if dirs:
        parts.append(f"mkdir -p -- {' '.join(dict.fromkeys(dirs))} 2>/dev/null || :\n")
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
        number = line[len(_MARK) + 1:]
        if line.startswith(_MARK + " ") and number.isascii() and number.isdigit():
            err_current = stderr.setdefault(int(number), [])
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



def parse_parsable(stdout: str) -> int | None:
    """The job id of ``sbatch --parsable`` output (``<id>[;<cluster>]``), or None."""
    lines = [line.strip() for line in stdout.splitlines() if line.strip()]
    if not lines:
        return None
    match = _PARSABLE.fullmatch(lines[-1])
    return int(match.group(1)) if match else None


class Starts(Reads):
    """Start of one cluster, batched (module docstring)."""

    _start_batch: int
    _start_parallel: int
    _start_batch_bytes: int
    _queued: list[_Queued]
    _flushing: int
    _kick_scheduled: bool
    _flushes: set[asyncio.Task[None]]

    def _init_starts(self, *, start_batch: int, start_parallel: int,
                     start_batch_bytes: int) -> None:
        self._start_batch = start_batch
        self._start_parallel = start_parallel
        self._start_batch_bytes = start_batch_bytes
        self._queued = []
        self._flushing = 0
        self._kick_scheduled = False
        self._flushes = set()

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
        outcome = await self._submit(text, script.start_dirs(request, self._settings))
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

    async def _submit(self, text: str, dirs: tuple[str, ...]) -> _Outcome:
        """Run one Start script in the next shared runner call; its own outcome."""
        future: asyncio.Future[_Outcome] = asyncio.get_running_loop().create_future()
        self._queued.append(_Queued(text, future, len(text.encode()), dirs))
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
            text = batch_script([item.text for item in batch], squeue_format(columns),
                                [d for item in batch for d in item.dirs])
            timeout = self._timeout + PER_JOB_RPC_S * (len(batch) - 1)
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
