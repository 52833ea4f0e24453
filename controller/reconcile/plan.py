"""The pure planner: (desired, status, observed, now) -> new status + actions + recheck_at.

No I/O, no awaits, no sessions. The tick (``controller.reconcile.tick``) loads
``JobState`` rows, gathers observations with one batched read, calls ``plan`` per job
and applies the result. Every decision is recomputed from desired + observed state
(level-triggered); the stored status is only memory of what the controller did
(submission numbers allocated, budgets spent, the ref it recorded).

``plan`` is the one decider of a job's phase, status and next deadline:

* the outcomes of the tick's actions (sbatch refused or deferred, expected outputs
  missing or present) come back as observations (``Observed.outcomes``), never as
  status written by the tick;
* every comparison with the clock goes through ``_Builder.at``, so the plan also says
  when its decision may change only because time passed (``Plan.recheck_at``, as
  controller-runtime's ``RequeueAfter``): planning again before then gives the same
  plan, up to the clock values the plan writes (condition ``since``, deadlines);
* ``sweep`` decides what to do with our-format Slurm jobs no tracked record owns
  (ownership: only ids this database knows are ever written), and ``no_object_yet``
  which new jobs may be planned before the tick's live read.
"""

from __future__ import annotations

import enum
from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass, replace

from controller.model import identity
from controller.model.job import (
    PHASE_OF_STATE,
    TERMINAL_PHASES,
    Condition,
    Current,
    Desired,
    JobState,
    Phase,
    PlannedEvent,
    SubmissionUpdate,
)
from controller.model.obs import (
    Cause,
    CauseKind,
    ObjectObs,
    ObjectRef,
    Provenance,
    Source,
    State,
)
from controller.model.policy import RecoveryPolicy
from controller.model.spec import JobSpec
from controller.reconcile import placement
from controller.reconcile.placement import Clusters
from controller.reconcile.policy import OnExhausted, decide
from controller.reconcile.settings import DEFAULTS


class OutcomeKind(enum.Enum):
    """What an action of the last tick found: given to the next plan of the job."""

    SUBMIT_REFUSED = "submit-refused"  # sbatch refused (ErrInvalid/ErrUnsupported)
    SUBMIT_DEFERRED = "submit-deferred"  # back-pressure (ErrBackPressure): a submit limit
    OUTPUTS_MISSING = "outputs-missing"  # expected outputs absent after completion
    OUTPUTS_PRESENT = "outputs-present"
    STARTED = "started"  # a lost object left evidence that it ran (its Slurm output file)
    NOT_STARTED = "not-started"  # ... and none: it never ran


@dataclass(frozen=True, slots=True)
class Outcome:
    """The result of one action, for the submission (number) it was about."""

    kind: OutcomeKind
    submission: int
    detail: str = ""
    paths: tuple[str, ...] = ()  # OUTPUTS_MISSING: the missing paths


@dataclass(frozen=True, slots=True)
class Observed:
    """What the tick's batched reads saw of one job."""

    live: tuple[ObjectObs, ...] = ()  # every squeue object named dj-<this job>
    accounting: ObjectObs | None = None  # the current ref, from sacct, once it left squeue
    accounting_ok: bool = True  # False when sacct failed or is not available
    outcomes: tuple[Outcome, ...] = ()  # what the last tick's actions found (``Outcome``)


@dataclass(frozen=True, slots=True)
class PlanContext:
    now: int
    unknown_grace_s: int = DEFAULTS.unknown_grace_s
    adopt_window_s: int = DEFAULTS.adopt_window_s  # how long an intent may wait for its object
    down_nodes: frozenset[str] = frozenset()
    # the configured clusters and this shard's (``controller.reconcile.placement``);
    # None: one cluster, no placement (a job's ``cluster`` is neither read nor written)
    clusters: Clusters | None = None


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


@dataclass(frozen=True, slots=True)
class CheckStarted:
    """Did the lost object of ``submission`` ever start? (Slurm creates its ``--output``
    file when the batch step starts.) The answer comes back as an ``Outcome``."""

    job_id: str
    ref: ObjectRef
    submission: int


Action = Submit | Release | Hold | Cancel | VerifyOutputs | CheckStarted


@dataclass(frozen=True, slots=True)
class Plan:
    status: JobState
    actions: tuple[Action, ...] = ()
    submissions: tuple[SubmissionUpdate, ...] = ()
    events: tuple[PlannedEvent, ...] = ()
    # the first second at which planning the same inputs again could decide differently
    # only because the clock moved; None: never (only a change of the inputs will)
    recheck_at: int | None = None


# ---------------------------------------------------------------- helpers


def same_object(ref: ObjectRef, obs: ObjectObs) -> bool:
    """The identity check of SPEC §2 (``controller.model.identity``), against an
    observation. The SLUID is not passed: the planner's check has never compared it
    (the adapter's has, and ``pick_record`` does for an accounting record)."""
    return identity.same_object(
        ref, job_id=obs.ref.id, name=obs.ref.uid,
        submit=obs.submit if obs.submit is not None else obs.ref.submit,
        restart_count=obs.restart_count)


def counts_as_ended(obs: ObjectObs) -> bool:
    """Whether an object is over. A state word the adapter does not know, read while
    slurmctld still holds the job (ENDED, cause UNKNOWN, live), is not: it may well run.
    One listed running whose host and processes the adapter found gone (RUNNING,
    cause NODE_LOST: Grid Engine keeps such jobs 'r') is."""
    if obs.state == State.RUNNING and obs.cause.kind == CauseKind.NODE_LOST:
        return True
    return obs.state == State.ENDED and not (
        obs.cause.kind == CauseKind.UNKNOWN and obs.source == Source.LIVE)


@dataclass(frozen=True, slots=True)
class Sweep:
    """What to do with our-format ``dj-`` Slurm jobs that no job of the tick owned."""

    cancels: tuple[Cancel, ...] = ()  # objects of ids this database knows: stopped
    unowned: tuple[ObjectObs, ...] = ()  # ids this database never had: never written
    tracked: tuple[str, ...] = ()  # ids tracked again since the read: their plans decide


def sweep(strays: Mapping[str, Sequence[ObjectObs]], *, tracked: Container[str],
          known: Container[str]) -> Sweep:
    """Ownership (SPEC §6.2): a live ``dj-`` job that carries our comment but belongs to
    no tracked job is cancelled as a duplicate only when this database knows its id --
    a row that finished (the late object of an abandoned intent) or a tombstone (a row
    deleted while its job lived). An id this database never had is a neighbouring
    deployment's on the same Slurm account: counted and shown, never written. An id that
    is tracked again (a row written since the read) is left to its next plan, which
    adopts. Foreign objects (our name, not our comment) are never touched."""
    cancels: list[Cancel] = []
    unowned: list[ObjectObs] = []
    again: list[str] = []
    for job_id, seen in sorted(strays.items()):
        live = [o for o in seen if not o.foreign and not counts_as_ended(o)]
        if not live:
            continue
        if job_id in tracked:
            again.append(job_id)
        elif job_id in known:
            cancels.extend(Cancel(job_id, o.ref, CauseKind.DUPLICATE) for o in live)
        else:
            unowned.extend(live)
    return Sweep(tuple(cancels), tuple(unowned), tuple(again))


def no_object_yet(job_id: str, *, has_status: bool, last_read: Container[str] | None,
                  started_since_read: Container[str], tombstoned: Container[str]) -> bool:
    """Whether no Slurm object can belong to a job, so that planning it with no
    observation is what the live read would give it (the tick may then plan and submit
    it before the read returns): no status row (no intent was ever committed for it, and
    every sbatch of ours follows one); a complete live read of this leadership
    (``last_read``: the ids it saw; None: none yet) that did not see its name; no Start
    of ours for it since that read began; and no tombstone (a row deleted and written
    again under the same id may have objects of its earlier life, which the read shows
    and its plan adopts)."""
    return (not has_status and last_read is not None and job_id not in last_read
            and job_id not in started_since_read and job_id not in tombstoned)


class ClaimStep(enum.Enum):
    """What a shard's leader does with its deployment's ownership marker on the cluster
    (``claim``)."""

    MARK = "mark"  # no marker yet (or it was removed): write this database's token
    ROTATE = "rotate"  # ours: at a takeover, a new token (database first, then marker)
    KEEP = "keep"  # ours: nothing to do
    RESUME = "resume"  # our previous token: a rotation was cut short; write the new one
    CONFLICT = "conflict"  # another database with this deployment's id wrote it


def claim(marker: str | None, token: str | None, previous: str | None, *,
          takeover: bool) -> ClaimStep:
    """Ownership across databases (README "Two deployments on one Slurm account"): the
    marker on the cluster holds the token the last leader of this deployment's database
    wrote, and the database keeps it (and the one before). Every takeover writes a new
    token, the database first. A marker that is neither is another database's that
    carries the same deployment id -- a database restored from a backup while its
    deployment runs: acting would be two deployments acting on the same jobs, so the
    leader refuses (and so does the other one at its next check)."""
    if marker is None or token is None:
        return ClaimStep.MARK if marker is None else ClaimStep.CONFLICT
    if marker == token:
        return ClaimStep.ROTATE if takeover else ClaimStep.KEEP
    if marker == previous:
        return ClaimStep.RESUME
    return ClaimStep.CONFLICT


def postponable(*, has_status: bool, seen: Sequence[ObjectObs], waiting: bool) -> bool:
    """Whether a job whose plan is a Submit may wait, unread and unplanned, until the
    submit slice has room: planning it again could only give that Submit again -- no
    status row (no intent, so no object of ours), nothing of it in the tick's read, and
    no action outcome ``waiting`` for its plan. The tick drops such a Submit past the
    slice and keeps its memo marked; while this still holds, the job waits unread."""
    return not has_status and not seen and not waiting


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


_MAX_FACTOR = 1024.0  # time and memory grow at most this much over the spec's


def resubmission_spec(spec: JobSpec, policy: RecoveryPolicy,
                      budgets_used: Mapping[str, int]) -> JobSpec:
    """The spec a submission runs with: the client's, its time limit and memory multiplied
    by each cause rule's factors once per resubmission spent on that cause. Derived from
    persisted state (``budgets_used``) every time, never kept in memory."""
    time_factor = memory_factor = 1.0
    for key, used in budgets_used.items():
        try:
            rule = policy.rule(CauseKind(key))
        except ValueError:  # a budget key this version does not know
            continue
        steps = min(max(used, 0), 64)
        time_factor = min(_MAX_FACTOR, time_factor * rule.time_factor ** steps)
        memory_factor = min(_MAX_FACTOR, memory_factor * rule.memory_factor ** steps)
    res = spec.resources
    if time_factor != 1.0 and res.time_limit_s:
        res = replace(res, time_limit_s=int(res.time_limit_s * time_factor))
    if memory_factor != 1.0 and res.memory_mb:
        res = replace(res, memory_mb=int(res.memory_mb * memory_factor))
    return spec if res is spec.resources else replace(spec, resources=res)


class _Builder:
    """Accumulates one job's plan."""

    def __init__(self, job: JobState, ctx: PlanContext,
                 outcomes: Sequence[Outcome] = ()) -> None:
        self.job = job
        self.original = job  # the status as loaded, before this plan changed it
        self.ctx = ctx
        self.outcomes = outcomes
        self.actions: list[Action] = []
        self.submissions: list[SubmissionUpdate] = []
        self.events: list[PlannedEvent] = []
        self.due: int | None = None  # the earliest clock trigger seen (``at``)

    def at(self, moment: int) -> None:
        """A comparison with the clock flips at ``moment``: every rule that compares
        ``ctx.now`` with a time calls this, so ``Plan.recheck_at`` is exact."""
        if moment > self.ctx.now and (self.due is None or moment < self.due):
            self.due = moment

    def event(self, kind: str, message: str) -> None:
        self.events.append(PlannedEvent(self.job.job_id, kind, message))

    def update(self, **changes: object) -> None:
        job = self.job
        for name, value in changes.items():
            held = getattr(job, name)
            if held is not value and (type(held) is not type(value) or held != value):
                self.job = replace(job, **changes)  # type: ignore[arg-type]
                return
        # every value is the one the job holds already (same type, equal): a plan makes
        # many such updates (the phase it has, observed_generation), each a copy saved

    def condition(self, type_: str, status: bool, reason: str, message: str = "") -> None:
        self.update(conditions=set_condition(
            self.job.conditions, type_=type_, status=status, reason=reason, message=message,
            now=self.ctx.now, generation=self.job.generation))

    def outcome(self, kinds: Container[OutcomeKind]) -> Outcome | None:
        """The last outcome of ``kinds`` about the current submission."""
        cur = self.job.current
        if cur is None:
            return None
        found = [o for o in self.outcomes if o.kind in kinds and o.submission == cur.submission]
        return found[-1] if found else None

    def build(self) -> Plan:
        return Plan(self.job, tuple(self.actions), tuple(self.submissions), tuple(self.events),
                    recheck_at=self.due)


# ---------------------------------------------------------------- the planner


def plan(job: JobState, observed: Observed, ctx: PlanContext) -> Plan:
    """Compute the next status and the actions for one job. Pure."""
    b = _Builder(job, ctx, observed.outcomes)
    ours = [o for o in observed.live if not o.foreign]
    if job.spec is None or job.phase == Phase.REJECTED:
        _reject(b, ours)
        return b.build()
    if not _placed(b):
        return b.build()

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

    _submit_outcome(b)
    _adopt(b, ours)
    current_obs = _current_observation(b, ours, observed)
    _cancel_duplicates(b, ours)

    if b.job.current is not None and b.job.current.ref is not None:
        _follow_current(b, current_obs, observed)
    elif b.job.current is None and not _moved_away(b):
        _maybe_submit(b)
    b.update(observed_generation=b.job.generation)
    return b.build()


def _reject(b: _Builder, ours: Sequence[ObjectObs]) -> None:
    """An invalid row (spec, policy or desired written by plain SQL): the job is rejected,
    but its Slurm jobs are not forgotten. Its ref stays recorded, and we cannot run a job
    whose spec is invalid: a live object of ours is held when desired says held (if it is
    still pending), else cancelled."""
    job = b.job
    b.update(phase=Phase.REJECTED)
    instance = job.hold_instance
    for obs in ours:
        if counts_as_ended(obs):
            continue
        if job.desired == Desired.HELD:
            if obs.state == State.PENDING:
                instance += 1
                b.update(hold_instance=instance)
                b.actions.append(Hold(job.job_id, obs.ref, instance))
                b.event("Holding", f"rejected row: holding Slurm job {obs.ref.id}")
            continue
        b.actions.append(Cancel(job.job_id, obs.ref, CauseKind.CANCELLED))
        b.event("Cancelling", f"rejected row: cancelling Slurm job {obs.ref.id}")


def _waiting(job: JobState) -> Phase:
    """The phase of a job with no live object that waits to be submitted."""
    return Phase.HELD if job.desired == Desired.HELD else Phase.PENDING


def _placed(b: _Builder) -> bool:
    """Place the job on this shard's cluster (``placement``). False when its document
    names a cluster the configuration does not know: the job waits, unplaced and
    unsubmitted, with the reason (the default cluster's shard says so); it is picked up
    again once the configuration gains that cluster."""
    clusters = b.ctx.clusters
    job = b.job
    if clusters is None:
        return True
    assert job.spec is not None
    missing = placement.unknown(job.spec, clusters)
    if missing and job.cluster is None and job.current is None and \
            job.desired != Desired.STOPPED and job.phase not in TERMINAL_PHASES:
        message = (f"cluster {', '.join(missing)} is not configured here (configured: "
                   f"{', '.join(clusters.names)}); not submitted until it is")
        if not any(c.type == "ClusterKnown" and not c.status for c in job.conditions):
            b.event("Rejected", message)
        b.condition("ClusterKnown", False, "UnknownCluster", message)
        b.update(phase=_waiting(job),
                 reason="UnknownCluster")
        return False
    if any(c.type == "ClusterKnown" for c in job.conditions):
        b.update(conditions=_drop_condition(job.conditions, "ClusterKnown"), reason="")
    if job.cluster is None:
        b.update(cluster=clusters.here)
    return True


def _moved_away(b: _Builder) -> bool:
    """This plan moved the job to another cluster: that cluster's shard submits it."""
    clusters = b.ctx.clusters
    return clusters is not None and b.job.cluster not in (None, clusters.here)


def _move(b: _Builder, cluster: str, why: str) -> None:
    """Hand the job (no current object) to another cluster's shard, which plans it from
    its next tick on."""
    b.update(cluster=cluster)
    b.event("Moved", f"{why}: moved to cluster {cluster}")


def _next_cluster(b: _Builder, outcome: Outcome) -> bool:
    """This cluster did not accept the submission: a job that accepts a next cluster
    moves there (``placement.after_refusal``; the first that accepts wins)."""
    clusters = b.ctx.clusters
    job = b.job
    nxt = (placement.after_refusal(job.spec, clusters)
           if clusters is not None and job.spec is not None else None)
    if nxt is None or clusters is None:
        return False
    b.update(current=None, object_state=None,
             phase=_waiting(job))
    _move(b, nxt, f"cluster {clusters.here} did not accept submission {outcome.submission}: "
                  f"{outcome.detail}"[:1500])
    return True


def _submit_refused(b: _Builder, outcome: Outcome) -> None:
    """sbatch refused the submission (bad partition, policy): the job goes to its next
    acceptable cluster, or, on its last, fails with it."""
    if _next_cluster(b, outcome):
        return
    b.update(current=None, phase=Phase.FAILED, object_state=None,
             cause=Cause(CauseKind.UNRUNNABLE, Provenance.SLURM, outcome.detail[:500]))
    b.event("Failed", f"Slurm refused submission {outcome.submission}: "
                      f"{outcome.detail}".strip()[:2000])


def _submit_deferred(b: _Builder, outcome: Outcome) -> None:
    """A submit limit or a drained partition (back-pressure): nothing was created. A job
    that accepts a next cluster moves there; else it stays pending, spends no budget, and
    tries again after a backoff that doubles while the limit lasts (the wait is as long
    as the deferral streak so far, within the policy's backoff bounds)."""
    if _next_cluster(b, outcome):
        return
    job, now = b.job, b.ctx.now
    policy = job.policy
    streak = next((c.since for c in job.conditions
                   if c.type == "SubmitDeferred" and c.status), now)
    delay = min(policy.backoff_max_s, max(policy.backoff_initial_s, 1, now - streak))
    b.condition("SubmitDeferred", True, "BackPressure", outcome.detail[:500])
    b.update(current=None, not_before=now + delay,
             phase=_waiting(job))
    b.event("SubmitDeferred", f"submission {outcome.submission} deferred for {delay}s: "
                              f"{outcome.detail}".strip()[:2000])


_SUBMIT_OUTCOMES = {
    OutcomeKind.SUBMIT_REFUSED: _submit_refused,
    OutcomeKind.SUBMIT_DEFERRED: _submit_deferred,
}


def _submit_outcome(b: _Builder) -> None:
    """sbatch answered the current intent's Submit without creating anything: the intent
    is abandoned, and the outcome decides what follows (``_SUBMIT_OUTCOMES``)."""
    cur = b.job.current
    outcome = b.outcome(_SUBMIT_OUTCOMES)
    if outcome is None or cur is None or cur.ref is not None:
        return
    b.submissions.append(SubmissionUpdate(b.job.job_id, cur.submission, "abandoned"))
    b.update(abandoned=b.job.abandoned | {cur.submission})
    _SUBMIT_OUTCOMES[outcome.kind](b, outcome)


def _abandoned(job: JobState, obs: ObjectObs) -> bool:
    """A late object of an abandoned intent: never adopted (nor released). Its submission
    row says so; and with no current submission, a still gated object of a submission
    already allocated can only be one (a recorded object is released or followed)."""
    n = obs.submission
    return n is not None and (n in job.abandoned or (
        obs.state == State.GATED and job.current is None and n <= job.submission))


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
            b.update(current=None, abandoned=job.abandoned | {job.current.submission})
        else:
            b.at(job.current.created_at + b.ctx.adopt_window_s + 1)
        return
    if job.current is None and job.phase not in TERMINAL_PHASES:
        before = b.original  # the submission number as loaded, before live objects moved it
        live = [o for o in ours if not counts_as_ended(o) and o.submission is not None
                and not _abandoned(before, o)]
        if not live and before.submission == 0:
            # a row that never submitted, yet objects of ours carry its id: a row deleted
            # and written again. A job of that earlier life that ran and ended (still in
            # squeue) is this row's outcome: adopted, followed to its end, never run again
            live = [o for o in ours if counts_as_ended(o) and o.submission is not None
                    and o.start is not None and o.cause.kind != CauseKind.CANCELLED]
        if live:
            obs = max(live, key=lambda o: (o.submission or 0, o.ref.id))
            assert obs.submission is not None
            b.update(current=Current(obs.submission, obs.attempt or 0, now, obs.ref),
                     attempt=max(job.attempt, obs.attempt or 0))
            b.submissions.append(SubmissionUpdate(job.job_id, obs.submission, "submitted", obs))
            b.event("Adopted", f"adopted live Slurm job {obs.ref.id} (submission "
                               f"{obs.submission}) before submitting again")


def cancel_needs_accounting(obs: ObjectObs) -> bool:
    """squeue cannot say who cancelled a job: a CANCELLED read live may be a user's cancel,
    or Slurm's own ("Duplicate jobid" after slurmctld lost its state, a kill by uid 0).
    The accounting record names the requester; the tick reads it for such objects."""
    return (obs.source == Source.LIVE and obs.state == State.ENDED
            and obs.cause.kind == CauseKind.CANCELLED
            and obs.cause.provenance != Provenance.SLURM)


def needs_accounting(ref: ObjectRef | None, live: Sequence[ObjectObs]) -> bool:
    """Whether a job's plan needs the accounting record of its current object ``ref``:
    squeue does not hold that object any more, or holds it cancelled by someone only
    sacct names (``cancel_needs_accounting``)."""
    return ref is not None and not any(
        same_object(ref, obs) and not cancel_needs_accounting(obs) for obs in live)


def live_settles_accounting(live: Sequence[ObjectObs]) -> bool:
    """Whether squeue holds an object that, if it is the job's current one, makes its
    accounting record unneeded (``needs_accounting`` is then False for that ref): a job
    without one is read up front; a job with one needs its ref checked (its row)."""
    return any(not cancel_needs_accounting(obs) for obs in live)


def _current_observation(b: _Builder, ours: Sequence[ObjectObs],
                         observed: Observed) -> ObjectObs | None:
    cur = b.job.current
    if cur is None or cur.ref is None:
        return None
    ref = cur.ref
    acct = observed.accounting
    for obs in ours:
        if same_object(ref, obs):
            if (cancel_needs_accounting(obs) and acct is not None
                    and same_object(ref, acct) and acct.state == State.ENDED):
                return acct  # it names who cancelled
            return obs
    if acct is not None and same_object(ref, acct) and acct.submission in (
            None, cur.submission):
        return acct
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
        if counts_as_ended(obs) or _is_current(b.job, obs):
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
    if any(c.type == "SubmitDeferred" for c in job.conditions):
        b.update(conditions=_drop_condition(b.job.conditions, "SubmitDeferred"))
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
        if job.desired == Desired.STOPPED:  # never counted as ended: stop still cancels
            b.actions.append(Cancel(job.job_id, ref, CauseKind.CANCELLED))
        return
    if cancel_needs_accounting(obs) and job.desired != Desired.STOPPED \
            and obs.end is not None:
        # cancelled, but not by us: by a user, or by Slurm itself? Wait (up to the unknown
        # grace) for the accounting record, which names the requester
        grace = _unknown_grace(b)
        if b.ctx.now < obs.end + grace:
            b.condition("Observed", False, "AwaitingAccounting",
                        "cancelled, not by dispatch: waiting for the accounting record "
                        "to tell a user's cancel from Slurm's own")
            b.at(obs.end + grace)
            return
    if obs.state == State.ENDED:
        _ended(b, obs)
        return
    if obs.state == State.RUNNING and obs.cause.kind == CauseKind.NODE_LOST:
        # listed running, but its host is gone and so are its processes (the adapter
        # checked; Grid Engine keeps such jobs 'r'): this object is over
        b.actions.append(Cancel(job.job_id, ref, CauseKind.NODE_LOST))
        _finish_object(b, obs.cause, exit_code=None, nodes=obs.nodes or job.nodes)
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
        # a held object lists no nodes: exclude the ones it was launched on (last seen)
        b.actions.append(Cancel(job.job_id, ref, CauseKind.LAUNCH_FAILED))
        _finish_object(b, obs.cause, exit_code=None, nodes=b.job.nodes)


def _stale(b: _Builder, obs: ObjectObs) -> None:
    job, now = b.job, b.ctx.now
    stale_reason = ""
    if obs.state == State.RUNNING:
        if obs.nodes and b.ctx.down_nodes.intersection(obs.nodes):
            stale_reason = "NodeDown"
        elif obs.start is not None and obs.time_limit_s is not None:
            limit = obs.start + obs.time_limit_s + job.policy.stale_grace_s
            if now > limit:
                stale_reason = "PastTimeLimit"
            else:
                b.at(limit + 1)
    if stale_reason:
        b.condition("Stale", True, stale_reason,
                    "Slurm reports the job running, but " + (
                        "its node is down" if stale_reason == "NodeDown"
                        else "it is past its time limit plus grace"))
    elif any(c.type == "Stale" and c.status for c in job.conditions):
        b.condition("Stale", False, "Healthy", "")


def _unknown_grace(b: _Builder) -> int:
    """How long an object may go unaccounted for: the job's policy, else the setting."""
    own = b.job.policy.unknown_grace_s
    return own if own is not None else b.ctx.unknown_grace_s


def _unknown(b: _Builder, observed: Observed) -> None:
    job, ctx = b.job, b.ctx
    since = job.unknown_since if job.unknown_since is not None else ctx.now
    b.update(unknown_since=since)
    why = ("left the queue and accounting did not answer" if not observed.accounting_ok
           else "absent from squeue and sacct")
    b.condition("Observed", False, "Unknown", why)
    grace = _unknown_grace(b)
    if ctx.now - since < grace:
        b.at(since + grace)
        return
    assert job.current is not None and job.current.ref is not None
    # absent from squeue and from sacct while both answered: the cluster lost the job.
    # Without accounting we cannot tell: unknown.
    cause = (Cause(CauseKind.LOST, Provenance.SLURM, why) if observed.accounting_ok
             else Cause(CauseKind.UNKNOWN, Provenance.UNKNOWN, why))
    if _awaiting_start_evidence(b, cause):
        return  # (still unknown; decided next tick, with the evidence)
    b.event("Lost" if observed.accounting_ok else "Unknown",
            f"Slurm job {job.current.ref.id} unseen for {ctx.now - since}s: "
            f"ended, cause {cause.kind.value}")
    b.submissions.append(SubmissionUpdate(job.job_id, job.current.submission, "ended"))
    _finish_object(b, cause, exit_code=None, nodes=job.nodes)


def _ended(b: _Builder, obs: ObjectObs) -> None:
    job = b.job
    b.update(ended_at=obs.end, exit_code=obs.exit_code)
    if obs.cause.kind == CauseKind.COMPLETED and job.policy.expected_outputs \
            and not job.outputs_verified:
        outcome = b.outcome(_OUTPUT_OUTCOMES)
        if outcome is None:  # not checked yet: the tick checks, the next plan decides
            b.actions.append(VerifyOutputs(job.job_id, job.policy.expected_outputs))
            b.update(cause=obs.cause, phase=Phase.RUNNING)
            return
        if outcome.kind == OutcomeKind.OUTPUTS_MISSING:
            b.event("MissingOutput", "expected output missing: " + ", ".join(outcome.paths))
            _finish_object(b, Cause(CauseKind.MISSING_OUTPUT, Provenance.DISPATCH,
                                    ", ".join(outcome.paths)), exit_code=None, nodes=job.nodes)
            return
        b.update(outputs_verified=True)
        b.event("OutputsVerified", "expected outputs present")
    _finish_object(b, obs.cause, exit_code=obs.exit_code, nodes=obs.nodes)


_OUTPUT_OUTCOMES = frozenset({OutcomeKind.OUTPUTS_MISSING, OutcomeKind.OUTPUTS_PRESENT})


def _lost_cause(cause: Cause) -> Cause:
    """A cancel that Slurm made itself (state-loss flush, "Duplicate jobid", a cancel by
    uid 0/slurm) is never a user's cancel: the cluster lost the job."""
    if cause.kind == CauseKind.CANCELLED and cause.provenance == Provenance.SLURM:
        return Cause(CauseKind.LOST, Provenance.SLURM,
                     cause.detail or "cancelled by Slurm itself")
    return cause


_RAN = frozenset({State.RUNNING, State.SUSPENDED})
_START_OUTCOMES = frozenset({OutcomeKind.STARTED, OutcomeKind.NOT_STARTED})


def _seen_started(b: _Builder) -> bool:
    """A start was observed: a start time (squeue or accounting), or last seen running."""
    return b.job.started_at is not None or b.original.object_state in _RAN


def _awaiting_start_evidence(b: _Builder, cause: Cause) -> bool:
    """A lost object never seen running may still have run between two reads: before it
    is resubmitted for free, its Slurm output file is looked for (``CheckStarted``; the
    tick looks, the next plan decides). True while that answer is awaited."""
    job = b.job
    cur = job.current
    if (cause.kind != CauseKind.LOST or _seen_started(b) or cur is None or cur.ref is None
            or b.outcome(_START_OUTCOMES) is not None):
        return False
    b.actions.append(CheckStarted(job.job_id, cur.ref, cur.submission))
    return True


def _finish_object(b: _Builder, cause: Cause, *, exit_code: int | None,
                   nodes: Sequence[str]) -> None:
    """The current object ended with ``cause``: succeed, fail, cancel or resubmit."""
    job, now = b.job, b.ctx.now
    cause = _lost_cause(cause)
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
    if _awaiting_start_evidence(b, cause):
        return
    evidence = b.outcome(_START_OUTCOMES)
    free = (cause.kind == CauseKind.LOST and not _seen_started(b) and evidence is not None
            and evidence.kind == OutcomeKind.NOT_STARTED)
    decision = decide(job.policy, cause.kind, exit_code=exit_code,
                      budgets_used=job.budgets_used, spend=not free)
    if not decision.resubmit:
        b.update(phase=Phase.FAILED)
        if decision.exhausted:
            warn = job.policy.on_exhausted == OnExhausted.WARN
            b.condition("RetriesExhausted", True, cause.kind.value,
                        f"{decision.budget_key} budget spent")
            if warn:  # on_exhausted: warn -- failed, and the workflow may continue
                b.condition("Warning", True, "RetriesExhausted",
                            f"recovery budget for {cause.kind.value} spent; on_exhausted=warn")
            b.event("Warning" if warn else "Failed",
                    f"recovery budget for {cause.kind.value} spent")
        else:
            b.event("Failed", f"ended: {cause.kind.value} {cause.detail}".strip())
        return
    budgets = dict(job.budgets_used)
    if decision.budget_key:  # (a lost job that never started spends nothing)
        budgets[decision.budget_key] = budgets.get(decision.budget_key, 0) + 1
    excluded = _unexpired(b, job.excluded_nodes)
    if decision.exclude_nodes:
        for node in nodes:
            excluded[node] = now + job.policy.exclude_node_ttl_s
    # the time/memory factors are not applied here: the Submit derives them from
    # budgets_used (``resubmission_spec``), which is persisted
    clusters = b.ctx.clusters
    where = (placement.for_resubmission(job.spec, job.policy.other_cluster_on, cause.kind,
                                        clusters)
             if clusters is not None and job.spec is not None else None)
    moving = where is not None and where != job.cluster
    if moving:
        # the excluded nodes are this cluster's: they mean nothing on the next one
        excluded = {}
    b.update(budgets_used=budgets, excluded_nodes=excluded, not_before=now + decision.delay_s,
             current=None, phase=Phase.PENDING, attempt=job.attempt + 1,
             outputs_verified=False)
    b.event("Resubmitting", f"{cause.kind.value}: resubmitting in {decision.delay_s}s "
                            f"(attempt {job.attempt + 1})" + (
                                "; it never started: no budget spent" if free else ""))
    if moving:
        assert where is not None
        _move(b, where, f"{cause.kind.value} on cluster {job.cluster} (policy "
                        "other_cluster_on)")


def _unexpired(b: _Builder, excluded: Mapping[str, int]) -> dict[str, int]:
    """The node exclusions still in force (each expires at its time: a clock trigger)."""
    now = b.ctx.now
    kept = {n: t for n, t in excluded.items() if t > now}
    for t in kept.values():
        b.at(t)
    return kept


def _maybe_submit(b: _Builder) -> None:
    job, now = b.job, b.ctx.now
    if job.phase in TERMINAL_PHASES:
        return
    if job.desired == Desired.STOPPED:
        b.update(phase=Phase.CANCELLED, cause=Cause(CauseKind.CANCELLED, Provenance.DISPATCH))
        b.event("Cancelled", "stopped before it was submitted")
        return
    if job.not_before is not None and now < job.not_before:
        b.at(job.not_before)
        b.update(phase=Phase.PENDING)
        return
    assert job.spec is not None
    n = job.submission + 1
    excluded = tuple(sorted(_unexpired(b, job.excluded_nodes)))
    b.update(submission=n, current=Current(n, job.attempt, now), not_before=None,
             phase=_waiting(job),
             object_state=None, ended_at=None)
    b.submissions.append(SubmissionUpdate(job.job_id, n, "intent", cluster=job.cluster))
    spec = resubmission_spec(job.spec, job.policy, job.budgets_used)
    b.actions.append(Submit(job.job_id, n, job.attempt, spec, excluded,
                            release=job.desired == Desired.RUN))
    b.event("Submitting", f"submission {n}, attempt {job.attempt}")
