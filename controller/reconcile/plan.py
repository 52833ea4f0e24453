"""The pure planner: (desired, status, observed, now) -> new status + actions.

No I/O, no awaits, no sessions. The tick (``controller.reconcile.tick``) loads
``JobState`` rows, gathers observations with one batched read, calls ``plan`` per job
and applies the result. Every decision is recomputed from desired + observed state
(level-triggered); the stored status is only memory of what the controller did
(submission numbers allocated, budgets spent, the ref it recorded).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from controller.model.obs import (
    Cause,
    CauseKind,
    ObjectObs,
    ObjectRef,
    Provenance,
    Source,
    State,
)
from controller.model.spec import JobSpec
from controller.reconcile.policy import DEFAULT_POLICY, OnExhausted, RecoveryPolicy, decide


class Desired(enum.Enum):
    RUN = "run"
    HELD = "held"
    STOPPED = "stopped"


class Phase(enum.Enum):
    PENDING = "pending"
    RUNNING = "running"
    HELD = "held"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    REJECTED = "rejected"


TERMINAL_PHASES = frozenset({Phase.SUCCEEDED, Phase.FAILED, Phase.CANCELLED, Phase.REJECTED})

# The phase a live object state shows, before desired state and causes are considered.
PHASE_OF_STATE: Mapping[State, Phase] = {
    State.GATED: Phase.PENDING,
    State.HELD: Phase.HELD,
    State.PENDING: Phase.PENDING,
    State.RUNNING: Phase.RUNNING,
    State.SUSPENDED: Phase.RUNNING,
}


@dataclass(frozen=True, slots=True)
class Condition:
    """A Kubernetes-style condition; ``since`` moves only when ``status`` flips."""

    type: str
    status: bool
    reason: str
    message: str
    since: int
    observed_generation: int


@dataclass(frozen=True, slots=True)
class Current:
    """The submission the controller considers current. ``ref`` is None for an intent
    written before sbatch ran, until the object is adopted."""

    submission: int
    attempt: int
    created_at: int
    ref: ObjectRef | None = None


@dataclass(frozen=True, slots=True)
class JobState:
    """One job: the client's desired record plus the controller's status memory."""

    job_id: str
    generation: int
    desired: Desired
    spec: JobSpec | None
    policy: RecoveryPolicy = DEFAULT_POLICY
    phase: Phase = Phase.PENDING
    submission: int = 0  # last submission number allocated
    attempt: int = 0
    current: Current | None = None
    object_state: State | None = None
    cause: Cause = field(default_factory=Cause)
    exit_code: int | None = None
    reason: str = ""
    nodes: tuple[str, ...] = ()
    budgets_used: Mapping[str, int] = field(default_factory=dict)
    excluded_nodes: Mapping[str, int] = field(default_factory=dict)  # node -> until
    not_before: int | None = None
    unknown_since: int | None = None
    hold_instance: int = 0
    started_at: int | None = None
    ended_at: int | None = None
    observed_generation: int = 0
    conditions: tuple[Condition, ...] = ()
    outputs_verified: bool = False


@dataclass(frozen=True, slots=True)
class Observed:
    """What the tick's batched reads saw of one job."""

    live: tuple[ObjectObs, ...] = ()  # every squeue object named dj-<this job>
    accounting: ObjectObs | None = None  # the current ref, from sacct, once it left squeue
    accounting_ok: bool = True  # False when sacct failed or is not available


@dataclass(frozen=True, slots=True)
class PlanContext:
    now: int
    unknown_grace_s: int = 600
    adopt_window_s: int = 180  # how long an intent may wait for its object to show up
    down_nodes: frozenset[str] = frozenset()


# ---------------------------------------------------------------- actions


@dataclass(frozen=True, slots=True)
class Submit:
    job_id: str
    submission: int
    attempt: int
    spec: JobSpec
    exclude: tuple[str, ...]
    release: bool  # release the gate at once (desired run)


@dataclass(frozen=True, slots=True)
class Release:
    job_id: str
    ref: ObjectRef


@dataclass(frozen=True, slots=True)
class Hold:
    job_id: str
    ref: ObjectRef
    instance: int


@dataclass(frozen=True, slots=True)
class Cancel:
    job_id: str
    ref: ObjectRef
    cause: CauseKind  # duplicate, or cancelled (desired stopped)


@dataclass(frozen=True, slots=True)
class VerifyOutputs:
    job_id: str
    paths: tuple[str, ...]


Action = Submit | Release | Hold | Cancel | VerifyOutputs


@dataclass(frozen=True, slots=True)
class SubmissionUpdate:
    """Record what was observed (or decided) of one submission row."""

    job_id: str
    submission: int
    status: str  # submitted | ended | abandoned | duplicate
    obs: ObjectObs | None = None


@dataclass(frozen=True, slots=True)
class PlannedEvent:
    job_id: str
    kind: str
    message: str


@dataclass(frozen=True, slots=True)
class Plan:
    status: JobState
    actions: tuple[Action, ...] = ()
    submissions: tuple[SubmissionUpdate, ...] = ()
    events: tuple[PlannedEvent, ...] = ()


# ---------------------------------------------------------------- helpers


def same_object(ref: ObjectRef, obs: ObjectObs) -> bool:
    """The identity check of SPEC §2, against an observation."""
    if obs.ref.id != ref.id or obs.ref.uid != ref.uid:
        return False
    submit = obs.submit if obs.submit is not None else obs.ref.submit
    if submit == ref.submit:
        return True
    return (obs.restart_count or 0) > 0 and submit >= ref.submit


def set_condition(conditions: Sequence[Condition], *, type_: str, status: bool, reason: str,
                  message: str, now: int, generation: int) -> tuple[Condition, ...]:
    """Replace condition ``type_``; keep ``since`` unless the status flips."""
    out: list[Condition] = []
    found = False
    for cond in conditions:
        if cond.type == type_:
            found = True
            since = cond.since if cond.status == status else now
            out.append(Condition(type_, status, reason, message, since, generation))
        else:
            out.append(cond)
    if not found:
        out.append(Condition(type_, status, reason, message, now, generation))
    return tuple(out)


def _drop_condition(conditions: Sequence[Condition], type_: str) -> tuple[Condition, ...]:
    return tuple(c for c in conditions if c.type != type_)


def _adjusted_spec(spec: JobSpec, time_factor: float, memory_factor: float) -> JobSpec:
    res = spec.resources
    if time_factor != 1.0 and res.time_limit_s:
        res = replace(res, time_limit_s=int(res.time_limit_s * time_factor))
    if memory_factor != 1.0 and res.memory_mb:
        res = replace(res, memory_mb=int(res.memory_mb * memory_factor))
    return replace(spec, resources=res)


class _Builder:
    """Accumulates one job's plan."""

    def __init__(self, job: JobState, ctx: PlanContext) -> None:
        self.job = job
        self.ctx = ctx
        self.actions: list[Action] = []
        self.submissions: list[SubmissionUpdate] = []
        self.events: list[PlannedEvent] = []

    def event(self, kind: str, message: str) -> None:
        self.events.append(PlannedEvent(self.job.job_id, kind, message))

    def update(self, **changes: object) -> None:
        self.job = replace(self.job, **changes)  # type: ignore[arg-type]

    def condition(self, type_: str, status: bool, reason: str, message: str = "") -> None:
        self.update(conditions=set_condition(
            self.job.conditions, type_=type_, status=status, reason=reason, message=message,
            now=self.ctx.now, generation=self.job.generation))

    def build(self) -> Plan:
        return Plan(self.job, tuple(self.actions), tuple(self.submissions), tuple(self.events))


# ---------------------------------------------------------------- the planner


def plan(job: JobState, observed: Observed, ctx: PlanContext) -> Plan:
    """Compute the next status and the actions for one job. Pure."""
    b = _Builder(job, ctx)
    if job.spec is None or job.phase == Phase.REJECTED:
        b.update(phase=Phase.REJECTED)
        return b.build()

    ours = [o for o in observed.live if not o.foreign]
    foreign = [o for o in observed.live if o.foreign]
    if foreign:
        b.condition("ForeignObjects", True, "NameCollision",
                    f"{len(foreign)} Slurm job(s) carry this job's name but not our comment; "
                    "never touched: " + ",".join(str(o.ref.id) for o in foreign))
    elif any(c.type == "ForeignObjects" for c in job.conditions):
        b.update(conditions=_drop_condition(b.job.conditions, "ForeignObjects"))

    seen = [o.submission for o in ours if o.submission is not None]
    if seen and max(seen) > b.job.submission:
        b.update(submission=max(seen))

    _adopt(b, ours)
    current_obs = _current_observation(b, ours, observed)
    _cancel_duplicates(b, ours)

    if b.job.current is not None and b.job.current.ref is not None:
        _follow_current(b, current_obs, observed)
    elif b.job.current is None:
        _maybe_submit(b)
    b.update(observed_generation=b.job.generation)
    return b.build()


def _adopt(b: _Builder, ours: Sequence[ObjectObs]) -> None:
    """Attach the Slurm object of an intent, or adopt a live object when none is current."""
    job, now = b.job, b.ctx.now
    if job.current is not None and job.current.ref is None:
        matches = [o for o in ours if o.submission == job.current.submission]
        if matches:
            obs = min(matches, key=lambda o: o.ref.id)
            b.update(current=replace(job.current, ref=obs.ref))
            b.submissions.append(SubmissionUpdate(job.job_id, job.current.submission,
                                                  "submitted", obs))
            b.event("Adopted", f"adopted Slurm job {obs.ref.id} for submission "
                               f"{job.current.submission}")
        elif now - job.current.created_at > b.ctx.adopt_window_s:
            b.submissions.append(SubmissionUpdate(job.job_id, job.current.submission,
                                                  "abandoned"))
            b.event("Abandoned", f"submission {job.current.submission} never reached Slurm")
            b.update(current=None)
        return
    if job.current is None and job.phase not in TERMINAL_PHASES:
        live = [o for o in ours if o.state != State.ENDED and o.submission is not None]
        if live:
            obs = max(live, key=lambda o: (o.submission or 0, o.ref.id))
            assert obs.submission is not None
            b.update(current=Current(obs.submission, obs.attempt or 0, now, obs.ref),
                     attempt=max(job.attempt, obs.attempt or 0))
            b.submissions.append(SubmissionUpdate(job.job_id, obs.submission, "submitted", obs))
            b.event("Adopted", f"adopted live Slurm job {obs.ref.id} (submission "
                               f"{obs.submission}) before submitting again")


def _current_observation(b: _Builder, ours: Sequence[ObjectObs],
                         observed: Observed) -> ObjectObs | None:
    cur = b.job.current
    if cur is None or cur.ref is None:
        return None
    ref = cur.ref
    for obs in ours:
        if same_object(ref, obs):
            return obs
    if observed.accounting is not None and same_object(ref, observed.accounting):
        return observed.accounting
    return None


def _is_current(job: JobState, obs: ObjectObs) -> bool:
    cur = job.current
    if cur is None:
        return False
    if cur.ref is None:
        return obs.submission == cur.submission
    return same_object(cur.ref, obs)


def _cancel_duplicates(b: _Builder, ours: Sequence[ObjectObs]) -> None:
    for obs in ours:
        if obs.state == State.ENDED or _is_current(b.job, obs):
            continue
        b.actions.append(Cancel(b.job.job_id, obs.ref, CauseKind.DUPLICATE))
        if obs.submission is not None:
            b.submissions.append(SubmissionUpdate(b.job.job_id, obs.submission, "duplicate",
                                                  obs))
        b.event("Duplicate", f"cancelling extra Slurm job {obs.ref.id} "
                             f"(submission {obs.submission})")


def _follow_current(b: _Builder, obs: ObjectObs | None, observed: Observed) -> None:
    job = b.job
    assert job.current is not None and job.current.ref is not None
    ref = job.current.ref
    if obs is None:
        _unknown(b, observed)
        return
    if job.unknown_since is not None:
        b.update(unknown_since=None)
    b.condition("Observed", True, "Seen", f"seen in {obs.source.value}")
    if (obs.state, obs.cause.kind, obs.nodes or job.nodes) != (
            job.object_state, job.cause.kind, job.nodes) or job.unknown_since is not None:
        # record the submission row only when what was seen changed (no per-tick writes)
        b.submissions.append(SubmissionUpdate(
            job.job_id, job.current.submission,
            "ended" if obs.state == State.ENDED else "submitted", obs))
    b.update(object_state=obs.state, reason=obs.reason,
             nodes=obs.nodes or job.nodes, started_at=obs.start or job.started_at)
    if obs.state == State.ENDED and obs.cause.kind == CauseKind.UNKNOWN \
            and obs.source == Source.LIVE:
        # a state word we do not know, while slurmctld still holds the job: it may well be
        # running. Never finish (or resubmit) on it; the final record will say.
        b.condition("Observed", False, "UnknownState",
                    f"Slurm reports a state we do not know: {obs.cause.detail}")
        return
    if obs.state == State.ENDED:
        _ended(b, obs)
        return
    if job.phase in TERMINAL_PHASES and job.phase != Phase.REJECTED:
        # a finished job whose object came back (requeue by someone else): follow it
        b.event("Reopened", f"Slurm job {ref.id} is {obs.state.value} again")
    b.update(cause=obs.cause, phase=PHASE_OF_STATE[obs.state], ended_at=None)
    _stale(b, obs)
    desired = job.desired
    if desired == Desired.STOPPED:
        b.actions.append(Cancel(job.job_id, ref, CauseKind.CANCELLED))
        return
    if desired == Desired.HELD:
        if obs.state == State.GATED or (obs.state == State.HELD
                                        and obs.hold_instance is not None):
            b.update(phase=Phase.HELD)
        elif obs.state == State.PENDING:
            instance = job.hold_instance + 1
            b.update(hold_instance=instance, phase=Phase.HELD)
            b.actions.append(Hold(job.job_id, ref, instance))
        elif obs.state in (State.RUNNING, State.SUSPENDED):
            b.condition("HoldIneffective", True, "AlreadyRunning",
                        "a running Slurm job cannot be held; cancel it to stop it")
        return
    if any(c.type == "HoldIneffective" for c in b.job.conditions):
        b.update(conditions=_drop_condition(b.job.conditions, "HoldIneffective"))
    # desired run: open our gate or our hold; never a hold that is not ours
    if obs.state == State.GATED or (obs.state == State.HELD and obs.hold_instance is not None
                                    and obs.cause.kind == CauseKind.NONE):
        b.actions.append(Release(job.job_id, ref))
        b.update(phase=Phase.PENDING)
        if job.phase == Phase.HELD:
            b.event("Released", f"released Slurm job {ref.id}")
    elif obs.state == State.HELD and obs.cause.kind == CauseKind.LAUNCH_FAILED:
        # Slurm gave up launching it and holds it: this object is over; the policy decides.
        b.actions.append(Cancel(job.job_id, ref, CauseKind.LAUNCH_FAILED))
        _finish_object(b, obs.cause, exit_code=None, nodes=obs.nodes)


def _stale(b: _Builder, obs: ObjectObs) -> None:
    job, now = b.job, b.ctx.now
    stale_reason = ""
    if obs.state == State.RUNNING:
        if obs.nodes and b.ctx.down_nodes.intersection(obs.nodes):
            stale_reason = "NodeDown"
        elif obs.start is not None and obs.time_limit_s is not None and (
                now > obs.start + obs.time_limit_s + job.policy.stale_grace_s):
            stale_reason = "PastTimeLimit"
    if stale_reason:
        b.condition("Stale", True, stale_reason,
                    "Slurm reports the job running, but " + (
                        "its node is down" if stale_reason == "NodeDown"
                        else "it is past its time limit plus grace"))
    elif any(c.type == "Stale" and c.status for c in job.conditions):
        b.condition("Stale", False, "Healthy", "")


def _unknown(b: _Builder, observed: Observed) -> None:
    job, ctx = b.job, b.ctx
    since = job.unknown_since if job.unknown_since is not None else ctx.now
    b.update(unknown_since=since)
    why = ("left the queue and accounting did not answer" if not observed.accounting_ok
           else "absent from squeue and sacct")
    b.condition("Observed", False, "Unknown", why)
    grace = job.policy.unknown_grace_s if job.policy.unknown_grace_s is not None \
        else ctx.unknown_grace_s
    if ctx.now - since < grace:
        return
    assert job.current is not None and job.current.ref is not None
    b.event("Unknown", f"Slurm job {job.current.ref.id} unseen for {ctx.now - since}s: "
                       "ended, cause unknown")
    b.submissions.append(SubmissionUpdate(job.job_id, job.current.submission, "ended"))
    _finish_object(b, Cause(CauseKind.UNKNOWN, Provenance.UNKNOWN, why), exit_code=None,
                   nodes=job.nodes)


def _ended(b: _Builder, obs: ObjectObs) -> None:
    job = b.job
    b.update(ended_at=obs.end, exit_code=obs.exit_code)
    if obs.cause.kind == CauseKind.COMPLETED and job.policy.expected_outputs \
            and not job.outputs_verified:
        b.actions.append(VerifyOutputs(job.job_id, job.policy.expected_outputs))
        b.update(cause=obs.cause, phase=Phase.RUNNING)
        return
    _finish_object(b, obs.cause, exit_code=obs.exit_code, nodes=obs.nodes)


def finish_missing_output(job: JobState, missing: Sequence[str], now: int) -> Plan:
    """The tick verified outputs after a completed object: some were missing."""
    b = _Builder(job, PlanContext(now=now))
    b.event("MissingOutput", "expected output missing: " + ", ".join(missing))
    _finish_object(b, Cause(CauseKind.MISSING_OUTPUT, Provenance.DISPATCH,
                            ", ".join(missing)), exit_code=None, nodes=job.nodes)
    return b.build()


def _finish_object(b: _Builder, cause: Cause, *, exit_code: int | None,
                   nodes: Sequence[str]) -> None:
    """The current object ended with ``cause``: succeed, fail, cancel or resubmit."""
    job, now = b.job, b.ctx.now
    b.update(cause=cause, object_state=State.ENDED, unknown_since=None)
    if job.phase in TERMINAL_PHASES:
        return
    if cause.kind == CauseKind.COMPLETED:
        b.update(phase=Phase.SUCCEEDED, exit_code=None)
        b.event("Succeeded", "completed")
        return
    cancelled_by_us = cause.kind == CauseKind.CANCELLED and job.desired == Desired.STOPPED
    if cause.kind == CauseKind.CANCELLED:
        b.update(phase=Phase.CANCELLED)
        b.event("Cancelled", "cancelled by dispatch" if cancelled_by_us
                else f"cancelled by {cause.provenance.value}; not resubmitted")
        return
    if job.desired == Desired.STOPPED:
        b.update(phase=Phase.CANCELLED)
        return
    decision = decide(job.policy, cause.kind, exit_code=exit_code,
                      budgets_used=job.budgets_used)
    if not decision.resubmit:
        b.update(phase=Phase.FAILED)
        if decision.exhausted:
            warn = job.policy.on_exhausted == OnExhausted.WARN
            b.condition("RetriesExhausted", True, cause.kind.value,
                        f"{decision.budget_key} budget spent")
            b.event("Warning" if warn else "Failed",
                    f"recovery budget for {cause.kind.value} spent")
        else:
            b.event("Failed", f"ended: {cause.kind.value} {cause.detail}".strip())
        return
    budgets = dict(job.budgets_used)
    budgets[decision.budget_key] = budgets.get(decision.budget_key, 0) + 1
    excluded = {n: t for n, t in job.excluded_nodes.items() if t > now}
    if decision.exclude_nodes:
        for node in nodes:
            excluded[node] = now + job.policy.exclude_node_ttl_s
    spec = job.spec
    assert spec is not None
    b.update(budgets_used=budgets, excluded_nodes=excluded, not_before=now + decision.delay_s,
             current=None, phase=Phase.PENDING, attempt=job.attempt + 1,
             spec=_adjusted_spec(spec, decision.time_factor, decision.memory_factor),
             outputs_verified=False)
    b.event("Resubmitting", f"{cause.kind.value}: resubmitting in {decision.delay_s}s "
                            f"(attempt {job.attempt + 1})")


def _maybe_submit(b: _Builder) -> None:
    job, now = b.job, b.ctx.now
    if job.phase in TERMINAL_PHASES:
        return
    if job.desired == Desired.STOPPED:
        b.update(phase=Phase.CANCELLED, cause=Cause(CauseKind.CANCELLED, Provenance.DISPATCH))
        b.event("Cancelled", "stopped before it was submitted")
        return
    if job.not_before is not None and now < job.not_before:
        b.update(phase=Phase.PENDING)
        return
    assert job.spec is not None
    n = job.submission + 1
    excluded = tuple(sorted(n_ for n_, t in job.excluded_nodes.items() if t > now))
    b.update(submission=n, current=Current(n, job.attempt, now), not_before=None,
             phase=Phase.HELD if job.desired == Desired.HELD else Phase.PENDING,
             object_state=None, ended_at=None)
    b.submissions.append(SubmissionUpdate(job.job_id, n, "intent"))
    b.actions.append(Submit(job.job_id, n, job.attempt, job.spec, excluded,
                            release=job.desired == Desired.RUN))
    b.event("Submitting", f"submission {n}, attempt {job.attempt}")
