"""Applying a tick's plans: commit them (statuses, events and submission *intents* in
one fenced transaction), then act -- each job's actions in order, many jobs at once, in
the waves of ``controller.reconcile.waves`` -- each Slurm write behind the tick's fence
(``Fence.guard``: the epoch the tick began with) and the adapter's identity check.

A Submit runs gated; its ref is recorded (a compare-and-set, many refs of a Start batch in
one transaction) and only then is the gate released, together with the chunk's other
recorded Submits once all its Starts have returned. A ref that is no longer its job's
current intent is a duplicate: cancelled, never released. What an action finds (sbatch
refused or deferred, outputs checked, start evidence) is noted for the next plan of its
job (``OutcomeBook``); the planner decides from it. Writes nothing the planner did not
decide."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from controller.coalesce import Coalescer
from controller.errors import (
    DispatchError,
    ErrBackPressure,
    ErrInvalid,
    ErrUnsupported,
    LeaseLost,
    TransientError,
)
from controller.metrics import Metrics
from controller.model.ids import JobID
from controller.model.job import TERMINAL_PHASES, JobState, PlannedEvent
from controller.model.obs import ObjectRef, StartRequest
from controller.reconcile.memory import Memory, Todo
from controller.reconcile.outcomes import OutcomeBook
from controller.reconcile.plan import (
    Cancel,
    CheckStarted,
    Hold,
    Outcome,
    OutcomeKind,
    Plan,
    PlanContext,
    Release,
    Submit,
    VerifyOutputs,
)
from controller.reconcile.ports import Fence, NoFence, SchedulerPort
from controller.reconcile.report import TickReport
from controller.reconcile.settings import ReconcileConfig
from controller.reconcile.waves import Acts
from controller.store import repo
from controller.store.db import Store

log = logging.getLogger("dispatch.tick")

# a Submit's ref to record: (job id, submission number, the ref Start returned)
_Recorded = repo.Recorded


class Applier:
    """One shard's hands: its writes to the database and to Slurm."""

    def __init__(self, store: Store, adapter: SchedulerPort, *, metrics: Metrics,
                 settings: ReconcileConfig, memory: Memory, outcomes: OutcomeBook,
                 clock: Callable[[], float], here: str | None) -> None:
        self.store = store
        self.adapter = adapter
        self.metrics = metrics
        self.settings = settings
        self.memory = memory
        self.outcomes = outcomes
        self.clock = clock
        self.here = here
        # the fence of the tick in progress (``Reconciler.tick`` pins it at its start)
        self.fence: Fence = NoFence()
        # the ids Started since the tick's read began (``plan.no_object_yet``)
        self.starts: set[str] = set()
        # the refs of Submits that return together are recorded in one transaction
        self._records: Coalescer[_Recorded, bool] = Coalescer(self._record_many, limit=256)

    def now(self) -> int:
        return int(self.clock())

    @contextmanager
    def write(self) -> Iterator[Any]:
        """A write transaction, fenced: its first statement checks that the lease still
        holds the tick's epoch (``LeaseLost`` rolls it back whole)."""
        self.fence.refresh()  # a long tick keeps its lease between two writes
        with self.store.transaction() as tx:
            self.fence.check(tx)
            yield tx

    def commit_plans(self, plans: Sequence[tuple[repo.LoadedJob, Plan]],
                     now: int) -> tuple[set[str], set[str]]:
        """Write what the plans changed, of the plans whose job row is still the one they
        were made from (the row versions, compared and locked in the fenced transaction:
        a row deleted, or written again, or changed by a client since it was read is
        planned again next tick, and nothing of its stale plan is written or done);
        returns the ids whose status row was written, and the ids left stale."""
        with self.write() as tx:
            versions = repo.locked_versions(tx, [job.state.job_id for job, _ in plans])
            stale = {job.state.job_id for job, _ in plans
                     if versions.get(job.state.job_id) != job.version}
            if stale:
                plans = [(job, p) for job, p in plans if job.state.job_id not in stale]
            written = repo.save_statuses(tx, (
                repo.StatusWrite(p.status, job.has_status, job.reject_reason, job.previous)
                for job, p in plans), now=now, cluster=self.here)
            repo.save_submissions(tx, [(upd, p.status.attempt) for _, p in plans
                                       for upd in p.submissions], now=now,
                                  epoch=self.fence.epoch)
            events: list[PlannedEvent] = []
            for job, p in plans:
                if p.status.spec is None and job.state.job_id in written:
                    events.append(PlannedEvent(job.state.job_id, "Rejected", job.reject_reason))
                events.extend(p.events)
            repo.insert_events(tx, events, now=now)
        for job, p in plans:
            self._count_transitions(job.state, p.status)
        return written, stale

    def _moves(self, plans: Sequence[tuple[repo.LoadedJob, Plan]], report: TickReport) -> None:
        """The clusters the committed plans moved jobs to (their shards tick soon)."""
        for _, p in plans:
            if p.status.cluster is not None and p.status.cluster != self.here:
                report.moved_to.add(p.status.cluster)

    def _count_transitions(self, before: JobState, after: JobState) -> None:
        if after.phase in TERMINAL_PHASES and after.phase != before.phase:
            self.metrics.endings.labels(phase=after.phase.value,
                                        cause=after.cause.kind.value
                                        if after.spec is not None else "invalid").inc()
        for key, used in after.budgets_used.items():
            if used > before.budgets_used.get(key, 0):
                self.metrics.resubmissions.labels(cause=key).inc(used - before.budgets_used.get(
                    key, 0))

    def launch(self, plans: list[tuple[repo.LoadedJob, Plan]],
                outcomes: list[tuple[Todo, Plan | None]], acts: Acts, *,
                ctx: PlanContext, epoch: int, report: TickReport) -> None:
        """Commit these plans (their intents before any of their Submits runs), then start
        their actions, each job's in order, many jobs at once, without waiting for them:
        the chunk's next wave is planned meanwhile (``Acts.drain`` waits for all). A
        Submit that releases its gate (desired run) is released only after every Start of
        the chunk has returned and been recorded (``release``): releases joined while
        Start batches are still in flight slow those Starts on slurmctld by a third
        (bench/burst README). Each release is still of a recorded ref, once, behind the
        fence and the identity check; one that fails leaves the job gated, and the next
        plan releases it."""
        if not outcomes:
            return
        report.planned += len(plans)
        t0 = time.perf_counter()
        written, stale = self.commit_plans(plans, ctx.now) if plans else (set(), set())
        if stale:  # their rows moved since they were read: planned again, at once
            plans = [(job, p) for job, p in plans if job.state.job_id not in stale]
            outcomes = [(item, None if item.job_id in stale else p) for item, p in outcomes]
            report.deferred += len(stale)
            log.info("plans of rows that moved since they were read: not written, planned "
                     "again", extra={"jobs": sorted(stale)[:20], "count": len(stale)})
        if self.here is not None:
            self._moves(plans, report)
        self.memory.remember(outcomes, written, ctx, epoch)
        report.timings["store"] += time.perf_counter() - t0
        if acts.lost:
            return  # the lease is gone: act no more, the next leader will
        acting = [p for _, p in plans if p.actions]
        if not acting:  # (no wave: draining an empty one would suspend the tick for
            return      # nothing, and lend the loop to other shards' ticks)
        gate = acts.gate()
        acts.started(asyncio.gather(*(self._act(p.status, p.actions, gate=gate, acts=acts,
                                                report=report, now=ctx.now)
                                      for p in acting)))

    async def release(self, acts: Acts, report: TickReport, now: int) -> None:
        """Release the gates of the chunk's recorded Submits, together, once all of its
        Starts have returned (``launch``); raise the lease lost by any action."""
        if acts.releases and not acts.lost:
            t0 = time.perf_counter()
            gate = acts.gate()
            await asyncio.gather(*(self._act(job, [action], gate=gate, acts=acts,
                                             report=report, now=now)
                                   for job, action in acts.releases))
            report.timings["apply"] += time.perf_counter() - t0
        if acts.lost:
            raise acts.lost[0]

    async def _act(self, job: JobState, actions: Sequence[object], *,
                   gate: asyncio.Semaphore, acts: Acts, report: TickReport, now: int) -> None:
        """One job's actions, in order, under its wave's concurrency bound; a Submit's
        recorded ref to release goes to ``acts.releases``."""
        async with gate:
            for action in actions:
                name = type(action).__name__.lower()
                if acts.lost:
                    return  # the lease is gone: act no more, the next leader will
                try:
                    self.fence.guard()
                    ref = await self._apply_one(job, action, now)
                    if ref is not None:
                        acts.releases.append((job, Release(job.job_id, ref)))
                    report.actions[name] += 1
                except LeaseLost as exc:
                    acts.lost.append(exc)
                    return
                except Exception as exc:
                    # one job's failure never stops the others
                    self.metrics.action_errors.labels(action=name).inc()
                    report.errors.append(f"{job.job_id}: {name}: {exc}")
                    log.warning("action failed", extra={"job": job.job_id,
                                                        "action": name, "error": str(exc)})
                    self.record_event(job.job_id, "ActionFailed",
                                       f"{name}: {type(exc).__name__}: {exc}")
                    if isinstance(exc, TransientError):
                        break

    def record_event(self, job_id: str, kind: str, message: str) -> None:
        try:
            with self.write() as tx:
                repo.add_event(tx, job_id, kind, message[:2000], now=self.now())
        except DispatchError:
            log.warning("could not record event", extra={"job": job_id, "kind": kind})

    async def _apply_one(self, job: JobState, action: object, now: int) -> ObjectRef | None:
        """Run one action; a Submit returns the recorded ref to release afterwards
        (``release``), every other action None."""
        match action:
            case Submit():
                return await self._submit(job, action)
            case Release(ref=ref):
                await self.adapter.release(ref)
            case Hold(ref=ref, instance=instance):
                await self.adapter.hold(ref, instance)
            case Cancel(ref=ref, cause=cause):
                await self.adapter.stop(ref)
                if cause.value == "duplicate":
                    self.metrics.duplicates.inc()
            case VerifyOutputs(paths=paths):
                await self._verify_outputs(job, paths, now)
            case CheckStarted(ref=ref, submission=submission):
                started = await self.adapter.started_evidence(ref, submission)
                self.note_outcome(job.job_id, Outcome(
                    OutcomeKind.STARTED if started else OutcomeKind.NOT_STARTED, submission))
            case _:
                raise TypeError(f"unknown action {action!r}")
        return None

    async def _submit(self, job: JobState, action: Submit) -> ObjectRef | None:
        """Start the job gated and record its ref; the ref to release (desired run)
        once this call's Starts are done, or None (held, or a duplicate cancelled)."""
        self.starts.add(action.job_id)  # (``plan.no_object_yet``)
        request = StartRequest(job_id=JobID(action.job_id), generation=job.generation,
                               submission=action.submission, attempt=action.attempt,
                               spec=action.spec, gate=True, extra_exclude=action.exclude)
        try:
            try:
                ref = await self.adapter.start(request)
            except ErrInvalid:
                if not action.exclude:
                    raise
                # Excluding the failed node(s) left nothing that fits: the exclusion is a
                # preference, so submit without it (sbatch refused; nothing was created).
                self.record_event(action.job_id, "ExclusionDropped",
                                   "no node fits without " + ",".join(action.exclude))
                ref = await self.adapter.start(replace(request, extra_exclude=()))
        except (ErrInvalid, ErrUnsupported, ErrBackPressure) as exc:
            # Slurm refused the submission (bad partition, policy: the job fails with it)
            # or deferred it (a submit limit: it waits). Nothing was created; the outcome
            # is noted for the next plan, which decides (``_fail_submission``).
            # Anything else (transport, host key, timeout) leaves the intent for the next
            # tick to adopt or abandon: never a job failure for the operator's problem.
            self._fail_submission(job, action, exc)
            raise
        self.metrics.submissions.inc()
        # Record the ref only while this submission is still the job's current intent, and
        # only under our lease epoch (LeaseLost: write nothing more, to Slurm either: the
        # next leader adopts the gated object or cancels it).
        recorded = await self._records.call((action.job_id, action.submission, ref))
        if not recorded:
            # the intent was abandoned or replaced meanwhile: this gated object is a
            # duplicate; it is cancelled, never released
            self.record_event(action.job_id, "Duplicate",
                               f"submission {action.submission} (Slurm job {ref.id}) is no "
                               "longer current: cancelled, never released")
            await self.adapter.stop(ref)
            self.metrics.duplicates.inc()
            return None
        return ref if action.release else None

    async def _record_many(self, keys: Sequence[_Recorded]) -> dict[_Recorded, bool]:
        """Record the refs of the Submits that returned together, in one fenced
        transaction (a burst's Start batch returns 32 at once): for each, whether it is
        still its job's current intent (``repo.record_submitted``)."""
        with self.write() as tx:
            recorded = dict(zip(keys, repo.record_submitted_many(tx, keys), strict=True))
            repo.insert_events(tx, [
                PlannedEvent(job_id, "Submitted", f"submission {submission} is Slurm job "
                                                  f"{ref.id}")
                for (job_id, submission, ref), ok in recorded.items() if ok], now=self.now())
        return recorded

    def _fail_submission(self, job: JobState, action: Submit, exc: DispatchError) -> None:
        """sbatch refused (ErrInvalid/ErrUnsupported) or deferred (ErrBackPressure) the
        submission; nothing was created. Writes nothing: the next plan of the job decides
        (fails it, or backs off) from the outcome noted here."""
        kind = (OutcomeKind.SUBMIT_DEFERRED if isinstance(exc, ErrBackPressure)
                else OutcomeKind.SUBMIT_REFUSED)
        self.note_outcome(job.job_id, Outcome(kind, action.submission, str(exc)[:500]))

    async def _verify_outputs(self, job: JobState, paths: Sequence[str], now: int) -> None:
        """Check the expected outputs of the current object; the next plan decides from
        what was found (success, or the missing-output rule). Writes nothing."""
        missing = await self.adapter.missing_paths(paths)
        cur = job.current
        if cur is None:
            return
        kind = OutcomeKind.OUTPUTS_MISSING if missing else OutcomeKind.OUTPUTS_PRESENT
        self.note_outcome(job.job_id, Outcome(kind, cur.submission, paths=tuple(missing)))

    # ------------------------------------------------------------ action outcomes

    def note_outcome(self, job_id: str, outcome: Outcome) -> None:
        """What an action found, for the next plan of ``job_id``: that job is planned on
        the next tick whatever the skip analysis says, and ``TickReport.replan_soon`` asks
        for that tick early."""
        self.outcomes.note(job_id, outcome, tracked=self.memory.memos)
