"""One reconcile tick: load desired state, read Slurm once, plan, apply, record.

Order inside a tick (crash-safe at every line):
1. read the tracked jobs' row versions from the store (below);
2. one batched live read (``find_many``) and, for current objects that left the
   queue, one batched accounting read (``inspect_many`` with a start window);
   a failed live read ends the tick without touching any other job (bad rows are still
   rejected). While the live read runs, the new jobs that no Slurm object can belong to
   (no status row, so no intent ever; a name absent from the last complete read of this
   leadership) are planned with no observation -- what the read would give them -- and
   submitted (``_fresh``): a new row's sbatch does not wait for a read of the whole
   queue. A leadership's first tick, and the ticks after a failed read until one
   succeeds, plan them after the read;
3. ``plan`` each job that needs it (pure), its row read in full;
4. commit statuses, events and submission *intents* in one transaction (per wave: a
   chunk's plans up to ``action_concurrency`` Submits);
5. apply that wave's Slurm actions (each behind the adapter's identity check) while the
   chunk's next wave is planned and committed (two waves in flight at most); a Submit
   runs gated, its ref is committed, and only then is the gate released (the chunk's
   gates together, once all its Starts have returned);
6. record what the actions returned.
A crash between 4 and 6 leaves intents and gated objects that the next tick adopts.

Incremental, still level-triggered (what makes a steady-state tick cheap at 100k jobs):

* **load**: every row of ``jobs`` and ``job_status`` carries a version that a trigger
  moves on every write, whoever writes (migration 0002). Each tick reads only
  ``(id, version, status version)`` of the tracked jobs; a job that is new, or whose
  versions moved (a client's change, a row inserted by plain SQL, a status this
  controller -- or another leader, or an operator -- wrote), is planned this tick. The
  reconciler keeps per job only what deciding to skip it needs (``_Memo``); the rows of
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
client changed, ones without a plain pending or running object: ``_likely_to_act``) are
planned first, so a new leader's first Slurm write comes after one chunk, not after all.
"""

from __future__ import annotations

import asyncio
import logging
import time
import zlib
from collections import Counter as CountOf
from collections.abc import Callable, Container, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
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
from controller.model.ids import JobID, is_job_id
from controller.model.job import (
    TERMINAL_PHASES,
    JobState,
    PlannedEvent,
)
from controller.model.obs import (
    ObjectObs,
    ObjectRef,
    StartRequest,
    State,
)
from controller.reconcile import placement
from controller.reconcile.placement import Clusters
from controller.reconcile.plan import (
    Cancel,
    CheckStarted,
    Hold,
    Observed,
    Outcome,
    OutcomeKind,
    Plan,
    PlanContext,
    Release,
    Submit,
    VerifyOutputs,
    cancel_needs_accounting,
    no_object_yet,
    plan,
    same_object,
    sweep,
)
from controller.reconcile.ports import ClusterStats, Fence, NoFence, SlurmPort
from controller.reconcile.settings import ReconcileConfig
from controller.store import repo
from controller.store.db import Store

log = logging.getLogger("dispatch.tick")

Clock = Callable[[], float]


# the ``[reconcile]`` settings (``controller.reconcile.settings``: their one definition)
TickSettings = ReconcileConfig


@dataclass(slots=True)
class TickReport:
    tracked: int = 0
    planned: int = 0
    skipped: int = 0  # tracked jobs whose unchanged, quiet plan was not made again
    reloaded: int = 0  # rows read in full this tick (every row on a full load)
    full_load: bool = False
    actions: CountOf[str] = field(default_factory=CountOf)
    errors: list[str] = field(default_factory=list)
    slurm_ok: bool = True
    accounting_ok: bool = True
    duration_s: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)
    # action outcomes (sbatch refused/deferred, outputs checked) wait for the next plan of
    # their jobs, or work was left for the next tick (``deferred``): tick again at once
    # rather than after the full interval
    replan_soon: bool = False
    # jobs left unplanned for the next tick: past the submit slice or the time budget
    deferred: int = 0
    # the clusters this tick's plans moved jobs to (their shards should tick soon)
    moved_to: set[str] = field(default_factory=set)


class Reconciler:
    """Owns one tick; everything it needs is injected."""

    def __init__(self, store: Store, adapter: SlurmPort, *, metrics: Metrics,
                 clock: Clock = time.time, settings: TickSettings | None = None,
                 fence: Fence | None = None, budget_s: float | None = None,
                 clusters: Clusters | None = None) -> None:
        self.store = store
        # the configured clusters and this shard's (None: one cluster, no placement):
        # this reconciler plans only the jobs placed on its cluster, or not placed yet
        # and belonging to it (``controller.reconcile.placement``)
        self.clusters = clusters
        self.here = clusters.here if clusters is not None else None
        # after this many seconds a tick takes on no further chunk of jobs (the daemon
        # passes a third of the lease TTL); None: no bound
        self.budget_s = budget_s
        self._ticks = 0  # ticks begun: a _Memo's birth, for new-rows-first
        # the leader lease: fences every write transaction and every Slurm write
        self.fence: Fence = fence if fence is not None else NoFence()
        # the fence of the tick in progress: the lease at the epoch the tick began with
        # (``Fence.pin``): a lease lost and taken again behind it fences it out
        self._fence: Fence = self.fence
        self.adapter = adapter
        self.metrics = metrics
        self.clock = clock
        self.settings = settings or TickSettings()
        self.cluster_stats: ClusterStats | None = None
        self.last_success: float | None = None
        self._memos: dict[str, _Memo] = {}  # tracked job id -> what the last ticks learned
        self._loaded = False  # _memos holds every tracked job as of the last tick
        self._versions_kept: bool | None = None  # the version triggers are in place
        # the validated rows of the jobs the last tick planned without settling them
        # (they are planned again now): (jobs.version, (spec, policy, desired)) by job id
        self._validated: repo.SpecCache = {}
        self._carried: repo.SpecCache = {}
        # the dispatch job ids that had any object of ours in the last complete live read
        # of this leadership; None: none yet (``_fresh``)
        self._seen: set[str] | None = None
        # the ids Started since the read behind ``_seen`` began (their objects may be
        # missing from it)
        self._started_since_read: set[str] = set()
        self._started_since_read_before: set[str] = set()
        # the action outcomes not planned yet, by job id (``_note_outcome``): they live
        # and die with the tracked job (``_forget_jobs``)
        self._outcomes: dict[str, list[Outcome]] = {}
        # the ids of the unowned objects last saved (``_sweep``): saved again on change
        self._unowned: frozenset[tuple[str, int]] | None = None
        self._pruned_at = 0  # when tombstones were last pruned
        self._epoch = 0  # moves when a plan input shared by every job changes
        self._epoch_key: tuple[object, ...] | None = None
        self._warned = False
        # the refs of Submits that return together are recorded in one transaction
        self._records: Coalescer[_Recorded, bool] = Coalescer(self._record_many, limit=256)

    def forget(self) -> None:
        """Drop everything remembered across ticks: the next tick loads every job and
        plans every job (call it when leadership was lost and taken again)."""
        self._memos = {}
        self._validated = {}
        self._seen = None
        self._started_since_read = set()
        self._outcomes = {}
        self._unowned = None
        self._loaded = False
        self._epoch_key = None

    async def prewarm(self) -> None:
        """A standby about to take the lease over: make the live read its first tick needs
        (read-only), so the adapter parses the whole queue now and the new leader reuses
        every unchanged row. Nothing is remembered here but the adapter's row cache: the
        first tick as leader still loads and plans every job (``forget``)."""
        try:
            with self.store.transaction() as tx:
                ids = [job_id for job_id, _, _ in repo.tracked_versions(tx, self.here)
                       if is_job_id(job_id)]
            await self.adapter.find_many(ids, strays={})
        except DispatchError as exc:
            log.info("prewarm read failed", extra={"error": str(exc)})

    def now(self) -> int:
        return int(self.clock())

    @contextmanager
    def _write(self) -> Iterator[Any]:
        """A write transaction, fenced: its first statement checks that the lease is still
        ours (``LeaseLost`` rolls it back whole)."""
        self._fence.refresh()  # a long tick keeps its lease between two writes
        with self.store.transaction() as tx:
            self._fence.check(tx)
            yield tx

    async def tick(self) -> TickReport:
        started = time.perf_counter()
        report = TickReport()
        # every write of this tick is fenced on the epoch it begins with
        self._fence = self.fence.pin()
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
        self._ticks += 1
        began = t0 = time.perf_counter()
        memos = self._track(report)
        # the rows not validated yet are asked for too (their observations are ignored
        # if they turn out invalid); a malformed id never reaches the adapter; nor does
        # a job another cluster's shard plans
        wanted = [job_id for job_id, memo in memos.items()
                  if not memo.elsewhere and (
                      memo.valid or (memo.valid is None and is_job_id(job_id)))]
        report.tracked = len(memos) - sum(1 for memo in memos.values() if memo.elsewhere)
        self.metrics.tracked.set(report.tracked)
        report.timings["load"] = time.perf_counter() - t0

        down = self.cluster_stats.down_nodes if self.cluster_stats else frozenset()
        ctx = PlanContext(now=now, unknown_grace_s=self.settings.unknown_grace_s,
                          adopt_window_s=self.settings.adopt_window_s, down_nodes=down,
                          clusters=self.clusters)
        epoch = self._plan_epoch(ctx)
        self._carried = {}
        for phase in ("read", "select", "plan", "store", "apply"):
            report.timings[phase] = 0.0
        slots = max(1, self.settings.submit_slice)

        # one squeue per tick, even with nothing tracked: the sweep of strays needs it.
        # It runs while the new jobs that no object can belong to are planned and
        # submitted (``_fresh``): their plans need no observation
        t0 = time.perf_counter()
        strays: dict[str, list[ObjectObs]] = {}  # our dj- objects that no tracked job owns
        found: list[dict[str, list[ObjectObs]]] = []
        read_done: list[float] = []

        async def read_live() -> None:
            # the observations go to ``found``, not to the task's result: a finished
            # task can sit in a reference cycle until the cyclic collector runs, and
            # with it every list of a 100k-job read
            try:
                found.append(await self.adapter.find_many(wanted, strays=strays))
            except DispatchError:
                self.metrics.slurm_up.set(0)  # seen now, not when the tick ends
                raise
            finally:
                read_done.append(time.perf_counter())

        # the Starts made since the last read began may be missing from ``_seen``; those
        # of this tick (and later ones) may be missing from this read
        self._started_since_read_before = self._started_since_read
        self._started_since_read = set()
        read = asyncio.ensure_future(read_live())
        fresh: set[str] = set()
        before = asyncio.ensure_future(self._fresh(memos, ctx, epoch=epoch, slots=slots,
                                                   report=report, began=began))
        # a failed read stops the Starts made before it at once (the slurmctld they wait
        # on is likely down): their intents are committed, so the next tick adopts or
        # abandons whatever they made -- the shard's tick is never held by them
        read.add_done_callback(lambda done: done.cancelled() or done.exception() is None
                               or before.cancel())
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
                report.slurm_ok = False
                report.errors.append(f"live read: {exc}")
                self.metrics.slurm_up.set(0)
                # no new job is submitted unread again until a read succeeds
                self._seen = None
                log.warning("slurm live read failed; no job with a status changes this tick",
                            extra={"error": str(exc)})
            else:
                self.metrics.slurm_up.set(1)
                self._seen = {job_id for job_id, seen in live.items() if seen}
                self._seen.update(strays)
            report.timings["read"] = (read_done[0] if read_done
                                      else time.perf_counter()) - t0
        if not report.slurm_ok:
            self._save_rejections(now)
            return

        t0 = time.perf_counter()
        todo = self._unsettled(live, now, epoch, report, planned=fresh)
        chunk = max(1, self.settings.plan_chunk)
        if len(todo) <= chunk:  # the usual tick: a few jobs, read in full at once
            todo.sort(key=_newest_first)  # stable: a burst keeps its order
            todo = self._with_rows(self._past_slice(todo, epoch, report), report)
        else:  # many (a new leader's first tick): the jobs likely to act first
            self._order(todo, report)
            todo = self._past_slice(todo, epoch, report)
        report.timings["select"] += time.perf_counter() - t0

        t0 = time.perf_counter()
        acct, acct_ok = await self._accounting(todo, now)
        report.accounting_ok = acct_ok
        self.metrics.accounting_up.set(1 if acct_ok else 0)
        report.timings["read"] += time.perf_counter() - t0

        # the first chunk always goes, whatever ``_fresh`` spent: jobs with a status
        # (cancels, endings, resubmissions) are never starved by a stream of new rows
        for start in range(0, len(todo), chunk):
            if start and self._spent(began):
                # the rest waits for the next tick, at once: a tick stays well inside
                # its lease, and the next one reads Slurm again first
                report.deferred += len(todo) - start
                for item in todo[start:]:
                    item.row = None
                break
            t0 = time.perf_counter()
            part = self._with_rows(todo[start:start + chunk], report)
            report.timings["select"] += time.perf_counter() - t0
            slots = await self._plan_chunk(part, acct, acct_ok, ctx=ctx, epoch=epoch,
                                           slots=slots, report=report)
            del part  # this chunk's rows go now, not when the next chunk's replace them
            # let the loop run between chunks (other shards' ticks, lease renewals): a
            # long first tick is many short pieces, never one block
            await asyncio.sleep(0)

        self._validated = self._carried
        t0 = time.perf_counter()
        await self._sweep(strays, memos, report, now)
        report.replan_soon = bool(self._outcomes) or report.deferred > 0
        report.timings["apply"] += time.perf_counter() - t0
        t0 = time.perf_counter()
        self._refresh_gauges(now)
        report.timings["gauges"] = time.perf_counter() - t0

    def _spent(self, began: float) -> bool:
        """The tick begun at ``began`` is past its time budget: it takes on no further
        chunk (the first always goes)."""
        return self.budget_s is not None and time.perf_counter() - began > self.budget_s

    async def _fresh(self, memos: dict[str, _Memo], ctx: PlanContext, *, epoch: int,
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
        t0 = time.perf_counter()
        seen, pending = self._seen, self._outcomes
        started = self._started_since_read_before
        candidates = [job_id for job_id, memo in memos.items()
                      if memo.status_version is None and not memo.elsewhere
                      and memo.valid is not False and job_id not in pending
                      and is_job_id(job_id)
                      and no_object_yet(job_id, has_status=False, last_read=seen,
                                        started_since_read=started, tombstoned=())]
        if candidates:
            with self.store.transaction() as tx:
                gone = repo.tombstoned(tx, candidates)
            candidates = [job_id for job_id in candidates
                          if no_object_yet(job_id, has_status=False, last_read=seen,
                                           started_since_read=started, tombstoned=gone)]
        todo = [_Todo(job_id, memos[job_id], _NO_OBS) for job_id in candidates]
        if not todo:
            report.timings["select"] += time.perf_counter() - t0
            return set(), slots
        todo.sort(key=_newest_first)  # stable: a burst keeps its order
        planned = {item.job_id for item in todo}
        report.timings["select"] += time.perf_counter() - t0
        # a chunk (at most the slots left) at a time, until the slots are used (a row
        # that turns out invalid, or stopped, takes none) or the tick's budget is spent
        done = 0
        while done < len(todo) and slots > 0 and not (done and self._spent(began)):
            t0 = time.perf_counter()
            piece = todo[done:done + min(slots, max(1, self.settings.plan_chunk))]
            done += len(piece)
            part = self._with_rows(piece, report)
            report.timings["select"] += time.perf_counter() - t0
            slots = await self._plan_chunk(part, {}, True, ctx=ctx, epoch=epoch,
                                           slots=slots, report=report)
        report.deferred += len(todo) - done
        return planned, slots

    async def _plan_chunk(self, part: list[_Todo], acct: dict[ObjectRef, ObjectObs],
                          acct_ok: bool, *, ctx: PlanContext, epoch: int, slots: int,
                          report: TickReport) -> int:
        """Plan one chunk of jobs (their rows read), commit and act in waves
        (``_launch``), then release its recorded Submits; the submit slots left."""
        t0 = time.perf_counter()
        acts = _Acts(self.settings.action_concurrency)
        plans: list[tuple[repo.LoadedJob, Plan]] = []
        outcomes: list[tuple[_Todo, Plan | None]] = []
        submits = 0
        try:
            for item in part:
                job = item.row
                assert job is not None
                try:
                    cur = job.state.current
                    acct_obs = acct.get(cur.ref) if cur and cur.ref else None
                    item.outcomes = tuple(self._outcomes.get(job.state.job_id, ()))
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
                        self._carry(job)
                        item.row = None
                        if not job.has_status and not item.seen and not item.outcomes:
                            item.memo.deferred_epoch = epoch  # see _past_slice
                        continue
                    slots -= 1
                    submits += 1
                plans.append((job, p))
                outcomes.append((item, p))
                if submits >= acts.wave:
                    # a wave of Submits: committed and started now, while the rest
                    # of the chunk is planned (the Start batches never run dry)
                    report.timings["plan"] += time.perf_counter() - t0
                    self._launch(plans, outcomes, acts, ctx=ctx, epoch=epoch, report=report)
                    plans, outcomes, submits = [], [], 0
                    await acts.room()
                    await asyncio.sleep(0)  # the wave's Starts are queued now
                    t0 = time.perf_counter()
                elif acts.busy and len(outcomes) % _YIELD_EVERY == 0:
                    # a wave is in flight: let its Start batches be spawned and
                    # their outcomes handled while this one is planned
                    await asyncio.sleep(0)
            report.timings["plan"] += time.perf_counter() - t0
            self._launch(plans, outcomes, acts, ctx=ctx, epoch=epoch, report=report)
        except asyncio.CancelledError:
            acts.cancel()  # (a failed read: ``_tick``) no Start of this chunk waits on
            raise
        finally:
            # this chunk's actions end before the next chunk (or the tick's end), also
            # when a commit failed: nothing of this chunk acts after that
            await acts.drain(report)
        await self._release(acts, report, ctx.now)
        return slots

    # ------------------------------------------------------------ incremental state

    def _track(self, report: TickReport) -> dict[str, _Memo]:
        """The tracked jobs, by id: the remembered ones whose rows did not move, and a
        fresh ``_Memo`` (nothing known, planned this tick) for every other one."""
        with self.store.transaction() as tx:
            if self._versions_kept is None or not self._loaded:
                self._versions_kept = repo.row_versions_maintained(tx)
            elif not repo.row_versions_maintained(tx):
                self._versions_kept = False
            if not self._versions_kept and not self._warned:
                self._warned = True
                log.warning("the row version triggers of migration 0002 are missing: "
                            "every job is read and planned every tick")
            rows = repo.tracked_versions(tx, self.here)
        memos = self._memos
        born = self._ticks
        if not self._loaded or not self._versions_kept:
            report.full_load = True
            self._memos = {job_id: _Memo(version, status_version, born=born)
                           for job_id, version, status_version in rows}
            for job_id in self._outcomes.keys() - self._memos.keys():
                del self._outcomes[job_id]
            self._loaded = True
            return self._memos
        before = len(memos)
        known = 0
        remembered = memos.get
        for job_id, version, status_version in rows:
            memo = remembered(job_id)
            if memo is None:
                memos[job_id] = _Memo(version, status_version, born=born)
                continue
            known += 1
            if memo.version != version or memo.status_version != status_version:
                # a status that this reconciler wrote itself does not make the row new
                kept = memo.wrote and memo.version == version
                memos[job_id] = _Memo(version, status_version,
                                      born=memo.born if kept else born)
            elif status_version is None:  # no status row yet: planned again, as it was
                memos[job_id] = _Memo(version, status_version, born=memo.born,
                                      deferred_epoch=memo.deferred_epoch)
        if known != before:  # some finished or were deleted
            self._forget_jobs(memos.keys() - {row[0] for row in rows})
        return memos

    def _forget_jobs(self, job_ids: Iterable[str]) -> None:
        """Jobs that left tracking (finished by another writer, deleted): their memory
        and their action outcomes go with them (an outcome never planned would keep
        the shard ticking back to back)."""
        for job_id in list(job_ids):
            self._memos.pop(job_id, None)
            self._outcomes.pop(job_id, None)

    def _plan_epoch(self, ctx: PlanContext) -> int:
        """A number that moves whenever a plan input shared by every job changes."""
        key = (ctx.unknown_grace_s, ctx.adopt_window_s, ctx.down_nodes, self.settings)
        if key != self._epoch_key:
            self._epoch += 1
            self._epoch_key = key
        return self._epoch

    def _unsettled(self, live: dict[str, list[ObjectObs]], now: int, epoch: int,
                   report: TickReport, *, planned: Container[str] = ()) -> list[_Todo]:
        """The jobs to plan this tick: all but those whose last plan was quiet and whose
        inputs are unchanged and clock triggers not due (module docstring), and but
        those ``planned`` already this tick (``_fresh``)."""
        todo: list[_Todo] = []
        skipped = 0
        observed = live.get
        pending = self._outcomes  # a job with an action outcome is always planned
        for job_id, memo in self._memos.items():
            if memo.elsewhere or job_id in planned:
                # another shard's, until its row moves (``_with_rows``); or planned
                continue
            seen = observed(job_id, _NO_OBS)
            quiet = memo.quiet
            if (quiet is not None and memo.epoch == epoch
                    and memo.planned_at <= now < memo.recheck_at and quiet == seen
                    and (not pending or job_id not in pending)):
                skipped += 1
                continue
            memo.quiet = None  # planned now: quiet again only once this plan proves it
            todo.append(_Todo(job_id, memo, seen))
        report.skipped = skipped
        return todo

    def _past_slice(self, todo: list[_Todo], epoch: int, report: TickReport) -> list[_Todo]:
        """``todo`` without the waiting Submits past this tick's submit slice: the jobs
        whose last plan was a Submit dropped for want of a slot (``_Memo.deferred_epoch``)
        and whose inputs are still the same -- no status row (so the same row version:
        ``_track``), no live object, no action outcome, the same plan epoch -- are kept
        only up to ``submit_slice`` of them, in order; the others are neither read nor
        planned this tick (their plan would be that Submit again, and dropped again),
        and count as deferred. A burst then costs one plan per job and slice, not one
        per job and tick. Any other job (a row new or changed since, a stop) is planned
        as ever, ahead of them or not as the order says."""
        room = max(1, self.settings.submit_slice)
        pending = self._outcomes
        kept: list[_Todo] = []
        for item in todo:
            memo = item.memo
            if (memo.deferred_epoch == epoch and memo.status_version is None
                    and not item.seen and item.job_id not in pending):
                if room == 0:
                    report.deferred += 1
                    known = self._validated.get(item.job_id)
                    if known is not None:  # not parsed again when it is planned
                        self._carried[item.job_id] = known
                    continue
                room -= 1
            kept.append(item)
        return kept

    def _order(self, todo: list[_Todo], report: TickReport) -> None:
        """Put the jobs whose plan likely acts first (``_likely_to_act``; a stable sort,
        so the order is otherwise kept): with many to plan, their actions then run after
        the first chunk's commit instead of after the last."""
        with self.store.transaction() as tx:
            urgent = repo.changed_after_status(tx)  # desired (or spec) changed
        urgent.update(self._outcomes)
        fresh = not report.full_load  # versions moved since the last plan: a new _Memo
        todo.sort(key=_newest_first)
        todo.sort(key=lambda item: not _likely_to_act(item, urgent, fresh=fresh))

    def _with_rows(self, todo: list[_Todo], report: TickReport) -> list[_Todo]:
        """``todo`` with each job's row read in full; a job whose row left the tracked
        set since (finished by another writer, deleted) is dropped, and forgotten."""
        missing = [item.job_id for item in todo if item.row is None]
        if not missing:
            return todo
        known = self._validated  # (load_tracked adds to the cache it is given: a copy)
        cache = {job_id: known[job_id] for job_id in missing if job_id in known}
        with self.store.transaction() as tx:
            rows = {job.state.job_id: job
                    for job in repo.load_tracked(tx, self.adapter.cluster, ids=missing,
                                                 cache=cache)}
        report.reloaded += len(rows)
        kept: list[_Todo] = []
        for item in todo:
            if item.row is None:
                job = rows.get(item.job_id)
                if job is None:
                    self._forget_jobs([item.job_id])
                    continue
                memo = item.memo
                if self._elsewhere(job):
                    # not placed yet, and another cluster's shard places it: not planned
                    # here until its row moves (then ``_track`` makes a fresh memo)
                    memo.elsewhere = True
                    memo.version, memo.status_version = job.version, job.status_version
                    continue
                item.row = job
                # the row as read now is what this tick plans (it may have moved again
                # since the versions were read: then the next tick plans it once more)
                memo.version, memo.status_version = job.version, job.status_version
                memo.valid = job.state.spec is not None
            kept.append(item)
        return kept

    def _elsewhere(self, job: repo.LoadedJob) -> bool:
        """Another cluster's shard plans this job (``placement.owner``)."""
        clusters = self.clusters
        return clusters is not None and placement.owner(job.state, clusters) != self.here

    def _remember(self, outcomes: Sequence[tuple[_Todo, Plan | None]], written: set[str],
                  ctx: PlanContext, epoch: int) -> None:
        """After the commit: which plans were quiet, until when, and each job's gauges."""
        replan_s = max(1, self.settings.replan_s)
        moments: dict[int, int] = {}  # one int per recheck second (jobs hold many alike)
        for item, p in outcomes:
            memo = item.memo
            memo.planned_at = ctx.now
            memo.epoch = epoch
            memo.deferred_epoch = 0
            job = item.row
            item.row = None  # only _Memo is kept across ticks
            if p is None or job is None:
                memo.gauge = None
                continue
            if item.outcomes:  # planned and committed: the outcomes are spent
                self._spend_outcomes(item.job_id, item.outcomes)
            memo.wrote = item.job_id in written
            memo.gauge = _gauge(p.status)
            if (p.actions or p.submissions or p.events or item.needs_accounting
                    or not memo.valid or not job.has_status
                    or item.job_id in written):
                self._carry(job)  # planned again next tick: not parsed again
                continue
            spread = zlib.crc32(item.job_id.encode()) % replan_s
            due = p.recheck_at if p.recheck_at is not None else _NEVER
            recheck_at = min(due, ctx.now + replan_s + spread)
            memo.recheck_at = moments.setdefault(recheck_at, recheck_at)
            memo.quiet = item.seen

    def _carry(self, job: repo.LoadedJob) -> None:
        """Keep a job's validated row for the next tick, which plans it again (it is
        not parsed again unless the row moves)."""
        state = job.state
        if state.spec is not None:
            self._carried[state.job_id] = (job.version,
                                           (state.spec, state.policy, state.desired))

    # ------------------------------------------------------------ reads

    async def _accounting(self, todo: Sequence[_Todo],
                          now: int) -> tuple[dict[ObjectRef, ObjectObs], bool]:
        """One sacct read for current objects that are not in squeue any more (of the jobs
        planned this tick: a job whose current object is missing is never skipped)."""
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
                if ref is None:
                    continue
                if not any(same_object(ref, o) and not cancel_needs_accounting(o)
                           for o in item.seen):
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
        unchecked = [job_id for job_id, memo in self._memos.items() if memo.valid is None]
        chunk = max(1, self.settings.plan_chunk)
        for start in range(0, len(unchecked), chunk):
            with self._write() as tx:
                loaded = repo.load_tracked(tx, self.adapter.cluster,
                                           ids=unchecked[start:start + chunk])
                for job in loaded:
                    if self._elsewhere(job):
                        continue  # the default cluster's shard rejects it
                    memo = self._memos.get(job.state.job_id)
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

    def _commit_plans(self, plans: Sequence[tuple[repo.LoadedJob, Plan]],
                      now: int) -> set[str]:
        """Write what the plans changed; returns the ids whose status row was written."""
        with self._write() as tx:
            written = repo.save_statuses(tx, (
                repo.StatusWrite(p.status, job.has_status, job.reject_reason, job.previous)
                for job, p in plans), now=now, cluster=self.here)
            repo.save_submissions(tx, [(upd, p.status.attempt) for _, p in plans
                                       for upd in p.submissions], now=now,
                                  epoch=self._fence.epoch)
            events: list[PlannedEvent] = []
            for job, p in plans:
                if p.status.spec is None and job.state.job_id in written:
                    events.append(PlannedEvent(job.state.job_id, "Rejected", job.reject_reason))
                events.extend(p.events)
            repo.insert_events(tx, events, now=now)
        for job, p in plans:
            self._count_transitions(job.state, p.status)
        return written

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

    # ------------------------------------------------------------ actions

    def _launch(self, plans: list[tuple[repo.LoadedJob, Plan]],
                outcomes: list[tuple[_Todo, Plan | None]], acts: _Acts, *,
                ctx: PlanContext, epoch: int, report: TickReport) -> None:
        """Commit these plans (their intents before any of their Submits runs), then start
        their actions, each job's in order, many jobs at once, without waiting for them:
        the chunk's next wave is planned meanwhile (``_Acts.drain`` waits for all). A
        Submit that releases its gate (desired run) is released only after every Start of
        the chunk has returned and been recorded (``_release``): releases joined while
        Start batches are still in flight slow those Starts on slurmctld by a third
        (bench/burst README). Each release is still of a recorded ref, once, behind the
        fence and the identity check; one that fails leaves the job gated, and the next
        plan releases it."""
        if not outcomes:
            return
        report.planned += len(plans)
        t0 = time.perf_counter()
        written = self._commit_plans(plans, ctx.now) if plans else set()
        if self.here is not None:
            self._moves(plans, report)
        self._remember(outcomes, written, ctx, epoch)
        report.timings["store"] += time.perf_counter() - t0
        if acts.lost:
            return  # the lease is gone: act no more, the next leader will
        gate = acts.gate()
        acts.started(asyncio.gather(*(self._act(p.status, p.actions, gate=gate, acts=acts,
                                                report=report, now=ctx.now)
                                      for _, p in plans if p.actions)))

    async def _release(self, acts: _Acts, report: TickReport, now: int) -> None:
        """Release the gates of the chunk's recorded Submits, together, once all of its
        Starts have returned (``_launch``); raise the lease lost by any action."""
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
                   gate: asyncio.Semaphore, acts: _Acts, report: TickReport, now: int) -> None:
        """One job's actions, in order, under its wave's concurrency bound; a Submit's
        recorded ref to release goes to ``acts.releases``."""
        async with gate:
            for action in actions:
                name = type(action).__name__.lower()
                if acts.lost:
                    return  # the lease is gone: act no more, the next leader will
                try:
                    self._fence.guard()
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
                    self._record_event(job.job_id, "ActionFailed",
                                       f"{name}: {type(exc).__name__}: {exc}")
                    if isinstance(exc, TransientError):
                        break

    async def _sweep(self, strays: dict[str, list[ObjectObs]], memos: Container[str],
                     report: TickReport, now: int) -> None:
        """Our-format live ``dj-`` objects that no job of this tick owned (``strays``, from
        the tick's one squeue read): ownership is asked of the database now, not taken
        from the tick's start (a row written again meanwhile is tracked: its plan adopts
        its object), and the planner decides (``plan.sweep``): an id this database knows
        (a finished row, a tombstone) is cancelled behind the identity check; one it
        never had is a neighbour's -- counted, listed, never written."""
        ids = [job_id for job_id in strays if job_id not in memos]
        tracked: set[str] = set()
        known: set[str] = set()
        if ids:
            with self.store.transaction() as tx:
                tracked, known = repo.ownership(tx, ids)
        decided = sweep({job_id: strays[job_id] for job_id in ids}, tracked=tracked,
                        known=known)
        self._save_unowned(decided.unowned, now)
        self._prune_tombstones(now)
        gate = asyncio.Semaphore(self.settings.action_concurrency)

        async def cancel(action: Cancel) -> None:
            async with gate:
                try:
                    self._fence.guard()
                    await self.adapter.stop(action.ref)
                except LeaseLost:
                    raise
                except DispatchError as exc:
                    report.errors.append(f"{action.job_id}: sweep: {exc}")
                    self.metrics.action_errors.labels(action="sweep").inc()
                    return
                report.actions["sweep"] += 1
                self.metrics.duplicates.inc()
                log.info("cancelled a Slurm job of a finished or deleted record",
                         extra={"job": action.job_id, "slurm_id": action.ref.id})
                self._record_event(action.job_id, "OrphanCancelled",
                                   f"Slurm job {action.ref.id} belongs to no tracked "
                                   "submission: cancelled")

        await asyncio.gather(*(cancel(c) for c in decided.cancels))

    def _save_unowned(self, unowned: Sequence[ObjectObs], now: int) -> None:
        """Count the neighbours' jobs, and list them in the database when the set
        changed (``dispatchctl get --unowned``)."""
        self.metrics.unowned.set(len(unowned))
        key = frozenset((o.ref.uid, o.ref.id) for o in unowned)
        if key == self._unowned:
            return
        if unowned and not self._unowned:
            log.warning("dj- Slurm jobs of ids this database never had: a neighbouring "
                        "deployment's on the same Slurm account; never written",
                        extra={"count": len(unowned),
                               "slurm_ids": [o.ref.id for o in unowned[:20]]})
        try:
            with self._write() as tx:
                repo.save_unowned(tx, self.adapter.cluster, unowned, now=now)
        except LeaseLost:
            raise
        except DispatchError as exc:
            log.warning("could not save the unowned jobs", extra={"error": str(exc)})
            return
        self._unowned = key

    def _prune_tombstones(self, now: int) -> None:
        """Drop expired tombstones, at most once an hour."""
        if now - self._pruned_at < 3600:
            return
        self._pruned_at = now
        try:
            with self._write() as tx:
                repo.prune_tombstones(
                    tx, before_ms=(now - self.settings.tombstone_ttl_s) * 1000)
        except LeaseLost:
            raise
        except DispatchError as exc:
            log.warning("could not prune tombstones", extra={"error": str(exc)})

    def _record_event(self, job_id: str, kind: str, message: str) -> None:
        try:
            with self._write() as tx:
                repo.add_event(tx, job_id, kind, message[:2000], now=self.now())
        except DispatchError:
            log.warning("could not record event", extra={"job": job_id, "kind": kind})

    async def _apply_one(self, job: JobState, action: object, now: int) -> ObjectRef | None:
        """Run one action; a Submit returns the recorded ref to release afterwards
        (``_apply``), every other action None."""
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
                self._note_outcome(job.job_id, Outcome(
                    OutcomeKind.STARTED if started else OutcomeKind.NOT_STARTED, submission))
            case _:
                raise TypeError(f"unknown action {action!r}")
        return None

    async def _submit(self, job: JobState, action: Submit) -> ObjectRef | None:
        """Start the job gated and record its ref; the ref to release (desired run)
        once this call's Starts are done, or None (held, or a duplicate cancelled)."""
        self._started_since_read.add(action.job_id)  # (``no_object_yet``)
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
            self._record_event(action.job_id, "Duplicate",
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
        with self._write() as tx:
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
        self._note_outcome(job.job_id, Outcome(kind, action.submission, str(exc)[:500]))

    async def _verify_outputs(self, job: JobState, paths: Sequence[str], now: int) -> None:
        """Check the expected outputs of the current object; the next plan decides from
        what was found (success, or the missing-output rule). Writes nothing."""
        missing = await self.adapter.missing_paths(paths)
        cur = job.current
        if cur is None:
            return
        kind = OutcomeKind.OUTPUTS_MISSING if missing else OutcomeKind.OUTPUTS_PRESENT
        self._note_outcome(job.job_id, Outcome(kind, cur.submission, paths=tuple(missing)))

    # ------------------------------------------------------------ action outcomes

    def _note_outcome(self, job_id: str, outcome: Outcome) -> None:
        """What an action found, for the next plan of ``job_id``: that job is planned on
        the next tick whatever the skip analysis says, and ``TickReport.replan_soon`` asks
        for that tick early."""
        if job_id in self._memos:  # (a job that left tracking meanwhile: nothing to plan)
            self._outcomes.setdefault(job_id, []).append(outcome)

    def _spend_outcomes(self, job_id: str, spent: Sequence[Outcome]) -> None:
        """Drop the outcomes a committed plan was given (not any noted since)."""
        book = self._outcomes
        left = [o for o in book.get(job_id, ()) if not any(o is s for s in spent)]
        if left:
            book[job_id] = left
        else:
            book.pop(job_id, None)

    # ------------------------------------------------------------ gauges

    def _refresh_gauges(self, now: int) -> None:
        states: CountOf[str] = CountOf()
        stale = 0
        pending_since: int | None = None
        # most jobs share one of a few gauge tuples (``_gauge``): count those first
        for (label, is_stale, since), count in CountOf(
                m.gauge for m in self._memos.values() if m.gauge is not None).items():
            if label is not None:
                states[label] += count
            if is_stale:
                stale += count
            if since is not None and (pending_since is None or since < pending_since):
                pending_since = since
        self.metrics.set_object_counts(states)
        self.metrics.stale.set(stale)
        self.metrics.oldest_pending.set(max(0, now - pending_since)
                                        if pending_since is not None else 0)
        clusters = self.clusters
        with self.store.transaction() as tx:
            self.metrics.set_phase_counts(repo.phase_counts(
                tx, self.here, unplaced=clusters is None or clusters.default == self.here))


# ---------------------------------------------------------------- one tick's actions


class _Acts:
    """The actions of one chunk in flight: waves of plans committed and started one after
    another (``Reconciler._launch``), each wave at most ``action_concurrency`` jobs acting
    at once (and holding that many Submits) and at most ``DEPTH`` waves in flight; the
    releases that wait for every Start of the chunk; the lease lost by any of them."""

    DEPTH = 2  # waves in flight: one's Starts run while the next is planned and queued

    def __init__(self, concurrency: int) -> None:
        self.wave = max(1, concurrency)  # Submits per wave, and jobs acting at once in it
        self.lost: list[LeaseLost] = []
        self.releases: list[tuple[JobState, Release]] = []
        self._waves: list[tuple[asyncio.Future[list[None]], float]] = []

    @property
    def busy(self) -> bool:
        """A wave is in flight."""
        return any(not wave.done() for wave, _ in self._waves)

    def gate(self) -> asyncio.Semaphore:
        """The bound of one new wave."""
        return asyncio.Semaphore(self.wave)

    def started(self, wave: asyncio.Future[list[None]]) -> None:
        self._waves.append((wave, time.perf_counter()))

    def cancel(self) -> None:
        """Stop the waves in flight (their intents are committed: the next tick adopts
        or abandons whatever their Starts made)."""
        for wave, _ in self._waves:
            wave.cancel()

    async def room(self) -> None:
        """Wait until fewer than ``DEPTH`` waves are in flight (memory stays bounded
        however many Submits a chunk makes)."""
        while sum(1 for wave, _ in self._waves if not wave.done()) >= self.DEPTH:
            oldest = next(wave for wave, _ in self._waves if not wave.done())
            await asyncio.wait([oldest])

    async def drain(self, report: TickReport) -> None:
        """Wait for every wave; the time from the first wave's start to the last one's
        end is the tick's ``apply``."""
        if not self._waves:
            return
        first = self._waves[0][1]
        await asyncio.gather(*(wave for wave, _ in self._waves), return_exceptions=True)
        report.timings["apply"] += time.perf_counter() - first
        self._waves = []


# ---------------------------------------------------------------- per-job memory


@dataclass(slots=True)
class _Memo:
    """What the reconciler keeps of one tracked job between ticks: what deciding to skip
    it needs, and its share of the gauges. Its row is read again when it is planned."""

    version: int  # jobs.version of the row it was planned from
    status_version: int | None  # job_status.version (None: no status row yet)
    valid: bool | None = None  # the row passed validation; None: not read yet
    # the live observations of the last plan, when that plan was quiet (else None)
    quiet: Sequence[ObjectObs] | None = None
    recheck_at: int = 0  # a quiet plan holds until then (``Plan.recheck_at``)
    planned_at: int = 0
    epoch: int = 0
    gauge: tuple[str | None, bool, int | None] | None = None  # see ``_gauge``
    born: int = 0  # the tick that made it: its row was new or had moved then
    # the plan epoch of its last plan, when that plan was a Submit dropped past the submit
    # slice from a row with no status and no live object (``_past_slice``); 0: none
    deferred_epoch: int = 0
    wrote: bool = False  # its last plan wrote its status (the next version is ours)
    # not placed yet, and it belongs to another cluster's shard (``_with_rows``)
    elsewhere: bool = False


@dataclass(slots=True)
class _Todo:
    """A job to plan this tick."""

    job_id: str
    memo: _Memo
    seen: Sequence[ObjectObs]  # its live observations, as find_many returned them
    row: repo.LoadedJob | None = None  # read in full just before it is planned
    needs_accounting: bool = False  # its current object is not in squeue
    outcomes: tuple[Outcome, ...] = ()  # the action outcomes its plan was given


# a Submit's ref to record: (job id, submission number, the ref Start returned)
_Recorded = repo.Recorded

_NO_OBS: tuple[ObjectObs, ...] = ()
# plans made between two yields to the event loop while a wave acts (``_plan_chunk``)
_YIELD_EVERY = 16
_STEADY = frozenset({State.PENDING, State.RUNNING})


def _newest_first(item: _Todo) -> int:
    """Rows that are new or moved since the last tick before older ones: a row written
    during a burst is planned (and submitted) in the next tick's slice, not after the
    burst; the sort is stable, so a burst keeps its own order."""
    return -item.memo.born


def _likely_to_act(item: _Todo, urgent: set[str], *, fresh: bool) -> bool:
    """Whether a job's plan may well act (only the order of plans depends on it): no
    status row yet (a new job), a row a client changed after its status was written, an
    action outcome waiting, versions moved since its last plan (``fresh``: a new _Memo on
    an incremental tick), no live object (an intent without a ref, an object that left
    the queue), several (duplicates), or one that is not plainly pending or running
    (gated, held, suspended, ended, foreign). One pending or running object of a settled
    job is the usual quiet plan."""
    memo = item.memo
    if memo.status_version is None or item.job_id in urgent:
        return True
    if fresh and memo.planned_at == 0:
        return True
    seen = item.seen
    if len(seen) != 1:
        return True
    return seen[0].foreign or seen[0].state not in _STEADY


def _gauge(st: JobState) -> tuple[str | None, bool, int | None] | None:
    """One job's share of the object-state, stale and oldest-pending gauges."""
    if st.phase in TERMINAL_PHASES:
        return None
    label = None
    if st.object_state is not None:
        label = st.object_state.value
    elif st.current is not None:
        label = "unknown" if st.unknown_since else "pending"
    stale = any(c.type == "Stale" and c.status for c in st.conditions)
    if st.object_state in (State.PENDING, State.GATED, State.HELD) and st.current:
        return label, stale, st.current.created_at
    key = (label, stale)
    gauge = _GAUGES.get(key)
    if gauge is None:
        gauge = _GAUGES[key] = (label, stale, None)
    return gauge


_GAUGES: dict[tuple[str | None, bool], tuple[str | None, bool, None]] = {}  # shared


_NEVER = 2**63
