"""SlurmJob: the one internal record the squeue and sacct text the reader reads is
normalised into before classification. Pure data."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class SlurmJob:
    """One Slurm job as read from squeue/scontrol (live) or sacct (accounting).

    Not frozen, only because a frozen dataclass's constructor sets each of its 24 fields
    through ``object.__setattr__``, a third of the parse of a 100k-job queue: treat it as
    immutable (nothing writes one after its parser made it).

    Times are epoch seconds, ``None`` when Slurm reports them unset (``0``, ``N/A``,
    ``Unknown``, ``None``). ``base_state`` is one of Slurm's base
    states as text (``PENDING``, ``RUNNING``, ... or anything unknown, kept
    raw); ``flags`` are the remaining state words (``COMPLETING``, ...).
    """

    job_id: int
    name: str
    user: str | None
    base_state: str
    flags: tuple[str, ...]
    reason: str  # state_reason; "" when None/absent
    description: str  # state_description
    comment: str | None  # None when absent or "(null)"
    submit_time: int | None
    eligible_time: int | None
    start_time: int | None
    end_time: int | None
    preempt_time: int | None
    restart_count: int | None  # None when the dialect does not carry it (sacct)
    nodes: tuple[str, ...]  # expanded host names
    return_code: int | None  # exit status when the job exited normally
    signal: int | None  # terminating signal, when killed by one
    time_limit_s: int | None
    requeue: bool | None
    cluster: str
    kill_request_user: str | None = None  # sacct: who cancelled it
    # sacct: the record says who asked for a cancel, so kill_request_user None means nobody
    # did (Slurm ended the job by itself, e.g. the flush after slurmctld lost its state)
    requester_recorded: bool = False
    state_text: str = ""  # the raw state as printed, for details
    sluid: str | None = None  # Slurm's unique job id, when the read asked for it
