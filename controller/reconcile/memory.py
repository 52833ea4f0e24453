"""The observation memo: what a reconciler remembers of each tracked job between ticks,
and which jobs a tick plans (incremental, still level-triggered; ``tick``'s docstring).

* ``track``: a tick reads ``(id, version, status version)`` of the jobs the change feed
  names (all of them on the first tick); a job that is new or whose versions moved gets
  a fresh ``Memo`` and is planned;
* ``unsettled``: a job is not planned again when its last plan was *quiet* and its inputs
  (row versions, live observations, the plan epoch) are the same and no clock trigger is
  due (``Plan.recheck_at``); every job is planned again within ``replan_s``;
* ``past_slice``: Submits dropped past the submit slice wait unread while the planner
  says they may (``plan.postponable``);
* ``order``: with many to plan, the jobs likely to act first;
* ``with_rows``: the rows of the jobs to plan, read in full, a chunk at a time;
* ``remember``: after a commit, which plans were quiet and until when, and each job's
  share of the gauges.
A job that leaves tracking takes its memo and its action outcomes with it."""

from __future__ import annotations

import logging
import zlib
from collections.abc import Container, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from controller.model.ids import is_job_id
from controller.model.obs import ObjectObs, State
from controller.reconcile import placement
from controller.reconcile.gauges import Gauge, job_gauge
from controller.reconcile.outcomes import OutcomeBook
from controller.reconcile.placement import Clusters
from controller.reconcile.plan import Outcome, Plan, PlanContext, postponable
from controller.reconcile.report import TickReport
from controller.reconcile.settings import ReconcileConfig
from controller.store import repo
from controller.store.db import Store

log = logging.getLogger("dispatch.tick")

NO_OBS: tuple[ObjectObs, ...] = ()
_STEADY = frozenset({State.PENDING, State.RUNNING})
_NEVER = 2**63


@dataclass(slots=True)
class Memo:
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
    gauge: Gauge | None = None  # see ``gauges.job_gauge``
    born: int = 0  # the tick that made it: its row was new or had moved then
    # the plan epoch of its last plan, when that plan was a Submit dropped past the submit
    # slice while the planner said it may wait (``plan.postponable``); 0: none
    deferred_epoch: int = 0
    wrote: bool = False  # its last plan wrote its status (the next version is ours)
    # not placed yet, and it belongs to another cluster's shard (``with_rows``)
    elsewhere: bool = False


@dataclass(slots=True)
class Todo:
    """A job to plan this tick."""

    job_id: str
    memo: Memo
    seen: Sequence[ObjectObs]  # its live observations, as find_many returned them
    row: repo.LoadedJob | None = None  # read in full just before it is planned
    needs_accounting: bool = False  # its current object is not in squeue
    outcomes: tuple[Outcome, ...] = ()  # the action outcomes its plan was given


class LastRead:
    """The dispatch job ids that had an object of ours in one complete live read: the
    read's own mapping (its jobs with any observation) and its strays, kept as they are
    -- no set of 100k ids is built per tick (the read's mapping exists anyway)."""

    __slots__ = ("_live", "_strays")

    def __init__(self, live: Mapping[str, Sequence[ObjectObs]],
                 strays: Mapping[str, object]) -> None:
        self._live = live
        self._strays = strays

    def __contains__(self, job_id: object) -> bool:
        return (isinstance(job_id, str)
                and (bool(self._live.get(job_id)) or job_id in self._strays))


def newest_first(item: Todo) -> int:
    """Rows that are new or moved since the last tick before older ones: a row written
    during a burst is planned (and submitted) in the next tick's slice, not after the
    burst; the sort is stable, so a burst keeps its own order."""
    return -item.memo.born


def likely_to_act(item: Todo, urgent: Container[str], *, fresh: bool) -> bool:
    """Whether a job's plan may well act (only the order of plans depends on it): no
    status row yet (a new job), a row a client changed after its status was written, an
    action outcome waiting, versions moved since its last plan (``fresh``: a new Memo on
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


class Memory:
    """One shard's memory of its tracked jobs (module docstring)."""

    def __init__(self, store: Store, *, cluster: str, here: str | None,
                 clusters: Clusters | None, settings: ReconcileConfig,
                 outcomes: OutcomeBook) -> None:
        self.store = store
        self.cluster = cluster  # the adapter's cluster (ObjectRef.cluster)
        self.here = here  # this shard's cluster in a placement, or None
        self.clusters = clusters
        self.settings = settings
        self.outcomes = outcomes
        self.memos: dict[str, Memo] = {}  # tracked job id -> what the last ticks learned
        self.loaded = False  # memos holds every tracked job as of the last tick
        # moves whenever the memos' set, validity, placement or gauges may have changed:
        # what is derived from all memos (the ids to read, the gauges) is computed again
        # only then (a steady tick at 1M jobs does not walk them twice more)
        self.generation = 0
        # the change feed's mark taken before the last read of versions (None: read them
        # all next time; ``track``)
        self.mark: repo.ChangeMark | None = None
        self.ticks = 0  # ticks begun: a Memo's birth, for new-rows-first
        self._versions_kept: bool | None = None  # the version triggers are in place
        self._warned = False
        # the validated rows of the jobs the last tick planned without settling them
        # (they are planned again now): (jobs.version, (spec, policy, desired)) by job id
        self.validated: repo.SpecCache = {}
        self.carried: repo.SpecCache = {}
        self._epoch = 0  # moves when a plan input shared by every job changes
        self._epoch_key: tuple[object, ...] | None = None

    def forget(self) -> None:
        """Drop everything remembered: the next tick loads and plans every job."""
        self.memos = {}
        self.validated = {}
        self.loaded = False
        self.mark = None
        self.generation += 1
        self._epoch_key = None

    def begin(self) -> None:
        """A tick begins."""
        self.ticks += 1
        self.carried = {}

    def end(self) -> None:
        """A tick's plans are done: the rows it carried are the next tick's cache."""
        self.validated = self.carried

    def gauges(self) -> Iterator[Gauge | None]:
        return (m.gauge for m in self.memos.values())

    def wanted(self) -> list[str]:
        """The ids the live read asks for: the rows not validated yet too (their
        observations are ignored if they turn out invalid); never a malformed id, nor a
        job another cluster's shard plans."""
        return [job_id for job_id, memo in self.memos.items()
                if not memo.elsewhere and (
                    memo.valid or (memo.valid is None and is_job_id(job_id)))]

    def unchecked(self) -> list[str]:
        """The tracked jobs whose rows were not validated yet."""
        return [job_id for job_id, memo in self.memos.items() if memo.valid is None]

    # ------------------------------------------------------------ track

    def track(self, report: TickReport) -> dict[str, Memo]:
        """The tracked jobs, by id: the remembered ones whose rows did not move, and a
        fresh ``Memo`` (nothing known, planned this tick) for every other one.

        The first tick (and any tick without the triggers) reads every tracked job's
        versions; later ticks read the change feed (migration 0007): the ids written or
        deleted since the mark taken before the last read, and the versions of those
        alone -- a steady tick's database work is the rows that changed, not the jobs
        tracked. ``report.changed_rows`` counts them. A mark lower than the last one (a
        database restored under the daemon) reads every job again; whatever the feed
        might miss is still read within ``replan_s``..2x (every job is planned, its row
        read, that often)."""
        with self.store.transaction() as tx:
            if self._versions_kept is None or not self.loaded:
                self._versions_kept = repo.row_versions_maintained(tx)
            elif not repo.row_versions_maintained(tx):
                self._versions_kept = False
            if not self._versions_kept and not self._warned:
                self._warned = True
                log.warning("the row version triggers of migrations 0002 and 0007 are "
                            "missing: every job is read and planned every tick")
            full = not self.loaded or not self._versions_kept or self.mark is None
            mark = repo.change_mark(tx) if self._versions_kept else None
            if (not full and mark is not None and self.mark is not None
                    and mark.went_back(self.mark)):
                # the stamps went back (a database restored, or another server): nothing
                # read since can be trusted to be complete
                log.warning("the change feed's mark went back: every job is read again",
                            extra={"mark": mark.at, "last": self.mark.at})
                full = True
            if full:
                rows = repo.tracked_versions(tx, self.here)
                changed: set[str] | None = None
            else:
                assert self.mark is not None
                changed = repo.changed_ids(tx, since=self.mark)
                rows = repo.tracked_versions(tx, self.here, ids=changed) if changed else []
        self.mark = mark
        born = self.ticks
        if full or rows:
            self.generation += 1
        if full:
            report.full_load = True
            report.changed_rows = len(rows)
            self.memos = {job_id: Memo(version, status_version, born=born)
                          for job_id, version, status_version in rows}
            self.outcomes.keep_only(self.memos)
            self.loaded = True
            return self.memos
        assert changed is not None
        report.changed_rows = len(changed)
        memos = self.memos
        remembered = memos.get
        for job_id, version, status_version in rows:
            memo = remembered(job_id)
            if memo is None:
                memos[job_id] = Memo(version, status_version, born=born)
            elif memo.version != version or memo.status_version != status_version:
                # a status that this reconciler wrote itself does not make the row new
                kept = memo.wrote and memo.version == version
                memos[job_id] = Memo(version, status_version,
                                     born=memo.born if kept else born)
            elif status_version is None:  # no status row yet: planned again, as it was
                memos[job_id] = Memo(version, status_version, born=memo.born,
                                     deferred_epoch=memo.deferred_epoch)
        # written but not tracked by this shard any more: finished, deleted, placed on
        # another cluster
        gone = changed.difference(row[0] for row in rows)
        if gone:
            self.forget_jobs(job_id for job_id in gone if job_id in memos)
        return memos

    def forget_jobs(self, job_ids: Iterable[str]) -> None:
        """Jobs that left tracking (finished by another writer, deleted): their memory
        and their action outcomes go with them (an outcome never planned would keep
        the shard ticking back to back)."""
        gone = list(job_ids)
        for job_id in gone:
            self.memos.pop(job_id, None)
        self.outcomes.forget(gone)
        self.generation += 1

    def plan_epoch(self, ctx: PlanContext) -> int:
        """A number that moves whenever a plan input shared by every job changes."""
        key = (ctx.unknown_grace_s, ctx.adopt_window_s, ctx.down_nodes, self.settings)
        if key != self._epoch_key:
            self._epoch += 1
            self._epoch_key = key
        return self._epoch

    # ------------------------------------------------------------ select

    def unsettled(self, live: Mapping[str, Sequence[ObjectObs]], now: int, epoch: int,
                  report: TickReport, *, planned: Container[str] = ()) -> list[Todo]:
        """The jobs to plan this tick: all but those whose last plan was quiet and whose
        inputs are unchanged and clock triggers not due, and but those ``planned``
        already this tick (before the read)."""
        todo: list[Todo] = []
        skipped = 0
        observed = live.get
        pending = self.outcomes  # a job with an action outcome is always planned
        for job_id, memo in self.memos.items():
            if memo.elsewhere or job_id in planned:
                # another shard's, until its row moves (``with_rows``); or planned
                continue
            seen = observed(job_id, NO_OBS)
            quiet = memo.quiet
            if (quiet is not None and memo.epoch == epoch
                    and memo.planned_at <= now < memo.recheck_at and quiet == seen
                    and job_id not in pending):
                skipped += 1
                continue
            memo.quiet = None  # planned now: quiet again only once this plan proves it
            todo.append(Todo(job_id, memo, seen))
        report.skipped = skipped
        return todo

    def postpone(self, item: Todo, epoch: int) -> None:
        """The Submit of ``item`` was dropped past the submit slice: mark it to wait
        unread while the planner says it may (``past_slice``)."""
        row = item.row
        if row is not None and postponable(has_status=row.has_status, seen=item.seen,
                                           waiting=bool(item.outcomes)):
            item.memo.deferred_epoch = epoch

    def past_slice(self, todo: list[Todo], epoch: int, report: TickReport) -> list[Todo]:
        """``todo`` without the waiting Submits past this tick's submit slice: the jobs
        marked by ``postpone`` whose inputs are still the same -- the plan epoch, and
        still ``plan.postponable`` -- are kept only up to ``submit_slice`` of them, in
        order; the others are neither read nor planned this tick (their plan would be
        that Submit again, and dropped again), and count as deferred. A burst then costs
        one plan per job and slice, not one per job and tick. Any other job (a row new
        or changed since, a stop) is planned as ever, ahead of them or not as the order
        says."""
        room = max(1, self.settings.submit_slice)
        kept: list[Todo] = []
        for item in todo:
            memo = item.memo
            if memo.deferred_epoch == epoch and postponable(
                    has_status=memo.status_version is not None, seen=item.seen,
                    waiting=item.job_id in self.outcomes):
                if room == 0:
                    report.deferred += 1
                    known = self.validated.get(item.job_id)
                    if known is not None:  # not parsed again when it is planned
                        self.carried[item.job_id] = known
                    continue
                room -= 1
            kept.append(item)
        return kept

    def order(self, todo: list[Todo], report: TickReport) -> None:
        """Put the jobs whose plan likely acts first (``likely_to_act``; a stable sort,
        so the order is otherwise kept): with many to plan, their actions then run after
        the first chunk's commit instead of after the last."""
        with self.store.transaction() as tx:
            urgent = repo.changed_after_status(tx)  # desired (or spec) changed
        urgent.update(self.outcomes.ids())
        fresh = not report.full_load  # versions moved since the last plan: a new Memo
        todo.sort(key=newest_first)
        todo.sort(key=lambda item: not likely_to_act(item, urgent, fresh=fresh))

    def with_rows(self, todo: list[Todo], report: TickReport) -> list[Todo]:
        """``todo`` with each job's row read in full; a job whose row left the tracked
        set since (finished by another writer, deleted) is dropped, and forgotten."""
        missing = [item.job_id for item in todo if item.row is None]
        if not missing:
            return todo
        known = self.validated  # (load_tracked adds to the cache it is given: a copy)
        cache = {job_id: known[job_id] for job_id in missing if job_id in known}
        with self.store.transaction() as tx:
            fetched = repo.fetch_tracked(tx, ids=missing)
        # built after the read's transaction ended (``repo.Fetched``)
        rows = {job.state.job_id: job
                for job in repo.build_tracked(fetched, self.cluster, cache=cache)}
        report.reloaded += len(rows)
        self.generation += 1  # (validity and placement are learned here)
        kept: list[Todo] = []
        for item in todo:
            if item.row is None:
                job = rows.get(item.job_id)
                if job is None:
                    self.forget_jobs([item.job_id])
                    continue
                memo = item.memo
                if self.elsewhere(job):
                    # not placed yet, and another cluster's shard places it: not planned
                    # here until its row moves (then ``track`` makes a fresh memo)
                    memo.elsewhere = True
                    memo.version, memo.status_version = job.version, job.status_version
                    continue
                item.row = job
                # the row as read now is what this tick plans (it may have moved again
                # since the versions were read: then the next tick plans it once more);
                # equal numbers keep the objects the memo has (a new leader's 100k
                # replaced ints would leave their heap in holes)
                if memo.version != job.version:
                    memo.version = job.version
                if memo.status_version != job.status_version:
                    memo.status_version = job.status_version
                memo.valid = job.state.spec is not None
            kept.append(item)
        return kept

    def elsewhere(self, job: repo.LoadedJob) -> bool:
        """Another cluster's shard plans this job (``placement.owner``)."""
        clusters = self.clusters
        return clusters is not None and placement.owner(job.state, clusters) != self.here

    # ------------------------------------------------------------ remember

    def remember(self, outcomes: Sequence[tuple[Todo, Plan | None]], written: set[str],
                 ctx: PlanContext, epoch: int, *, ours: bool = True) -> None:
        """After the commit: which plans were quiet, until when, and each job's gauges;
        the action outcomes a committed plan was given are spent. ``written``: the ids
        whose status row the commit wrote (``ours``) or would have written (a standby's
        shadow tick, ``controller.reconcile.standby``: not quiet, and not its own
        write)."""
        replan_s = max(1, self.settings.replan_s)
        moments: dict[int, int] = {}  # one int per recheck second (jobs hold many alike)
        if outcomes:
            self.generation += 1  # (gauges)
        for item, p in outcomes:
            memo = item.memo
            memo.planned_at = ctx.now
            memo.epoch = epoch
            memo.deferred_epoch = 0
            job = item.row
            item.row = None  # only Memo is kept across ticks
            if p is None or job is None:
                memo.gauge = None
                continue
            if item.outcomes:  # planned and committed: the outcomes are spent
                self.outcomes.spend(item.job_id, item.outcomes)
            memo.wrote = ours and item.job_id in written
            memo.gauge = job_gauge(p.status)
            if (p.actions or p.submissions or p.events or item.needs_accounting
                    or not memo.valid or not job.has_status
                    or item.job_id in written):
                self.carry(job)  # planned again next tick: not parsed again
                continue
            spread = zlib.crc32(item.job_id.encode()) % replan_s
            due = p.recheck_at if p.recheck_at is not None else _NEVER
            recheck_at = min(due, ctx.now + replan_s + spread)
            memo.recheck_at = moments.setdefault(recheck_at, recheck_at)
            memo.quiet = item.seen

    def carry(self, job: repo.LoadedJob) -> None:
        """Keep a job's validated row for the next tick, which plans it again (it is
        not parsed again unless the row moves)."""
        state = job.state
        if state.spec is not None:
            self.carried[state.job_id] = (job.version,
                                          (state.spec, state.policy, state.desired))
