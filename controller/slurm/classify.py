"""SlurmJob → ObjectObs: SPEC §4 as tables of rules, first match wins.

Pure. ``PENDING_RULES`` is §4.1 row by row; ``BASE_RULES`` holds §4.2's rows per base
state, with §4.3's sacct differences inside the predicates (they read ``accounting``).
The adapter never reports the controller-only causes (no-capacity, held, released,
duplicate, missing-output, stale): no rule names them.

Decisions beyond the SPEC's text:

* the text may print a flag instead of the base state (squeue's COMPLETING, sacct's
  REQUEUED); ``_UNREPORTED_BASE`` says which base Slurm sets that flag on (the hold and
  requeue flags only ever sit on PENDING jobs; COMPLETING, CONFIGURING and the other
  transitional flags are classified as running, still on their nodes, with the flag
  as the detail, until Slurm prints the real state);
* a live PREEMPTED job whose preempt_time is set and whose end time (the end of its
  grace period) is still ahead is running, not ended: that is what preempt_time "says
  otherwise", and reporting it ended would let the controller resubmit while it runs;
* FAILED with none of the SPEC's reasons is non-zero-exit (sacct keeps only the
  previous reason, usually None; SPEC §4.3 has it carry ExitCode, 0 included);
* a name that is not exactly ``dj-<ULID>`` is never ours: foreign, whatever its comment;
* ``requeued`` is Slurm's REQUEUED state flag (the requeue bit), live only;
* a pending job's start and end, and a live job's end before it ended, say nothing
  (they are Slurm's estimates) and are None; an end ahead of ``now`` is None too;
* a CANCELLED job that Slurm cancelled itself -- "Duplicate jobid" in its reason or
  description, a sacct record with no requester (slurmdbd's flush after slurmctld lost its
  state), or a requester that is root or the Slurm user (``slurm_uids``) -- is ended with
  cause ``lost`` (provenance slurm), never a user's cancel (issue 9).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Final, TypeVar, cast

from controller.errors import ProtocolError
from controller.model.obs import (
    Cause,
    CauseKind,
    ObjectObs,
    ObjectRef,
    Provenance,
    Source,
    State,
)
from controller.slurm.dialects import BASE_STATES, KNOWN_FLAGS
from controller.slurm.holds import decode_hold
from controller.slurm.naming import job_id_of_name, parse_comment
from controller.slurm.record import SlurmJob


@dataclass(frozen=True, slots=True)
class Facts:
    """What the rules read: the record plus what classify derived from it."""

    job: SlurmJob
    unreported: bool  # the dialect printed a flag in place of the base state
    accounting: bool  # read from sacct (SPEC §4.3)
    restart: int  # Slurm's restart count; 0 from sacct
    hold: int | None  # hold instance decoded from the begin/start time (pending, live)
    now: int | None
    slurm_uids: frozenset[int] = frozenset({0})  # root and SlurmUser: Slurm's own cancels


@dataclass(frozen=True, slots=True)
class Rule:
    """One table row: when ``when`` holds, the object is in ``state`` for ``cause``."""

    name: str
    when: Callable[[Facts], bool]
    state: State
    cause: CauseKind = CauseKind.NONE
    provenance: Provenance = Provenance.UNKNOWN
    detail: Callable[[Facts], str] = lambda facts: ""


def _always(facts: Facts) -> bool:
    return True


def _reason_is(*reasons: str) -> Callable[[Facts], bool]:
    wanted = frozenset(reasons)
    return lambda facts: facts.job.reason in wanted


# --------------------------------------------------------------------------------------
# SPEC §4.1: pending jobs, in order

UNRUNNABLE_REASONS: Final = frozenset({
    "DependencyNeverSatisfied", "BadConstraints", "PartitionConfig", "PartitionTimeLimit",
    "PartitionNodeLimit", "InvalidAccount", "InvalidQOS", "AccountNotAllowed",
    "QOSNotAllowed", "ReservationInvalid", "MaxMemPerLimit",
})
# The descriptions Slurm gives a batch job it requeued held because it could not launch it
# (slurm-reference §3: prolog/launch failure, and --get-user-env failure).
LAUNCH_FAILED_HELD: Final = ("launch failed requeued held",
                             "user env retrieval failed requeued held")
REQUEUED_HELD = "job requeued in held state"

PENDING_RULES: Final[tuple[Rule, ...]] = (
    Rule("gate", lambda f: f.job.reason == "JobHeldUser" and f.restart == 0,
         State.GATED),
    Rule("launch-failed-held",
         lambda f: (f.job.reason == "JobHoldMaxRequeue"
                    or f.job.description.startswith(LAUNCH_FAILED_HELD)),
         State.HELD, CauseKind.LAUNCH_FAILED, Provenance.SLURM,
         lambda f: f.job.description),
    Rule("requeued-held",
         lambda f: ((f.job.reason == "JobHeldUser" or f.job.description == REQUEUED_HELD)
                    and f.restart > 0),
         State.HELD, CauseKind.REQUEUED, Provenance.SLURM, lambda f: f.job.description),
    Rule("admin-hold", _reason_is("JobHeldAdmin"),
         State.HELD, CauseKind.ADMIN_HOLD, Provenance.ADMIN),
    # Slurm says None for ~2 s after a gate opens, before its next scheduling pass.
    Rule("dispatch-hold", lambda f: f.hold is not None and f.job.reason in ("BeginTime", ""),
         State.HELD, CauseKind.NONE, Provenance.DISPATCH),
    Rule("requeue-delay", lambda f: f.job.reason == "BeginTime" and f.restart > 0,
         State.PENDING, CauseKind.REQUEUED, Provenance.SLURM),
    Rule("unrunnable", lambda f: f.job.reason in UNRUNNABLE_REASONS,
         State.PENDING, CauseKind.UNRUNNABLE, Provenance.SLURM, lambda f: f.job.reason),
    Rule("requeued", lambda f: f.restart > 0,
         State.PENDING, CauseKind.REQUEUED, Provenance.SLURM),
    Rule("pending", _always, State.PENDING),
)

# --------------------------------------------------------------------------------------
# SPEC §4.2 (live) and §4.3 (sacct): the other base states


def _ended(kind: CauseKind) -> tuple[Rule, ...]:
    return (Rule(kind.value, _always, State.ENDED, kind, Provenance.SLURM),)


def _in_grace(f: Facts) -> bool:
    """Live PREEMPTED, preempt_time set, and its end (the grace deadline) still ahead."""
    job = f.job
    return (not f.accounting and job.preempt_time is not None and f.now is not None
            and job.end_time is not None and job.end_time > f.now)


def _cancelled_by_other(f: Facts) -> bool:
    requester = f.job.kill_request_user
    return (f.accounting and requester is not None and f.job.user is not None
            and requester != f.job.user)


# What marks a cancel Slurm made itself, in the reason or description (slurmctld's agent
# ends a batch job whose id a node already runs -- after a state loss -- with these).
SLURM_CANCEL_TEXTS: Final = ("Duplicate jobid",)

# A sacct CANCELLED record with no requester is slurmdbd's flush after slurmctld lost its
# state (as_mysql_flush_jobs_on_cluster sets the state and end time, no requester). A
# user's scancel records its requester ("CANCELLED by <uid>"), but one recorded capture
# (testdata/slurm/22.05/probe.when.txt) shows it missing 4 s after a scancel: so such a
# record is refused (not classifiable yet) until it is this old, then read as the flush.
REQUESTER_SETTLE_S: Final = 60


def _no_requester(job: SlurmJob) -> bool:
    return job.requester_recorded and job.kill_request_user is None


def _slurm_requester(f: Facts) -> bool:
    """The recorded requester is root or the Slurm user (and not the job's own user)."""
    requester = f.job.kill_request_user
    if requester is None or requester == f.job.user:
        return False
    return any(requester == f"uid={uid}" for uid in f.slurm_uids)


def _slurm_cancel_detail(f: Facts) -> str:
    """Why the cancel is Slurm's own ("" when it is not): see ``CANCEL_RULES``."""
    job = f.job
    for text in SLURM_CANCEL_TEXTS:
        for said in (job.description, job.reason):
            if text in said:
                return f"cancelled by Slurm: {said}"
    if f.accounting and _no_requester(job):
        return "cancelled by Slurm with no requester (the flush after slurmctld lost its state)"
    if _slurm_requester(f):
        return f"cancelled by {job.kill_request_user} (root or the Slurm user)"
    return ""


def _signal_detail(f: Facts) -> str:
    if f.job.signal is not None:
        return f"signal {f.job.signal}"
    return f.job.description or f.job.reason


BASE_RULES: Final[Mapping[str, tuple[Rule, ...]]] = {
    "PENDING": PENDING_RULES,
    "RUNNING": (
        Rule("base-not-reported", lambda f: f.unreported, State.RUNNING,
             detail=lambda f: f"{f.job.state_text}: base state not reported"),
        Rule("preempting", lambda f: f.job.preempt_time is not None, State.RUNNING,
             detail=lambda f: f"preempt_time={f.job.preempt_time}"),
        Rule("running", _always, State.RUNNING),
    ),
    "SUSPENDED": (Rule("suspended", _always, State.SUSPENDED),),
    "COMPLETED": _ended(CauseKind.COMPLETED),
    "FAILED": (
        Rule("exit-code", _reason_is("NonZeroExitCode"),
             State.ENDED, CauseKind.NON_ZERO_EXIT, Provenance.SLURM),
        Rule("signal", lambda f: f.job.reason == "RaisedSignal" or f.job.signal is not None,
             State.ENDED, CauseKind.SIGNALED, Provenance.SLURM, _signal_detail),
        # sacct prints no flags: there the reason alone decides (SPEC §4.3)
        Rule("launch-failed",
             lambda f: (f.job.reason == "JobLaunchFailure"
                        or (not f.accounting and "LAUNCH_FAILED" in f.job.flags)),
             State.ENDED, CauseKind.LAUNCH_FAILED, Provenance.SLURM,
             lambda f: f.job.description),
        Rule("failed", _always, State.ENDED, CauseKind.NON_ZERO_EXIT, Provenance.SLURM,
             lambda f: f.job.reason),
    ),
    "TIMEOUT": _ended(CauseKind.TIMEOUT),
    "OUT_OF_MEMORY": _ended(CauseKind.OUT_OF_MEMORY),
    "NODE_FAIL": _ended(CauseKind.NODE_LOST),
    "BOOT_FAIL": _ended(CauseKind.BOOT_FAILED),
    "PREEMPTED": (
        Rule("preempt-grace", _in_grace, State.RUNNING,
             detail=lambda f: f"preempted at {f.job.preempt_time}, ends by {f.job.end_time}"),
        Rule("preempted", _always, State.ENDED, CauseKind.PREEMPTED, Provenance.SLURM),
    ),
    "DEADLINE": _ended(CauseKind.DEADLINE),
    # A cancel that Slurm made itself is never a user's cancel (issue 9): the cluster lost
    # the job. uid 0 is taken for Slurm here: on the accounting record an administrator's
    # scancel as root looks the same, and resubmitting is the safer reading of both.
    "CANCELLED": (
        Rule("cancelled-by-slurm", lambda f: bool(_slurm_cancel_detail(f)),
             State.ENDED, CauseKind.LOST, Provenance.SLURM, _slurm_cancel_detail),
        Rule("cancelled-by-admin", _cancelled_by_other,
             State.ENDED, CauseKind.CANCELLED, Provenance.ADMIN,
             lambda f: f"cancelled by {f.job.kill_request_user}"),
        Rule("cancelled", _always, State.ENDED, CauseKind.CANCELLED, Provenance.USER),
    ),
}

# An unknown base state or flag, or (sacct) a state with no row: never guessed.
UNKNOWN_RULE: Final = Rule("unknown", _always, State.ENDED, CauseKind.UNKNOWN,
                           Provenance.UNKNOWN, lambda f: f.job.state_text)

# The base state Slurm sets under a flag that the text printed instead.
_UNREPORTED_BASE: Final[Mapping[str, str]] = {
    "REQUEUED": "PENDING", "REQUEUE_FED": "PENDING", "REQUEUE_HOLD": "PENDING",
    "SPECIAL_EXIT": "PENDING", "RESV_DEL_HOLD": "PENDING",
    "COMPLETING": "RUNNING", "STAGE_OUT": "RUNNING", "CONFIGURING": "RUNNING",
    "RESIZING": "RUNNING", "STOPPED": "RUNNING", "SIGNALING": "RUNNING",
}

# sacct cannot tell gated, held and pending apart: such rows are refused (SPEC §4.3).
SACCT_REFUSED_BASES: Final = frozenset({"PENDING", "RUNNING", "SUSPENDED"})
SACCT_REFUSED_FLAGS: Final = frozenset({"REQUEUED", "RESIZING"})

_NOT_STARTED: Final = frozenset({State.GATED, State.HELD, State.PENDING})

DEFAULT_SLURM_UIDS: Final = frozenset({0})

# what ``Share`` holds one copy of (never a bool: True == 1 would share as 1)
_Shared = TypeVar("_Shared", bound=Hashable)


class Share:
    """One copy of each equal value that the observations made with it have in common:
    node names and lists, reasons, time limits, times (the jobs of a burst were
    submitted in the same second, one scheduling pass starts many at once). Sharing
    immutable values changes no observation; it keeps a controller that holds 100k of
    them from holding 100k copies of each. One ``Share`` serves one read (a 100k-row
    squeue) and holds at most ``limit`` values: a queue whose values are all distinct
    costs a bounded dictionary, not one entry per value."""

    __slots__ = ("_room", "_values")

    def __init__(self, *, limit: int = 4096) -> None:
        self._values: dict[object, object] = {}
        self._room = limit

    def __call__(self, value: _Shared) -> _Shared:
        """``value``, or the equal one given before."""
        values = self._values
        shared = values.get(value)
        if shared is not None:
            return cast(_Shared, shared)
        if self._room > 0 and value is not None:
            self._room -= 1
            values[value] = value
        return value

    def nodes(self, nodes: tuple[str, ...]) -> tuple[str, ...]:
        """``nodes``, or the equal list given before; host names interned (a cluster has
        a few thousand: the lists of different reads share them too)."""
        shared = self._values.get(nodes)
        if shared is not None:
            return cast(tuple[str, ...], shared)
        return self(tuple(map(sys.intern, nodes)))


def classify(job: SlurmJob, *, source: Source | str = Source.LIVE,
             cluster: str | None = None, now: int | None = None,
             slurm_uids: frozenset[int] = DEFAULT_SLURM_UIDS,
             share: Share | None = None) -> ObjectObs:
    """The observation of ``job`` read from ``source`` (``live``: squeue/scontrol,
    ``accounting``: sacct) at ``now`` (epoch seconds; None when unknown). ``slurm_uids``
    are the uids whose cancels are Slurm's own (root, and the cluster's SlurmUser).
    ``share``: the observation takes the values equal to ones it was given before from
    it (the same observation, fewer objects).

    Raises ProtocolError for a sacct row that is still pending, running, suspended,
    requeued or resizing. ``ref`` is (cluster, name, id, submit time or 0).
    """
    src = source if isinstance(source, Source) else Source.decode(source)
    rule, facts = _decide(job, accounting=src is Source.ACCOUNTING, now=now,
                          slurm_uids=slurm_uids)
    accounting = facts.accounting
    submission, attempt, foreign = _identity(job, accounting=accounting)
    state = rule.state
    end = job.end_time if state is State.ENDED and not _ahead(job.end_time, now) else None
    start = None if state in _NOT_STARTED or _ahead(job.start_time, now) else job.start_time
    submit, eligible, nodes = job.submit_time, job.eligible_time, job.nodes
    reason, time_limit = job.reason or job.description, job.time_limit_s
    if share is not None:
        submit, start, end, nodes = share(submit), share(start), share(end), share.nodes(nodes)
        # (most jobs are eligible when submitted: the same number)
        eligible = submit if eligible == submit else share(eligible)
        reason, time_limit = share(reason), share(time_limit)
    return ObjectObs(
        ref=ObjectRef(cluster=job.cluster if cluster is None else cluster, uid=job.name,
                      id=job.job_id, submit=submit or 0, sluid=job.sluid),
        state=state,
        cause=_cause(rule, rule.detail(facts)),
        submission=submission,
        attempt=attempt,
        foreign=foreign,
        restart_count=None if accounting else job.restart_count,
        hold_instance=facts.hold if state in _NOT_STARTED else None,
        requeued=not accounting and "REQUEUED" in job.flags,
        exit_code=job.return_code if rule.cause is CauseKind.NON_ZERO_EXIT else None,
        nodes=nodes,
        reason=reason,
        submit=submit,
        start=start,
        end=end,
        source=src,
        observed_at=now or 0,
        time_limit_s=time_limit,
        eligible=eligible,
    )


_PLAIN_CAUSES: dict[tuple[CauseKind, Provenance], Cause] = {}  # detail-less, shared


def _cause(rule: Rule, detail: str) -> Cause:
    """The rule's cause; one shared object per rule when there is no detail (most
    observations), which a controller holding 100k of them notices."""
    if detail:
        return Cause(rule.cause, rule.provenance, detail)
    key = (rule.cause, rule.provenance)
    cause = _PLAIN_CAUSES.get(key)
    if cause is None:
        cause = _PLAIN_CAUSES[key] = Cause(rule.cause, rule.provenance, "")
    return cause


def matching_rule(job: SlurmJob, *, source: Source | str = Source.LIVE,
                  now: int | None = None,
                  slurm_uids: frozenset[int] = DEFAULT_SLURM_UIDS) -> Rule:
    """The table row ``classify`` applies to ``job`` (for tests and documentation)."""
    src = source if isinstance(source, Source) else Source.decode(source)
    return _decide(job, accounting=src is Source.ACCOUNTING, now=now,
                   slurm_uids=slurm_uids)[0]


def valid_until(job: SlurmJob, *, now: int, source: Source = Source.LIVE) -> int | None:
    """The first second from which ``classify(job, now=...)`` may differ from its answer at
    ``now``; None when it never will (for a cache of observations).

    The rules read the clock only by comparing the start and end times with ``now``
    (``_ahead``: Slurm's estimates say nothing; ``_in_grace``: a preemption grace ends;
    from sacct, a cancel's requester settles ``REQUESTER_SETTLE_S`` after the end), so an
    observation holds until the first of those that is still ahead.
    """
    moments = [job.start_time, job.end_time]
    if source is Source.ACCOUNTING and job.end_time is not None:
        moments.append(job.end_time + REQUESTER_SETTLE_S)
    ahead = [moment for moment in moments if moment is not None and moment > now]
    return min(ahead) if ahead else None


def _decide(job: SlurmJob, *, accounting: bool, now: int | None,
            slurm_uids: frozenset[int]) -> tuple[Rule, Facts]:
    flags = job.flags
    base = job.base_state or (_UNREPORTED_BASE.get(flags[0], "") if flags else "")
    if accounting and (base in SACCT_REFUSED_BASES or SACCT_REFUSED_FLAGS.intersection(flags)):
        raise ProtocolError(f"sacct row of job {job.job_id} is still {job.state_text!r}: "
                            "accounting cannot tell gated, held and pending apart")
    if (accounting and base == "CANCELLED" and _no_requester(job) and now is not None
            and job.end_time is not None and now < job.end_time + REQUESTER_SETTLE_S):
        raise ProtocolError(f"sacct row of job {job.job_id} is CANCELLED with no requester "
                            f"yet: read again {REQUESTER_SETTLE_S}s after its end")
    hold = None if accounting or base != "PENDING" else _hold_instance(job)
    facts = Facts(job=job, unreported=not job.base_state, accounting=accounting,
                  restart=0 if accounting else (job.restart_count or 0), hold=hold, now=now,
                  slurm_uids=slurm_uids)
    if base not in BASE_STATES or not KNOWN_FLAGS.issuperset(flags):
        return UNKNOWN_RULE, facts
    for rule in BASE_RULES[base]:
        if rule.when(facts):
            return rule, facts
    raise AssertionError(f"no rule for base state {base}")  # every table ends in _always


def _hold_instance(job: SlurmJob) -> int | None:
    """SPEC §5: prefer the begin (eligible) time, else the start time, decoded against
    the job's current submit time."""
    begin = job.eligible_time if job.eligible_time is not None else job.start_time
    if begin is None or job.submit_time is None:
        return None
    return decode_hold(begin, job.submit_time)


def _identity(job: SlurmJob, *, accounting: bool) -> tuple[int | None, int | None, bool]:
    """(submission, attempt, foreign). SPEC §2: a ``dj-<ULID>`` job whose comment does not
    parse is foreign; from sacct a missing comment (no job_comment) is unknown instead."""
    if job_id_of_name(job.name) is None:
        return None, None, True
    parsed = parse_comment(job.comment)
    if parsed is not None:
        return parsed[0], parsed[1], False
    if accounting and not job.comment:
        return None, None, False
    return None, None, True


def _ahead(moment: int | None, now: int | None) -> bool:
    return moment is not None and now is not None and moment > now
