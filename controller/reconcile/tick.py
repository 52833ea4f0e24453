"""One reconcile tick: load desired state, read Slurm once, plan, apply, record.

Order inside a tick (crash-safe at every line):
1. load every tracked job from the store;
2. one batched live read (``find_many``) and, for current objects that left the
   queue, one batched accounting read (``inspect_many`` with a start window);
   a failed live read ends the tick without touching any job;
3. ``plan`` each job (pure);
4. commit statuses, events and submission *intents* in one transaction;
5. apply the Slurm actions (each behind the adapter's identity check); a Submit
   runs gated, its ref is committed, and only then is the gate released;
6. record what the actions returned.
A crash between 4 and 6 leaves intents and gated objects that the next tick adopts.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter as CountOf
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from controller.errors import (
    DispatchError,
    ErrInvalid,
    ErrUnsupported,
    ProtocolError,
    TransientError,
)
from controller.metrics import Metrics
from controller.model.ids import JobID
from controller.model.obs import (
    Cause,
    CauseKind,
    ObjectObs,
    ObjectRef,
    Provenance,
    StartRequest,
    State,
)
from controller.reconcile.plan import (
    TERMINAL_PHASES,
    Cancel,
    Hold,
    JobState,
    Observed,
    Phase,
    Plan,
    PlanContext,
    Release,
    SubmissionUpdate,
    Submit,
    VerifyOutputs,
    finish_missing_output,
    plan,
    same_object,
)
from controller.reconcile.ports import ClusterStats, SlurmPort
from controller.store import repo
from controller.store.db import Store

log = logging.getLogger("dispatch.tick")

Clock = Callable[[], float]


@dataclass(frozen=True, slots=True)
class TickSettings:
    unknown_grace_s: int = 600
    adopt_window_s: int = 180
    sacct_window_s: int = 7 * 24 * 3600
    action_concurrency: int = 8


@dataclass(slots=True)
class TickReport:
    tracked: int = 0
    planned: int = 0
    actions: CountOf[str] = field(default_factory=CountOf)
    errors: list[str] = field(default_factory=list)
    slurm_ok: bool = True
    accounting_ok: bool = True
    duration_s: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)


class Reconciler:
    """Owns one tick; everything it needs is injected."""

    def __init__(self, store: Store, adapter: SlurmPort, *, metrics: Metrics,
                 clock: Clock = time.time, settings: TickSettings | None = None) -> None:
        self.store = store
        self.adapter = adapter
        self.metrics = metrics
        self.clock = clock
        self.settings = settings or TickSettings()
        self.cluster_stats: ClusterStats | None = None
        self._spec_cache: repo.SpecCache = {}
        self.last_success: float | None = None

    def now(self) -> int:
        return int(self.clock())

    async def tick(self) -> TickReport:
        started = time.perf_counter()
        report = TickReport()
        try:
            await self._tick(report)
        finally:
            report.duration_s = time.perf_counter() - started
            self.metrics.tick_duration.observe(report.duration_s)
        result = "ok" if report.slurm_ok else "slurm-unreachable"
        self.metrics.ticks.labels(result=result).inc()
        if report.slurm_ok:
            self.last_success = self.clock()
            self.metrics.last_tick.set(self.last_success)
        return report

    async def _tick(self, report: TickReport) -> None:
        now = self.now()
        t0 = time.perf_counter()
        with self.store.transaction() as tx:
            loaded = repo.load_tracked(tx, self.adapter.cluster, cache=self._spec_cache)
        previous = {j.state.job_id: j.previous for j in loaded if j.previous is not None}
        if len(self._spec_cache) > 2 * len(loaded) + 1000:  # forget jobs that finished
            live_ids = {j.state.job_id for j in loaded}
            self._spec_cache = {k: v for k, v in self._spec_cache.items() if k in live_ids}
        report.tracked = len(loaded)
        self.metrics.tracked.set(len(loaded))
        report.timings["load"] = time.perf_counter() - t0
        valid = [j for j in loaded if j.state.spec is not None]

        t0 = time.perf_counter()
        live: dict[str, list[ObjectObs]] = {}
        if valid:
            try:
                live = await self.adapter.find_many([j.state.job_id for j in valid])
            except (TransientError, ProtocolError) as exc:
                report.slurm_ok = False
                report.errors.append(f"live read: {exc}")
                self.metrics.slurm_up.set(0)
                log.warning("slurm live read failed; no job changes this tick",
                            extra={"error": str(exc)})
                self._save_rejections(loaded, previous, now)
                return
        self.metrics.slurm_up.set(1)
        acct, acct_ok = await self._accounting(valid, live, now)
        report.accounting_ok = acct_ok
        self.metrics.accounting_up.set(1 if acct_ok else 0)
        report.timings["read"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        down = self.cluster_stats.down_nodes if self.cluster_stats else frozenset()
        ctx = PlanContext(now=now, unknown_grace_s=self.settings.unknown_grace_s,
                          adopt_window_s=self.settings.adopt_window_s, down_nodes=down)
        plans: list[tuple[repo.LoadedJob, Plan]] = []
        for job in loaded:
            try:
                cur = job.state.current
                acct_obs = acct.get(cur.ref) if cur and cur.ref else None
                observed = Observed(live=tuple(live.get(job.state.job_id, ())),
                                    accounting=acct_obs, accounting_ok=acct_ok)
                plans.append((job, plan(job.state, observed, ctx)))
            except Exception as exc:  # one job's bug never stops the others
                log.exception("planning failed", extra={"job": job.state.job_id})
                report.errors.append(f"{job.state.job_id}: plan: {exc}")
        report.planned = len(plans)
        report.timings["plan"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        self._commit_plans(plans, previous, now)
        report.timings["store"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        await self._apply(plans, report, now)
        report.timings["apply"] = time.perf_counter() - t0
        self._refresh_gauges(plans, now)

    # ------------------------------------------------------------ reads

    async def _accounting(self, valid: Sequence[repo.LoadedJob], live: dict[str, list[ObjectObs]],
                          now: int) -> tuple[dict[ObjectRef, ObjectObs], bool]:
        """One sacct read for current objects that are not in squeue any more."""
        missing: list[ObjectRef] = []
        for job in valid:
            cur = job.state.current
            if cur is None or cur.ref is None:
                continue
            ref = cur.ref
            if not any(same_object(ref, o) for o in live.get(job.state.job_id, ())):
                missing.append(ref)
        if not missing:
            return {}, True
        since = min(r.submit for r in missing) - 60
        since = max(since, now - self.settings.sacct_window_s)
        try:
            return await self.adapter.inspect_many(missing, since=since), True
        except DispatchError as exc:
            log.warning("accounting read failed; jobs that left the queue stay unknown",
                        extra={"error": str(exc)})
            return {}, False

    # ------------------------------------------------------------ writes

    def _save_rejections(self, loaded: Sequence[repo.LoadedJob],
                         previous: dict[str, dict[str, object]], now: int) -> None:
        """Even when Slurm is unreachable, bad rows are marked rejected (no Slurm needed)."""
        rejected = [j for j in loaded if j.state.spec is None]
        if not rejected:
            return
        with self.store.transaction() as tx:
            for job in rejected:
                if repo.save_status(tx, job.state, exists=job.has_status, now=now,
                                    reject_reason=job.reject_reason,
                                    previous=previous.get(job.state.job_id)):
                    repo.add_event(tx, job.state.job_id, "Rejected", job.reject_reason, now=now)
                    self.metrics.endings.labels(phase="rejected", cause="invalid").inc()

    def _commit_plans(self, plans: Sequence[tuple[repo.LoadedJob, Plan]],
                      previous: dict[str, dict[str, object]], now: int) -> None:
        with self.store.transaction() as tx:
            for job, p in plans:
                wrote = repo.save_status(tx, p.status, exists=job.has_status, now=now,
                                         reject_reason=job.reject_reason,
                                         previous=previous.get(job.state.job_id))
                if p.status.spec is None and wrote:
                    repo.add_event(tx, job.state.job_id, "Rejected", job.reject_reason, now=now)
                for upd in p.submissions:
                    repo.save_submission(tx, upd, attempt=p.status.attempt, now=now)
                repo.add_events(tx, p.events, now=now)
                self._count_transitions(job.state, p.status)

    def _count_transitions(self, before: JobState, after: JobState) -> None:
        if after.phase in TERMINAL_PHASES and after.phase != before.phase:
            self.metrics.endings.labels(phase=after.phase.value,
                                        cause=after.cause.kind.value
                                        if after.spec is not None else "invalid").inc()
        for key, used in after.budgets_used.items():
            if used > before.budgets_used.get(key, 0):
                self.metrics.resubmissions.labels(cause=key).inc(used - before.budgets_used.get(
                    key, 0))

    # ------------------------------------------------------------ actions

    async def _apply(self, plans: Sequence[tuple[repo.LoadedJob, Plan]], report: TickReport,
                     now: int) -> None:
        gate = asyncio.Semaphore(self.settings.action_concurrency)

        async def run_job(p: Plan) -> None:
            async with gate:
                for action in p.actions:
                    name = type(action).__name__.lower()
                    try:
                        await self._apply_one(p.status, action, now)
                        report.actions[name] += 1
                    except Exception as exc:
                        # one job's failure never stops the others
                        self.metrics.action_errors.labels(action=name).inc()
                        report.errors.append(f"{p.status.job_id}: {name}: {exc}")
                        log.warning("action failed", extra={"job": p.status.job_id,
                                                            "action": name, "error": str(exc)})
                        self._record_event(p.status.job_id, "ActionFailed",
                                           f"{name}: {type(exc).__name__}: {exc}")
                        if isinstance(exc, TransientError):
                            break

        await asyncio.gather(*(run_job(p) for _, p in plans if p.actions))

    def _record_event(self, job_id: str, kind: str, message: str) -> None:
        try:
            with self.store.transaction() as tx:
                repo.add_event(tx, job_id, kind, message[:2000], now=self.now())
        except DispatchError:
            log.warning("could not record event", extra={"job": job_id, "kind": kind})

    async def _apply_one(self, job: JobState, action: object, now: int) -> None:
        match action:
            case Submit():
                await self._submit(job, action)
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
            case _:
                raise TypeError(f"unknown action {action!r}")

    async def _submit(self, job: JobState, action: Submit) -> None:
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
                self._record_event(action.job_id, "ExclusionDropped",
                                   "no node fits without " + ",".join(action.exclude))
                ref = await self.adapter.start(replace(request, extra_exclude=()))
        except (ErrInvalid, ErrUnsupported) as exc:
            # Slurm refused the submission (bad partition, policy): the job fails with it.
            # Anything else (transport, host key, timeout) leaves the intent for the next
            # tick to adopt or abandon: never a job failure for the operator's problem.
            self._fail_submission(job, action, exc)
            raise
        self.metrics.submissions.inc()
        with self.store.transaction() as tx:
            repo.record_submitted(tx, action.job_id, action.submission, ref)
            repo.add_event(tx, action.job_id, "Submitted",
                           f"submission {action.submission} is Slurm job {ref.id}",
                           now=self.now())
        if action.release:
            await self.adapter.release(ref)

    def _fail_submission(self, job: JobState, action: Submit, exc: DispatchError) -> None:
        failed = replace(job, phase=Phase.FAILED, current=None,
                         cause=Cause(CauseKind.UNRUNNABLE, Provenance.SLURM, str(exc)[:500]))
        with self.store.transaction() as tx:
            repo.save_status(tx, failed, exists=True, now=self.now())
            repo.save_submission(tx, SubmissionUpdate(action.job_id, action.submission,
                                                           "abandoned"),
                                 attempt=action.attempt, now=self.now())
        self.metrics.endings.labels(phase="failed", cause="unrunnable").inc()

    async def _verify_outputs(self, job: JobState, paths: Sequence[str], now: int) -> None:
        missing = await self.adapter.missing_paths(paths)
        with self.store.transaction() as tx:
            if missing:
                p = finish_missing_output(job, missing, now)
                repo.save_status(tx, p.status, exists=True, now=now)
                repo.add_events(tx, p.events, now=now)
                self._count_transitions(job, p.status)
            else:
                repo.save_status(tx, replace(job, outputs_verified=True), exists=True, now=now)
                repo.add_event(tx, job.job_id, "OutputsVerified", "expected outputs present",
                               now=now)

    # ------------------------------------------------------------ gauges

    def _refresh_gauges(self, plans: Sequence[tuple[repo.LoadedJob, Plan]], now: int) -> None:
        states: CountOf[str] = CountOf()
        stale = 0
        oldest = 0
        for _, p in plans:
            st = p.status
            if st.phase in TERMINAL_PHASES:
                continue
            if st.object_state is not None:
                states[st.object_state.value] += 1
            elif st.current is not None:
                states["unknown" if st.unknown_since else "pending"] += 1
            if any(c.type == "Stale" and c.status for c in st.conditions):
                stale += 1
            if st.object_state in (State.PENDING, State.GATED, State.HELD) and st.current:
                oldest = max(oldest, now - st.current.created_at)
        self.metrics.set_object_counts(states)
        self.metrics.stale.set(stale)
        self.metrics.oldest_pending.set(oldest)
        with self.store.transaction() as tx:
            self.metrics.set_phase_counts(repo.phase_counts(tx))
