"""A Grid Engine job as an ObjectObs: state letters, holds, ``failed`` and
``exit_status`` in ONE table each. Pure.

Live (qstat), the first row whose letters match wins (NOTES.md: states seen):

============================  ==========  ==========================================
letters                       state       cause
============================  ==========  ==========================================
``E`` (``Eqw``, ``Ehqw``)     held        launch-failed (scheduler): GE gave up
                                          starting it (unwritable output, exit 100,
                                          ...); it stays pending until ``qdel``/
                                          ``qmod -cj``, so the planner cancels it and
                                          the policy resubmits
``h`` + operator/system hold  held        admin-hold (admin)
``h`` + our user hold with    held        none (dispatch), hold_instance = the
``dispatch_hold=<h>``                     context's instance
``h`` + our user hold         gated       none (``qsub -h``: the gate)
``h``, no hold we can name    held        admin-hold (admin), detail says so
``d``                         the rest's  detail "deleting"
``r``, ``t``                  running     none; ``R``: requeued (rescheduled)
``s``, ``S``, ``T``           suspended   none
``q`` (``qw``, ``Rq``)          pending     none; ``R``: requeued
anything else                 ended       unknown (live: the planner never ends a job
                                          on it)
============================  ==========  ==========================================

A running job whose queue instance is ``u`` (execd unheard) keeps ``r`` in Grid
Engine; the observation stays running and names the host, and the cluster statistics
list the host as down (``Stale``, NodeDown).

Accounting (``failed``, then ``exit_status``; sge_status(5) and NOTES.md):

==================  ================================================================
failed              cause
==================  ================================================================
0                   completed when exit_status is 0, else non-zero-exit (exit code)
100                 signaled (exit_status 128+n: a signal, a ``qdel``, a node crash;
                    GE cannot tell them apart: a cancel is known only to the one who
                    made it, ``cancelled`` when this adapter made it)
17                  signaled
37                  timeout (qmaster enforced ``h_rt``/``h_cpu``/``h_vmem``: an
                    ``h_vmem`` kill cannot be told from a time limit)
18, 19, 21          node-lost (shepherd died, no exit status, unknown job)
24, 25              requeued (a rescheduled run; its record has no submission time
                    and is never picked)
1-11, 26-28, 30,    launch-failed (before the job ran: execd, shepherd, prolog,
38                  output file, shell, working directory, exit 100, groups)
12-15               unknown (the job ran; its PE stop or epilog failed)
other               unknown, detail "failed N"
==================  ================================================================
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from controller.gridengine import naming
from controller.gridengine.accounting import AccountingRecord
from controller.gridengine.qstat import JobDetail, ListedJob
from controller.model.obs import (
    Cause,
    CauseKind,
    ObjectObs,
    ObjectRef,
    Provenance,
    Source,
    State,
)

SCHEDULER: Final = Provenance.SLURM  # ("slurm": the scheduler's own doing, any kind)


@dataclass(frozen=True, slots=True)
class Holds:
    """Which kinds of hold the filtered lists found on a job."""

    user: bool = False
    operator: bool = False
    system: bool = False


_Rule = tuple[Callable[[str, Holds, int | None], bool], State, Cause]

_LIVE: Final[tuple[_Rule, ...]] = (
    (lambda s, h, i: "E" in s, State.HELD, Cause(CauseKind.LAUNCH_FAILED, SCHEDULER)),
    (lambda s, h, i: "h" in s and (h.operator or h.system), State.HELD,
     Cause(CauseKind.ADMIN_HOLD, Provenance.ADMIN)),
    (lambda s, h, i: "h" in s and h.user and i is not None, State.HELD,
     Cause(CauseKind.NONE, Provenance.DISPATCH)),
    (lambda s, h, i: "h" in s and h.user, State.GATED, Cause()),
    (lambda s, h, i: "h" in s, State.HELD,
     Cause(CauseKind.ADMIN_HOLD, Provenance.ADMIN, "a hold that is not a user, operator "
                                                   "or system hold")),
    (lambda s, h, i: "r" in s or "t" in s, State.RUNNING, Cause()),
    (lambda s, h, i: any(c in s for c in "sST"), State.SUSPENDED, Cause()),
    (lambda s, h, i: "q" in s, State.PENDING, Cause()),
)

# (failed codes, cause kind) -- ``failed`` 0 is decided by exit_status
_FAILED: Final[tuple[tuple[frozenset[int], CauseKind], ...]] = (
    (frozenset({100, 17}), CauseKind.SIGNALED),
    (frozenset({37}), CauseKind.TIMEOUT),
    (frozenset({18, 19, 21}), CauseKind.NODE_LOST),
    (frozenset({24, 25}), CauseKind.REQUEUED),
    (frozenset({*range(1, 12), 26, 27, 28, 30, 38}), CauseKind.LAUNCH_FAILED),
)
FAILED_TEXT: Final = {
    1: "before the job ran (assumedly before job)", 17: "killed by a signal (or qdel)",
    18: "the shepherd died", 19: "no exit status: the program or the machine crashed",
    21: "qmaster asked about an unknown job", 25: "rescheduled", 26: "cannot open the "
    "output file", 27: "shell not found", 28: "cannot change to the working directory",
    30: "exit 100: Grid Engine's error state", 37: "qmaster enforced h_rt, h_cpu or h_vmem",
    100: "assumedly after job: a signal, a qdel or a node crash",
}


def live_state(letters: str, holds: Holds, hold_instance: int | None) -> tuple[State, Cause]:
    """The live table (module docstring)."""
    for matches, state, found in _LIVE:
        if not matches(letters, holds, hold_instance):
            continue
        if "R" in letters and state is State.PENDING:
            return state, Cause(CauseKind.REQUEUED, SCHEDULER, "rescheduled")
        notes = [word for flag, word in (("R", "rescheduled"), ("d", "deleting"))
                 if flag in letters and state is not State.HELD]
        if notes and not found.detail:
            return state, Cause(found.kind, found.provenance, ", ".join(notes))
        return state, found
    return State.ENDED, Cause(CauseKind.UNKNOWN, Provenance.UNKNOWN, letters)


def ended_cause(failed: int, exit_status: int) -> tuple[Cause, int | None]:
    """The accounting table: the cause and, with non-zero-exit, the exit code."""
    text = FAILED_TEXT.get(failed, "")
    if failed == 0:
        if exit_status == 0:
            return Cause(CauseKind.COMPLETED, Provenance.USER), None
        return Cause(CauseKind.NON_ZERO_EXIT, Provenance.USER), exit_status
    for codes, kind in _FAILED:
        if failed in codes:
            detail = f"failed {failed}: {text}" if text else f"failed {failed}"
            if kind is CauseKind.SIGNALED:
                detail += f"; exit_status {exit_status}"
            return Cause(kind, SCHEDULER, detail), None
    return Cause(CauseKind.UNKNOWN, Provenance.UNKNOWN, f"failed {failed}"), None


def observe_live(job: ListedJob, detail: JobDetail, *, cluster: str, holds: Holds,
                 now: int) -> ObjectObs:
    """One of our jobs in qstat (``job`` from the list, ``detail`` from ``qstat -j``)."""
    parsed = naming.parse_account(detail.account)
    instance = naming.parse_hold_instance(detail.context_value(naming.HOLD_CONTEXT))
    state, cause = live_state(job.state, holds, instance if holds.user else None)
    if state is State.HELD and cause.kind is CauseKind.LAUNCH_FAILED and detail.messages:
        cause = Cause(cause.kind, cause.provenance, detail.messages[-1][:300])
    running = state in (State.RUNNING, State.SUSPENDED)
    start = (detail.start or job.time) if running else None
    return ObjectObs(
        ref=ObjectRef(cluster, job.name, job.number, detail.submit),
        state=state, cause=cause,
        submission=parsed[0] if parsed else None,
        attempt=parsed[1] if parsed else None,
        foreign=parsed is None,
        restart_count=1 if "R" in job.state else 0,
        hold_instance=instance if state is State.HELD and cause.kind is CauseKind.NONE
        else None,
        requeued="R" in job.state, exit_code=None,
        nodes=(job.host,) if job.host else (),
        reason=job.state, submit=detail.submit, start=start, end=None,
        source=Source.LIVE, observed_at=now, time_limit_s=detail.h_rt)


def observe_record(record: AccountingRecord, *, cluster: str, now: int,
                   cancelled: bool = False) -> ObjectObs:
    """One of our jobs from its accounting record (it has ended). ``cancelled``: this
    adapter deleted it (GE records a qdel like any signal)."""
    cause, exit_code = ended_cause(record.failed, record.exit_status)
    if cancelled and cause.kind is CauseKind.SIGNALED:
        cause, exit_code = Cause(CauseKind.CANCELLED, Provenance.DISPATCH, cause.detail), None
    parsed = naming.parse_account(record.account)
    return ObjectObs(
        ref=ObjectRef(cluster, record.name, record.number, record.submit),
        state=State.ENDED, cause=cause,
        submission=parsed[0] if parsed else None,
        attempt=parsed[1] if parsed else None,
        foreign=parsed is None, restart_count=None, hold_instance=None,
        requeued=False, exit_code=exit_code,
        nodes=(record.host,) if record.host and record.host != "UNKNOWN" else (),
        reason=f"failed {record.failed} exit_status {record.exit_status}",
        submit=record.submit, start=record.start or None, end=record.end or None,
        source=Source.ACCOUNTING, observed_at=now)
