"""Error mapping: the one place that reads Slurm's messages. ``slurm_failure`` turns a
failed command's exit status and text into the ``controller.errors`` exception that
means it (transient, back-pressure, not found, conflict, unsupported, invalid), from
one table of patterns (first match wins); nothing else matches Slurm's text.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable
from typing import Final

from controller.errors import (
    CommandFailed,
    DispatchError,
    ErrBackPressure,
    ErrConflict,
    ErrInvalid,
    ErrNotFound,
    ErrUnsupported,
    TransientError,
)
from controller.runner.base import CommandResult


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
#
# slurmctld's RPC rate limit (SlurmctldParameters=rl_enable, 23.02+) answers a limited
# RPC with SLURMCTLD_COMMUNICATIONS_BACKOFF, "Rate limit exceeded, please retry
# momentarily"; libslurm sleeps (1 s, then 2 s, ... per refusal) and sends it again, so
# the command only takes longer and prints nothing. Its sibling
# SLURMCTLD_COMMUNICATIONS_HARD_DROP, "Rate limit exceeded, please retry later" (a full
# RPC queue, ``enable_rpc_queue``), is not retried and reaches stderr. Either is
# back-pressure: the RPC was refused before it was processed (nothing was created or
# changed), the command may be run again after a pause.
RATE_LIMIT_RETRY_S: Final = 2.0
_FAILURES: Final[tuple[tuple[re.Pattern[str], _Kind], ...]] = tuple(
    (re.compile(pattern), kind) for pattern, kind in (
        (r"Unable to contact slurm controller", _Kind.TRANSIENT),
        (r"Rate limit exceeded, please retry", _Kind.RATE_LIMITED),
        (r"\b(?:Assoc|QOS)\w*SubmitJobs?\w*Limit\b", _Kind.BACK_PRESSURE),
        (r"\b(?:Assoc|QOS)\w*(?:PerJob|PerNode|WallDuration|Min\w+)\w*Limit\b", _Kind.INVALID),
        (r"Job violates accounting/QOS policy \(job submit limit", _Kind.BACK_PRESSURE),
        (r"Slurm job queue full", _Kind.BACK_PRESSURE),
        # sbatch to a partition an administrator drained or made inactive: not now, on this
        # cluster (a job that accepts another cluster moves there; else it waits)
        (r"Required partition not available", _Kind.BACK_PRESSURE),
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


# What each kind of failure raises.
_ERROR_OF: Final[dict[_Kind, Callable[[str], DispatchError]]] = {
    _Kind.BACK_PRESSURE: ErrBackPressure,
    _Kind.RATE_LIMITED: lambda message: ErrBackPressure(message,
                                                        retry_after=RATE_LIMIT_RETRY_S),
    _Kind.TRANSIENT: TransientError,
    _Kind.NOT_FOUND: ErrNotFound,
    _Kind.CONFLICT: ErrConflict,
    _Kind.UNSUPPORTED: ErrUnsupported,
    _Kind.INVALID: ErrInvalid,
}


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
            return _ERROR_OF[kind](message)
    return CommandFailed(message, argv=result.argv, returncode=result.returncode,
                         stderr=result.stderr)
