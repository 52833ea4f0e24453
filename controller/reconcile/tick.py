"""One reconcile tick: load desired state, read Slurm once, plan, apply, record.

The tick is the recipe (``Reconciler._tick``); each part lives where it is owned:
``memory`` (what is remembered of each job, which jobs are planned), ``plan`` (every
decision: phase, status, actions, ownership, whether a job can have no object yet,
which Submits may wait, when to look again), ``apply`` (commits and Slurm writes),
``waves`` (a chunk's actions in flight), ``outcomes`` (what actions found, for the next
plan), ``ownership`` (the sweep), ``gauges``.

Order inside a tick (crash-safe at every line), every write fenced on the lease epoch the
tick began with (``Fence.pin``):
1. read the tracked jobs' row versions from the store (below);
2. one batched live read (``find_many``) and, for current objects that left the
   queue, one batched accounting read (``inspect_many`` with a start window);
   a failed live read ends the tick without touching any other job (bad rows are still
   rejected), and stops the Starts made before it. While the live read runs, the new
   jobs that no Slurm object can belong to (``plan.no_object_yet``) are planned with no
   observation -- what the read would give them -- and submitted (``_fresh``): a new
   row's sbatch does not wait for a read of the whole queue. A leadership's first tick,
   and the ticks after a failed read until one succeeds, plan them after the read;
3. ``plan`` each job that needs it (pure), its row read in full;
4. commit statuses, events and submission *intents* in one transaction (per wave: a
   chunk's plans up to ``action_concurrency`` Submits);
5. apply that wave's Slurm actions (each behind the adapter's identity check) while the
   chunk's next wave is planned and committed (two waves in flight at most); a Submit
   runs gated, its ref is committed, and only then is the gate released (the chunk's
   gates together, once all its Starts have returned);
6. record what the actions returned; sweep our-format objects no tracked job owns
   (only those of ids this database knows are written: ``ownership``).
A crash between 4 and 6 leaves intents and gated objects that the next tick adopts.

Incremental, still level-triggered (what makes a steady-state tick cheap at 100k jobs):

* **load**: every row of ``jobs`` and ``job_status`` carries a version that a trigger
  moves on every write, whoever writes (migration 0002). Each tick reads only
  ``(id, version, status version)`` of the tracked jobs; a job that is new, or whose
  versions moved (a client's change, a row inserted by plain SQL, a status this
  controller -- or another leader, or an operator -- wrote), is planned this tick. The
  reconciler keeps per job only what deciding to skip it needs (``memory.Memo``); the rows of
  the jobs it plans are read in full, a chunk at a time. Without the triggers every job
  is read and planned every tick;
* **read**: still one ``squeue`` per tick; the adapter reuses its observation of each
  byte-identical row (``SlurmAdapter.find_many``);
* **plan**: a job is not planned again when its last plan was *quiet* -- no action, no
  submission row, no event, no status write, no accounting read -- and its inputs are
  the same as then (row versions, live observations, down nodes and settings) and none
  of its clock triggers is due (``Plan.recheck_at``). ``plan`` is pure, so planning it again
  would give the same quiet plan: its status stands. Every job is planned again at least
  every ``replan_s`` (spread by job id), whatever the analysis says;
* **store**: quiet plans write nothing; a steady tick runs no per-row statement.

With many jobs to plan (the first tick after taking the lead), they are loaded, planned
and committed ``plan_chunk`` at a time, each chunk in its own transaction, and each
chunk's actions are applied right after its commit: memory stays bounded, intents are
still committed before their Submit runs, and the jobs likely to act (new ones, ones a
client changed, ones without a plain pending or running object: ``likely_to_act``) are
planned first, so a new leader's first Slurm write comes after one chunk, not after all.
"""

from __future__ import annotations

import asyncio
import logging
import time
import types
from collections.abc import Callable, Coroutine, Generator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import Any, TypeVar

from controller.errors import DispatchError, LeaseLost, OwnershipConflict
from controller.metrics import Metrics
from controller.model.ids import is_job_id
from controller.model.obs import (
    ObjectObs,
    ObjectRef,
)
from controller.reconcile import gauges, standby
from controller.reconcile.apply import Applier
from controller.reconcile.memory import NO_OBS, LastRead, Memo, Memory, Todo, newest_first
from controller.reconcile.outcomes import OutcomeBook
from controller.reconcile.ownership import Owner, Sweeper
from controller.reconcile.placement import Clusters
from controller.reconcile.plan import (
    Observed,
    Plan,
    PlanContext,
    Submit,
    live_settles_accounting,
    needs_accounting,
    no_object_yet,
    plan,
)
from controller.reconcile.ports import ClusterStats, Fence, NoFence, SchedulerPort
from controller.reconcile.report import TickReport
from controller.reconcile.settings import ReconcileConfig
from controller.reconcile.waves import Acts
from controller.store import repo
from controller.store.db import Store

log = logging.getLogger("dispatch.tick")

Clock = Callable[[], float]


# the ``[reconcile]`` settings (``controller.reconcile.settings``: their one definition)
TickSettings = ReconcileConfig

__all__ = ["Clock", "Reconciler", "TickReport", "TickSettings"]

# the log line of each way the cluster can fail to be read (``Reconciler._unreachable``)
_UNREACHABLE = {
    "live read": "slurm live read failed; no job with a status changes this tick",
    "ownership marker": "cannot read the ownership marker; no job with a status changes "
                        "this tick",
}


def _never() -> bool:
    return False


T = TypeVar("T")

# a tick takes on no further chunk once its wall time reaches this many budgets (the
# daemon's budget is a third of the lease TTL): waits, and the other shards' ticks that
# run meanwhile, count there and nowhere else (``Reconciler._spent``)
WALL_BUDGETS = 3


class OwnTime:
    """The time a coroutine spends running -- its steps on the event loop, between the
    awaits that suspend it -- and not the time it waits: for a subprocess, a thread, or
    the other tasks the loop runs meanwhile (``driven``)."""

    def __init__(self, timer: Clock) -> None:
        self.timer = timer
        self.seconds = 0.0  # the steps that ended
        self.step_began: float | None = None  # the step running now, if any

    def now(self) -> float:
        """Every step so far, the one running now included."""
        began = self.step_began
        return self.seconds + (0.0 if began is None else self.timer() - began)


@types.coroutine
def driven(coro: Coroutine[Any, Any, T], own: OwnTime) -> Generator[Any, Any, T]:
    """Await ``coro``, adding the time of each of its steps to ``own``: whatever it
    yields to the loop is passed up, whatever the loop sends or throws (a result, a
    cancellation) is passed down."""
    value: Any = None
    error: BaseException | None = None
    while True:
        own.step_began = began = own.timer()
        try:
            step = coro.send(value) if error is None else coro.throw(error)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        finally:  # (a step that returned, raised or yielded)
            own.seconds += own.timer() - began
            own.step_began = None
        try:
            value, error = (yield step), None
        except BaseException as exc:  # (passed down to ``coro``)
            value, error = None, exc


class Reconciler:
    """Owns one tick; everything it needs is injected."""

    def __init__(self, store: Store, adapter: SchedulerPort, *, metrics: Metrics,
                 clock: Clock = time.time, settings: TickSettings | None = None,
                 fence: Fence | None = None, budget_s: float | None = None,
                 clusters: Clusters | None = None,
                 timer: Clock = time.perf_counter) -> None:
        self.store = store
        # the configured clusters and this shard's (None: one cluster, no placement):
        # this reconciler plans only the jobs placed on its cluster, or not placed yet
        # and belonging to it (``controller.reconcile.placement``)
        self.clusters = clusters
        self.here = clusters.here if clusters is not None else None
        # after this many seconds a tick takes on no further chunk of jobs (the daemon
        # passes a third of the lease TTL); None: no bound
        self.budget_s = budget_s
        # while true, the tick in progress takes on no further chunk (its shard is being
        # given up: a cold first tick of a shard this replica lets go is not finished
        # first; the driving ``Shard`` sets it)
        self.stop_when: Callable[[], bool] = _never
        # the time the tick in progress spent running, not waiting (``_spent``)
        self._own = OwnTime(timer)
        # the monotonic clock of the budget and the phase timings (injected: a simulator
        # runs it in virtual time)
        self.timer = timer
        # the leader lease: fences every write transaction and every Slurm write
        self.fence: Fence = fence if fence is not None else NoFence()
        self.adapter = adapter
        self.metrics = metrics
        self.clock = clock
        self.settings = settings or TickSettings()
        self.cluster_stats: ClusterStats | None = None
        self.last_success: float | None = None
        # whether the last live read succeeded (None: none made yet): set as soon as the
        # read returns, before the tick ends (``dispatch_slurm_up``, ``/readyz``)
        self.slurm_ok: bool | None = None
        # the action outcomes not planned yet: they live and die with their job
        self.outcomes = OutcomeBook()
        # what the last ticks learned of each tracked job (``controller.reconcile.memory``)
        self.memory = Memory(store, cluster=adapter.cluster, here=self.here,
                             clusters=clusters, settings=self.settings,
                             outcomes=self.outcomes)
        # ownership and the sweep of our-format jobs no tracked job owns
        self.sweeper = Sweeper(store, adapter, metrics=metrics, settings=self.settings)
        # that no other database with this deployment's id acts on the cluster
        self.owner = Owner(store, adapter, metrics=metrics, settings=self.settings)
        # the database and Slurm writes of a tick's plans
        self.applier = Applier(store, adapter, metrics=metrics, settings=self.settings,
                               memory=self.memory, outcomes=self.outcomes, clock=clock,
                               here=self.here)
        # the dispatch job ids that had any object of ours in the last complete live read
        # of this leadership; None: none yet (``_fresh``)
        self._seen: LastRead | None = None
        # the ids Started since the read behind ``_seen`` began (``Applier.starts`` of
        # that tick and the next): their objects may be missing from that read
        self._started_before_read: set[str] = set()
        # when the phase counts are read next (``reconcile.phase_counts_s``)
        self._phases_due = 0
        # (memory generation, the ids the live read asks for, tracked jobs) of the last
        # tick: the same list again while no memo changed (``_load``)
        self._wanted: tuple[int, list[str], int] | None = None
        # (memory generation, the gauges' summary of every memo) of the last tick
        self._gauges: tuple[int, gauges.Summary] | None = None

    def forget(self) -> None:
        """Drop everything remembered across ticks: the next tick loads every job and
        plans every job (call it when leadership was lost and taken again)."""
        self.memory.forget()
        self.outcomes.clear()
        self.sweeper.forget()
        self.owner.forget()
        self._seen = None
        self.applier.starts = set()
        self._started_before_read = set()

    def lead(self) -> None:
        """This replica has just taken the lease: forget what only a leader's own ticks
        may trust -- action outcomes, the last read's ids, Starts in flight, the
        ownership claim, the sweep -- and keep what shadow ticks remembered
        (``controller.reconcile.standby``): the first tick as leader reads the change
        feed since their last mark and makes its own live read, so it plans the jobs
        whose rows or observations moved, not every job. Without shadow ticks (or after
        ``forget``) it loads and plans every job."""
        self.outcomes.clear()
        self.sweeper.forget()
        self.owner.forget()
        self._seen = None
        self.applier.starts = set()
        self._started_before_read = set()

    async def shadow(self, *, until: Callable[[], bool] = _never) -> TickReport:
        """A standby's read-only tick (``controller.reconcile.standby``): the change feed,
        one live read, and quiet plans remembered; nothing written anywhere. It is not
        bound by the tick's budget (the first one plans every job, a chunk at a time,
        yielding between chunks); it stops between chunks once ``until()`` holds (the
        lease may be taken now: the takeover must not wait for it). A failed read is
        logged and leaves the memory as it was."""
        report = TickReport()
        began = self.timer()
        ctx = self._context(self.now())
        try:
            await standby.shadow(self.memory, self.adapter, ctx,
                                 chunk=self.settings.plan_chunk, report=report,
                                 spent=until)
        except DispatchError as exc:
            report.slurm_ok = False
            report.errors.append(f"shadow read: {exc}")
            log.info("shadow tick: read failed", extra={"error": str(exc)})
        except Exception as exc:  # a standby's bug never stops its shard's loop
            report.errors.append(f"shadow: {exc}")
            log.exception("shadow tick crashed")
        report.duration_s = self.timer() - began
        return report

    def now(self) -> int:
        return int(self.clock())

    def _write(self) -> AbstractContextManager[Any]:
        """A write transaction fenced on the tick's epoch (``Applier.write``)."""
        return self.applier.write()

    async def tick(self) -> TickReport:
        started = self.timer()
        report = TickReport()
        # every write of this tick is fenced on the epoch it begins with
        self.applier.fence = self.fence.pin()
        self._own = OwnTime(self.timer)
        try:
            await driven(self._tick(report), self._own)
        finally:
            report.duration_s = self.timer() - started
            self.metrics.tick_duration.observe(report.duration_s)
        result = "ok" if report.slurm_ok else "slurm-unreachable"
        self.metrics.ticks.labels(result=result).inc()
        if report.slurm_ok:
            self.last_success = self.clock()
            self.metrics.last_tick.set(self.last_success)
        return report

    async def _tick(self, report: TickReport) -> None:
        """The recipe: load, read (submitting what needs no read meanwhile), select,
        plan and apply chunk by chunk, sweep, publish."""
        now = self.now()
        began = self.timer()
        self.memory.begin()
        if not await self._owned(now, report):
            return
        memos, wanted = self._load(report)
        ctx = self._context(now)
        epoch = self.memory.plan_epoch(ctx)
        for phase in ("read", "select", "plan", "store", "apply"):
            report.timings[phase] = 0.0
        read = await self._read(memos, wanted, ctx, epoch=epoch, report=report, began=began)
        if read is None:  # the live read failed: no job with a status changes
            self._save_rejections(now)
            return
        live, strays, fresh, slots = read
        todo = self._select(live, now, epoch, planned=fresh, report=report)
        acct = await self._read_accounting(todo, now, report)
        await self._plan_all(todo, acct, ctx=ctx, epoch=epoch, slots=slots, report=report,
                             began=began)
        self.metrics.accounting_up.set(1 if report.accounting_ok else 0)
        self.memory.end()
        t0 = self.timer()
        await self.sweeper.run(strays, memos, report=report, now=now, write=self._write,
                               guard=self.applier.fence.guard,
                               record_event=self.applier.record_event)
        report.replan_soon = bool(self.outcomes) or report.deferred > 0
        report.timings["apply"] += self.timer() - t0
        t0 = self.timer()
        # the phase counts read every status row of the cluster (an index range): again
        # when rows changed or plans were made (their writes), else every
        # ``phase_counts_s``
        phases = bool(report.changed_rows or report.planned) or now >= self._phases_due
        if phases:
            self._phases_due = now + self.settings.phase_counts_s
        summary = self._gauges
        if summary is None or summary[0] != self.memory.generation:
            summary = self._gauges = (self.memory.generation,
                                      gauges.summarize(self.memory.gauges()))
        gauges.refresh(self.metrics, summary[1], store=self.store, here=self.here,
                       clusters=self.clusters, now=now, phases=phases)
        report.timings["gauges"] = self.timer() - t0

    async def _owned(self, now: int, report: TickReport) -> bool:
        """The ownership marker, before anything of the tick acts (``Owner``): claimed
        at a takeover, checked now and then; a conflict raises. A marker that cannot be
        read (the cluster's host unreachable) makes the tick one of a failed read: it
        changes no job with a status."""
        try:
            await self.owner.ensure(now=now, write=self._write)
        except (OwnershipConflict, LeaseLost):
            raise
        except DispatchError as exc:
            self._unreachable(report, "ownership marker", exc)
            self._save_rejections(now)
            return False
        return True

    def _unreachable(self, report: TickReport, what: str, exc: DispatchError) -> None:
        """The cluster could not be read (the live read, or the ownership marker): the
        tick changes no job with a status, ``slurm_up`` drops, and no new job is
        submitted unread again until a read succeeds."""
        report.slurm_ok = False
        report.errors.append(f"{what}: {exc}")
        self.slurm_ok = False
        self.metrics.slurm_up.set(0)
        self._seen = None
        log.warning(_UNREACHABLE[what], extra={"error": str(exc)})

    def _load(self, report: TickReport) -> tuple[dict[str, Memo], list[str]]:
        """The tracked jobs (their row versions), and the ids the live read asks for:
        the rows not validated yet too (their observations are ignored if they turn out
        invalid); never a malformed id, nor a job another cluster's shard plans."""
        t0 = self.timer()
        memos = self.memory.track(report)
        known = self._wanted
        if known is None or known[0] != self.memory.generation:
            wanted = self.memory.wanted()
            tracked = len(memos) - sum(1 for memo in memos.values() if memo.elsewhere)
            self._wanted = known = (self.memory.generation, wanted, tracked)
        _, wanted, report.tracked = known
        self.metrics.tracked.set(report.tracked)
        report.timings["load"] = self.timer() - t0
        return memos, wanted

    def _context(self, now: int) -> PlanContext:
        down = self.cluster_stats.down_nodes if self.cluster_stats else frozenset()
        return PlanContext(now=now, unknown_grace_s=self.settings.unknown_grace_s,
                           adopt_window_s=self.settings.adopt_window_s, down_nodes=down,
                           clusters=self.clusters)

    async def _read(self, memos: dict[str, Memo], wanted: list[str], ctx: PlanContext, *,
                    epoch: int, report: TickReport, began: float,
                    ) -> tuple[Mapping[str, Sequence[ObjectObs]], dict[str, list[ObjectObs]],
                               set[str], int] | None:
        """One squeue per tick, even with nothing tracked (the sweep needs it), while the
        new jobs that no object can belong to are planned and submitted (``_fresh``):
        the live observations, the strays (our-format objects of no tracked job), the ids
        planned before the read and the submit slots left; None when the read failed."""
        t0 = self.timer()
        strays: dict[str, list[ObjectObs]] = {}
        found: list[Mapping[str, Sequence[ObjectObs]]] = []
        read_done: list[float] = []
        slots = max(1, self.settings.submit_slice)

        async def read_live() -> None:
            # the observations go to ``found``, not to the task's result: a finished
            # task can sit in a reference cycle until the cyclic collector runs, and
            # with it every list of a 100k-job read
            try:
                found.append(await self.adapter.find_many(wanted, strays=strays))
            except DispatchError:
                self.slurm_ok = False  # seen now, not when the tick ends
                self.metrics.slurm_up.set(0)
                raise
            finally:
                read_done.append(self.timer())

        # the Starts made since the last read began may be missing from ``_seen``; those
        # of this tick (and later ones) may be missing from this read
        self._started_before_read = self.applier.starts
        self.applier.starts = set()
        read = asyncio.ensure_future(read_live())
        fresh: set[str] = set()
        before = asyncio.ensure_future(self._fresh(memos, ctx, epoch=epoch, slots=slots,
                                                   report=report, began=began))
        # a failed read stops the Starts made before it at once (the slurmctld they wait
        # on is likely down): their intents are committed, so the next tick adopts or
        # abandons whatever they made -- the shard's tick is never held by them
        read.add_done_callback(lambda done: done.cancelled() or done.exception() is None
                               or before.cancel())
        live: Mapping[str, Sequence[ObjectObs]] | None = None
        try:
            try:
                fresh, slots = await before
            except asyncio.CancelledError:
                if not read.done() or read.cancelled() or read.exception() is None:
                    raise  # the tick itself was cancelled
                report.deferred += 1
        finally:
            try:
                await read
                live = found.pop()
            except DispatchError as exc:
                self._unreachable(report, "live read", exc)
            else:
                self.slurm_ok = True
                self.metrics.slurm_up.set(1)
                self._seen = LastRead(live, strays)
            report.timings["read"] = (read_done[0] if read_done
                                      else self.timer()) - t0
        return None if live is None else (live, strays, fresh, slots)

    def _select(self, live: Mapping[str, Sequence[ObjectObs]], now: int, epoch: int, *,
                planned: set[str], report: TickReport) -> list[Todo]:
        """The jobs to plan after the read, in order (``Memory``): a few are read in full
        at once; many (a new leader's first tick) go the likely actors first and are
        read a chunk at a time as they are planned."""
        t0 = self.timer()
        memory = self.memory
        todo = memory.unsettled(live, now, epoch, report, planned=planned)
        if len(todo) <= max(1, self.settings.plan_chunk):
            todo.sort(key=newest_first)  # stable: a burst keeps its order
            todo = memory.with_rows(memory.past_slice(todo, epoch, report), report)
        else:
            memory.order(todo, report)
            todo = memory.past_slice(todo, epoch, report)
        report.timings["select"] += self.timer() - t0
        return todo

    async def _read_accounting(self, todo: Sequence[Todo], now: int,
                               report: TickReport) -> dict[ObjectRef, ObjectObs]:
        """One sacct read, before any plan, for the current objects that left squeue of
        the jobs squeue shows no settling object of (``plan.live_settles_accounting``:
        the jobs that ended, vanished or were cancelled -- few, however many are
        tracked); their refs alone are read, not every job's (a new leader of 1M jobs
        read every job's current ref first, 15 s, and its budget was spent before it
        planned). The other jobs' refs are checked as their chunk's rows are read
        (``_plan_all``)."""
        t0 = self.timer()
        acct, acct_ok = await self._accounting(
            [item for item in todo if not live_settles_accounting(item.seen)], now)
        report.accounting_ok = acct_ok
        report.timings["read"] += self.timer() - t0
        return acct

    async def _plan_all(self, todo: list[Todo], acct: dict[ObjectRef, ObjectObs], *,
                        ctx: PlanContext, epoch: int, slots: int, report: TickReport,
                        began: float) -> None:
        """Plan and apply ``todo`` a chunk at a time, until the tick's budget is spent:
        the first chunk always goes, whatever ``_fresh`` spent (jobs with a status --
        cancels, endings, resubmissions -- are never starved by a stream of new rows);
        the rest waits for the next tick, at once (it reads Slurm again first). A chunk
        whose rows name a current object that left squeue and was not read up front (a
        job squeue shows another object of: rare) gets its own accounting read."""
        chunk = max(1, self.settings.plan_chunk)
        for start in range(0, len(todo), chunk):
            if start and self._spent(began):
                report.deferred += len(todo) - start
                for item in todo[start:]:
                    item.row = None
                break
            t0 = self.timer()
            part = self.memory.with_rows(todo[start:start + chunk], report)
            report.timings["select"] += self.timer() - t0
            t0 = self.timer()
            more, more_ok = await self._accounting(
                [item for item in part if not item.needs_accounting], ctx.now)
            acct.update(more)
            report.accounting_ok = report.accounting_ok and more_ok
            report.timings["read"] += self.timer() - t0
            slots = await self._plan_chunk(part, acct, report.accounting_ok, ctx=ctx,
                                           epoch=epoch, slots=slots, report=report)
            del part  # this chunk's rows go now, not when the next chunk's replace them
            # let the loop run between chunks (other shards' ticks, lease renewals): a
            # long first tick is many short pieces, never one block; the time they take
            # is not this tick's (``_spent``)
            await asyncio.sleep(0)

    def _spent(self, began: float) -> bool:
        """The tick begun at ``began`` is past its time budget, or asked to stop
        (``stop_when``): it takes on no further chunk (the first always goes). The
        budget counts the tick's own time (``OwnTime``): its steps on the loop, not its
        waits, in which the other shards' ticks run (ten cold shards of 100k on one loop
        each planned a single chunk per 20 s tick, and read squeue again for the next);
        its wall time is bound too, by ``WALL_BUDGETS`` budgets."""
        budget = self.budget_s
        return ((budget is not None
                 and (self._own.now() > budget
                      or self.timer() - began > WALL_BUDGETS * budget))
                or self.stop_when())

    async def _fresh(self, memos: dict[str, Memo], ctx: PlanContext, *, epoch: int,
                     slots: int, report: TickReport, began: float) -> tuple[set[str], int]:
        """Plan and submit, while the tick's live read runs, the new jobs that no Slurm
        object can belong to; their ids, and the submit slots left.

        Such a job has no status row (so no intent was ever committed for it, and every
        sbatch of ours follows a committed intent) and its name was not in the last
        complete live read of this leadership (``_seen``: an object that existed then
        would be there; one made since would be ours, after an intent). Its plan is the
        planner's with no observation, which is exactly what the read would give it: the
        decision does not wait for the read. The first tick of a leadership (nothing
        read yet) plans every job after the read, as before. They are planned newest
        first, a chunk at a time, until ``slots`` Submits are made or the tick's budget
        is spent; the rest wait for the next tick, unread (``deferred``)."""
        if self._seen is None:
            return set(), slots
        t0 = self.timer()
        seen, pending = self._seen, self.outcomes
        started = self._started_before_read
        # the new rows of this shard (no status row: the planner's first input), whose
        # tombstones the decision needs too
        new = [job_id for job_id, memo in memos.items()
               if memo.status_version is None and not memo.elsewhere
               and memo.valid is not False and job_id not in pending and is_job_id(job_id)]
        gone: set[str] = set()
        if new:
            with self.store.transaction() as tx:
                gone = repo.tombstoned(tx, new)
        candidates = [job_id for job_id in new
                      if no_object_yet(job_id, has_status=False, last_read=seen,
                                       started_since_read=started, tombstoned=gone)]
        todo = [Todo(job_id, memos[job_id], NO_OBS) for job_id in candidates]
        if not todo:
            report.timings["select"] += self.timer() - t0
            return set(), slots
        todo.sort(key=newest_first)  # stable: a burst keeps its order
        planned = {item.job_id for item in todo}
        report.timings["select"] += self.timer() - t0
        # a chunk (at most the slots left) at a time, until the slots are used (a row
        # that turns out invalid, or stopped, takes none) or the tick's budget is spent
        done = 0
        while done < len(todo) and slots > 0 and not (done and self._spent(began)):
            t0 = self.timer()
            piece = todo[done:done + min(slots, max(1, self.settings.plan_chunk))]
            done += len(piece)
            part = self.memory.with_rows(piece, report)
            report.timings["select"] += self.timer() - t0
            slots = await self._plan_chunk(part, {}, True, ctx=ctx, epoch=epoch,
                                           slots=slots, report=report)
        report.deferred += len(todo) - done
        return planned, slots

    async def _plan_chunk(self, part: list[Todo], acct: dict[ObjectRef, ObjectObs],
                          acct_ok: bool, *, ctx: PlanContext, epoch: int, slots: int,
                          report: TickReport) -> int:
        """Plan one chunk of jobs (their rows read), commit and act in waves
        (``Applier.launch``), then release its recorded Submits; the submit slots left."""
        t0 = self.timer()
        acts = Acts(self.settings.action_concurrency)
        plans: list[tuple[repo.LoadedJob, Plan]] = []
        outcomes: list[tuple[Todo, Plan | None]] = []
        submits = 0
        try:
            for item in part:
                job = item.row
                assert job is not None
                try:
                    cur = job.state.current
                    acct_obs = acct.get(cur.ref) if cur and cur.ref else None
                    item.outcomes = self.outcomes.of(job.state.job_id)
                    observed = Observed(live=tuple(item.seen), accounting=acct_obs,
                                        accounting_ok=acct_ok, outcomes=item.outcomes)
                    p = plan(job.state, observed, ctx)
                except Exception as exc:  # one job's bug never stops the others
                    log.exception("planning failed", extra={"job": job.state.job_id})
                    report.errors.append(f"{job.state.job_id}: plan: {exc}")
                    outcomes.append((item, None))
                    continue
                if any(isinstance(action, Submit) for action in p.actions):
                    if slots == 0:
                        # past this tick's submit slice: the plan is dropped unwritten
                        # (plan is pure: the next tick, at once, makes it again, from
                        # the row as validated now unless the row moves)
                        report.deferred += 1
                        self.memory.postpone(item, epoch)  # (``Memory.past_slice``)
                        self.memory.carry(job)
                        item.row = None
                        continue
                    slots -= 1
                    submits += 1
                plans.append((job, p))
                outcomes.append((item, p))
                if submits >= acts.wave:
                    # a wave of Submits: committed and started now, while the rest
                    # of the chunk is planned (the Start batches never run dry)
                    report.timings["plan"] += self.timer() - t0
                    self.applier.launch(plans, outcomes, acts, ctx=ctx, epoch=epoch, report=report)
                    plans, outcomes, submits = [], [], 0
                    await acts.room()
                    await asyncio.sleep(0)  # the wave's Starts are queued now
                    t0 = self.timer()
                elif acts.busy and len(outcomes) % _YIELD_EVERY == 0:
                    # a wave is in flight: let its Start batches be spawned and
                    # their outcomes handled while this one is planned
                    await asyncio.sleep(0)
            report.timings["plan"] += self.timer() - t0
            self.applier.launch(plans, outcomes, acts, ctx=ctx, epoch=epoch, report=report)
        except asyncio.CancelledError:
            acts.cancel()  # (a failed read: ``_tick``) no Start of this chunk waits on
            raise
        finally:
            # this chunk's actions end before the next chunk (or the tick's end), also
            # when a commit failed: nothing of this chunk acts after that
            await acts.drain(report)
        await self.applier.release(acts, report, ctx.now)
        return slots

    # ------------------------------------------------------------ reads

    async def _accounting(self, todo: Sequence[Todo],
                          now: int) -> tuple[dict[ObjectRef, ObjectObs], bool]:
        """One sacct read for current objects of ``todo``'s jobs that are not in squeue
        any more (a job whose current object is missing is never skipped); the refs of
        the jobs whose rows are not read yet are read alone, a chunk at a time."""
        missing: list[ObjectRef] = []
        chunk = max(1, self.settings.plan_chunk)
        for start in range(0, len(todo), chunk):
            part = todo[start:start + chunk]
            refs: dict[str, ObjectRef | None] = {}
            unread = [item.job_id for item in part if item.row is None]
            if unread:  # many jobs to plan: their refs alone, not their rows
                with self.store.transaction() as tx:
                    refs = repo.current_refs(tx, self.adapter.cluster, unread)
            for item in part:
                if item.row is not None:
                    state = item.row.state
                    cur = state.current
                    ref = cur.ref if cur is not None and state.spec is not None else None
                else:
                    ref = refs.get(item.job_id)
                if ref is not None and needs_accounting(ref, item.seen):
                    # not in squeue, or cancelled there by someone sacct will name
                    item.needs_accounting = True
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

    def _save_rejections(self, now: int) -> None:
        """Even when Slurm is unreachable, bad rows are marked rejected (no Slurm needed):
        the rows not validated yet are read, a chunk at a time."""
        unchecked = self.memory.unchecked()
        if unchecked:
            self.memory.generation += 1  # (their validity is learned here)
        chunk = max(1, self.settings.plan_chunk)
        for start in range(0, len(unchecked), chunk):
            with self._write() as tx:
                loaded = repo.load_tracked(tx, self.adapter.cluster,
                                           ids=unchecked[start:start + chunk])
                for job in loaded:
                    if self.memory.elsewhere(job):
                        continue  # the default cluster's shard rejects it
                    memo = self.memory.memos.get(job.state.job_id)
                    if memo is not None and (memo.version, memo.status_version) == (
                            job.version, job.status_version):
                        memo.valid = job.state.spec is not None  # not read again
                    if job.state.spec is not None:
                        continue
                    if repo.save_status(tx, replace(job.state, cluster=self.here),
                                        exists=job.has_status, now=now,
                                        reject_reason=job.reject_reason,
                                        previous=job.previous):
                        repo.add_event(tx, job.state.job_id, "Rejected", job.reject_reason,
                                       now=now)
                        self.metrics.endings.labels(phase="rejected", cause="invalid").inc()

# plans made between two yields to the event loop while a wave acts (``_plan_chunk``)
_YIELD_EVERY = 16
