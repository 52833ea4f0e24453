"""Bounded ticks (issue 13): a burst of new rows is submitted ``submit_slice`` per tick,
the next tick follows at once (``replan_soon``), a row written during the burst goes in
the next slice (new rows first), other work (a stop) is not held up by the burst, a
tick past its time budget leaves the remaining chunks to the next tick, and nothing is
submitted twice or written for the jobs left over. ``bench/burst`` measures it on the
real cluster."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from controller.metrics import Metrics
from controller.model.ids import new_job_id
from controller.model.job import Desired
from controller.model.obs import ObjectRef, StartRequest, State
from controller.reconcile.tick import Reconciler, TickReport, TickSettings
from controller.store import repo
from controller.store.db import Store
from controller.store.models import JobStatus
from tests.fakeslurm import FakeSlurm

DOC = {"command": ["true"], "workdir": "/tmp"}
NOW = 1_800_000_000


def add(store: Store, n: int) -> list[str]:
    ids = sorted(str(new_job_id()) for _ in range(n))
    with store.transaction() as tx:
        for job_id in ids:
            repo.insert_job(tx, job_id=job_id, document=DOC, now=1)
    return ids


def submitted(fake: FakeSlurm) -> list[str]:
    """Dispatch job ids in the order their Slurm jobs were made."""
    return [fake.jobs[sid].obs.ref.uid[3:] for sid in sorted(fake.jobs)]


def with_status(store: Store) -> set[str]:
    """The jobs that have a status row (any written status)."""
    with store.transaction() as tx:
        return set(tx.scalars(select(JobStatus.job_id)))


def rec(store: Store, fake: FakeSlurm, clock: list[int], *, budget_s: float | None = None,
        timer: Callable[[], float] = time.perf_counter, **settings: int) -> Reconciler:
    return Reconciler(store, fake, metrics=Metrics(), clock=lambda: clock[0],
                      settings=TickSettings(**settings), budget_s=budget_s, timer=timer)


async def test_a_burst_is_submitted_a_slice_per_tick_each_once(sqlite_store: Store) -> None:
    clock = [NOW]
    fake = FakeSlurm(clock)
    burst = add(sqlite_store, 10)
    r = rec(sqlite_store, fake, clock, submit_slice=4)
    reports: list[TickReport] = []
    while len(fake.jobs) < 10 and len(reports) < 10:
        reports.append(await r.tick())
    assert [rep.actions["submit"] for rep in reports] == [4, 4, 2]
    assert [rep.deferred for rep in reports] == [6, 2, 0]
    assert [rep.replan_soon for rep in reports] == [True, True, False]
    assert submitted(fake) == burst  # in order, each once
    assert fake.calls.count("start") == 10
    assert fake.calls.count("release") == 10


async def test_the_jobs_left_for_the_next_tick_get_no_status_written(
        sqlite_store: Store) -> None:
    clock = [NOW]
    fake = FakeSlurm(clock)
    burst = add(sqlite_store, 6)
    r = rec(sqlite_store, fake, clock, submit_slice=2)
    await r.tick()
    assert with_status(sqlite_store) == set(burst[:2])


async def test_a_row_written_during_a_burst_goes_in_the_next_slice(sqlite_store: Store) -> None:
    clock = [NOW]
    fake = FakeSlurm(clock)
    burst = add(sqlite_store, 12)
    r = rec(sqlite_store, fake, clock, submit_slice=3)
    await r.tick()
    late = add(sqlite_store, 1)[0]
    report = await r.tick()
    assert report.actions["submit"] == 3
    assert submitted(fake)[3] == late  # first of the second slice, ahead of 9 older rows
    while len(fake.jobs) < 13:
        await r.tick()
    assert sorted(submitted(fake)) == sorted([*burst, late])


async def test_a_stop_is_acted_on_while_a_burst_waits(sqlite_store: Store) -> None:
    clock = [NOW]
    fake = FakeSlurm(clock)
    first = add(sqlite_store, 1)[0]
    r = rec(sqlite_store, fake, clock, submit_slice=2)
    await r.tick()
    fake.run_all_pending()
    add(sqlite_store, 10)
    with sqlite_store.transaction() as tx:
        assert repo.set_desired(tx, [first], Desired.STOPPED, now=clock[0]) == 1
    report = await r.tick()
    assert report.actions["cancel"] == 1 and report.actions["submit"] == 2
    assert next(iter(fake.jobs.values())).obs.state is State.ENDED


async def test_a_tick_past_its_budget_leaves_the_other_chunks_to_the_next(
        sqlite_store: Store) -> None:
    """budget 0: each tick plans its first chunk (the first always goes) -- one of new
    rows before the read and one of the rest after it, so that jobs with a status are
    never starved by new rows -- then leaves the rest, says so, and asks for the next
    tick at once; in the end each job is submitted once."""
    clock = [NOW]
    fake = FakeSlurm(clock)
    burst = add(sqlite_store, 7)
    r = rec(sqlite_store, fake, clock, budget_s=0.0, plan_chunk=3)
    reports: list[TickReport] = []
    while len(fake.jobs) < 7 and len(reports) < 20:
        reports.append(await r.tick())
    assert len(fake.jobs) == 7, [rep.actions for rep in reports]
    assert all(rep.planned <= 2 * 3 for rep in reports)
    assert reports[0].planned == 3 and reports[0].deferred == 4
    assert all(rep.replan_soon for rep in reports if rep.deferred)
    assert sorted(submitted(fake)) == sorted(burst)
    assert fake.calls.count("start") == 7


async def test_rows_waiting_past_the_slice_are_not_read_again(sqlite_store: Store) -> None:
    """A Submit dropped past the slice is made again only for the next slice: the rows
    that wait beyond it (no status, no live object, unchanged) are neither read nor
    planned, and count as deferred; in the end each job is submitted once, in order."""
    clock = [NOW]
    fake = FakeSlurm(clock)
    burst = add(sqlite_store, 10)
    r = rec(sqlite_store, fake, clock, submit_slice=4)
    first = await r.tick()
    assert first.reloaded == 10 and first.deferred == 6
    second = await r.tick()
    # the 4 submitted (their status moved) and the next 4 waiting: not the last 2
    assert second.reloaded == 8 and second.deferred == 2 and second.replan_soon
    while len(fake.jobs) < 10:
        await r.tick()
    assert submitted(fake) == burst


async def test_a_waiting_row_that_changes_is_planned_at_once(sqlite_store: Store) -> None:
    """A row waiting for a slot that a client changes (stopped) is planned on the next
    tick although the slice is full: its version moved, so nothing is assumed of it."""
    clock = [NOW]
    fake = FakeSlurm(clock)
    burst = add(sqlite_store, 10)
    r = rec(sqlite_store, fake, clock, submit_slice=2)
    await r.tick()
    with sqlite_store.transaction() as tx:
        assert repo.set_desired(tx, [burst[-1]], Desired.STOPPED, now=clock[0]) == 1
    report = await r.tick()
    assert report.actions["submit"] == 2
    with sqlite_store.transaction() as tx:
        phase = tx.scalar(select(JobStatus.phase).where(JobStatus.job_id == burst[-1]))
    assert phase == "cancelled"
    while len(fake.jobs) < 9:
        await r.tick()
    assert sorted(submitted(fake)) == sorted(burst[:-1])


class InTurns(FakeSlurm):
    """Starts that return in turns, two at a time, as real Start batches do (a shell call
    of ``start_batch`` scripts, ``start_parallel`` calls in flight)."""

    def __init__(self, clock: list[int]) -> None:
        super().__init__(clock)
        self.issued = 0
        self.order: list[str] = []

    async def start(self, request: StartRequest) -> ObjectRef:
        turn = self.issued // 2
        self.issued += 1
        await asyncio.sleep(0.01 * turn)
        ref = await super().start(request)
        self.order.append("started")
        return ref

    async def release(self, ref: ObjectRef) -> None:
        self.order.append("release")
        await super().release(ref)


async def test_a_slice_is_released_after_all_its_starts(sqlite_store: Store) -> None:
    """Releasing while a slice's Start batches are still in flight slows them by a third
    on a real slurmctld (bench/burst README: 133 -> 91 jobs/s through the adapter): the
    slice's recorded refs are released together once its Starts have returned, each
    still recorded first, each still released once."""
    clock = [NOW]
    fake = InTurns(clock)
    burst = add(sqlite_store, 8)
    r = rec(sqlite_store, fake, clock, submit_slice=8)
    report = await r.tick()
    assert report.actions["submit"] == 8 and not report.errors
    assert fake.order == ["started"] * 8 + ["release"] * 8
    assert {fake.jobs[sid].obs.state for sid in fake.jobs} == {State.PENDING}
    assert submitted(fake) == burst
    # held jobs are never released
    held = add(sqlite_store, 2)
    with sqlite_store.transaction() as tx:
        repo.set_desired(tx, held, Desired.HELD, now=2)
    fake.order.clear()
    await r.tick()
    assert fake.order == ["started", "started"]


class Slow(FakeSlurm):
    """Starts that each take a while (a Start batch's shell on a real cluster), and a
    note of how many plan commits had happened when each Start began and returned."""

    def __init__(self, clock: list[int], commits: list[int]) -> None:
        super().__init__(clock)
        self.commits = commits
        self.began: list[int] = []
        self.returned: list[int] = []
        self.in_flight = 0
        self.most = 0

    async def start(self, request: StartRequest) -> ObjectRef:
        self.began.append(len(self.commits))
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        await asyncio.sleep(0.05)
        self.in_flight -= 1
        ref = await super().start(request)
        self.returned.append(len(self.commits))
        return ref


async def test_a_slice_is_started_a_wave_at_a_time_while_the_next_is_planned(
        sqlite_store: Store) -> None:
    """A slice larger than ``action_concurrency`` goes in waves: each wave's intents are
    committed and its Starts begin before the next wave is planned and committed, so the
    Start batches never wait for the rest of the slice to be planned (before: one commit
    for the whole slice, then every Start; bench/burst README). At most two waves are in
    flight; every job is still submitted once, its intent committed first, and the
    slice released after all its Starts."""
    clock = [NOW]
    commits: list[int] = []
    fake = Slow(clock, commits)
    burst = add(sqlite_store, 12)
    r = rec(sqlite_store, fake, clock, submit_slice=12, action_concurrency=3)
    commit = r.applier.commit_plans

    def counting(plans: object, now: int) -> tuple[set[str], set[str]]:
        out = commit(plans, now)  # type: ignore[arg-type]
        commits.append(len(plans))  # type: ignore[arg-type]
        return out

    r.applier.commit_plans = counting  # type: ignore[method-assign]
    report = await r.tick()
    assert report.actions["submit"] == 12 and report.actions["release"] == 12
    assert commits == [3, 3, 3, 3]  # four waves of three intents
    # every Start after its own wave's commit; the first wave's Starts began before the
    # later waves were committed (they overlap), and no more than two waves ran at once
    assert fake.began[:3] == [1, 1, 1], fake.began
    assert min(fake.returned[:3]) < 4, fake.returned
    assert sorted(fake.began) == fake.began and fake.began[-1] == 4
    assert fake.most <= 6, fake.most
    assert submitted(fake) == burst
    assert {fake.jobs[sid].obs.state for sid in fake.jobs} == {State.PENDING}


async def test_a_tick_past_its_budget_reads_the_rows_of_what_it_plans_only(
        sqlite_store: Store) -> None:
    """A new leader of many settled jobs, with a budget for one chunk per tick, reads the
    status rows of the chunk it plans, not the current ref of every job it will plan in
    later ticks: at 1M jobs that read (15 s) spent every tick's budget before any
    planning, so a cold leader planned one chunk of 2,000 per 17 s tick (bench/failover
    at 1M never finished). Each job is still planned, once its tick comes."""
    from sqlalchemy import event

    clock = [NOW]
    fake = FakeSlurm(clock)
    jobs = set(add(sqlite_store, 40))
    first = rec(sqlite_store, fake, clock)
    await first.tick()
    fake.run_all_pending()
    await first.tick()  # settled: every job running, its ref recorded
    bound: list[int] = []

    def count(conn: object, cursor: object, statement: str, parameters: object,
              context: object, executemany: bool) -> None:
        if "job_status" in statement:
            rows = parameters if executemany else [parameters]
            bound.append(sum(1 for row in rows  # type: ignore[union-attr]
                             for value in (row.values() if isinstance(row, dict) else row)
                             if value in jobs))

    event.listen(sqlite_store.engine, "before_cursor_execute", count)
    try:
        r = rec(sqlite_store, fake, clock, budget_s=0.0, plan_chunk=5)
        report = await r.tick()
    finally:
        event.remove(sqlite_store.engine, "before_cursor_execute", count)
    assert report.planned == 5 and report.deferred == 35
    assert sum(bound) <= 2 * 5, bound  # (the chunk's rows, read in full)
    planned = report.planned
    while planned < 40:
        rep = await r.tick()
        assert rep.planned >= 5
        planned += rep.planned
    assert fake.calls.count("start") == 40  # (nothing submitted again)


async def test_a_tick_budget_counts_its_own_time_not_other_shards_ticks(
        tmp_path: Path) -> None:
    """bench/shards, one replica of 10 x 100k: its shards' cold first ticks ran on one
    event loop, each yielding between chunks to the others, and each spent its whole
    budget (a wall clock) waiting for them: every tick planned one chunk of 2,000 jobs
    and read 100k squeue rows again for the next one. A tick's budget counts its own
    steps on the loop, not its waits, in which other ticks run: two ticks side by side
    plan as much as one alone. (Until issue 19's stop 27 the wait of the second tick
    for the first one's chunk, after its own read, still counted: it planned (10, 20).)
    Its wall time is bound too: at ``WALL_BUDGETS`` budgets, waits included."""
    t = [0.0]  # the budget's clock: one second per chunk of rows read, nothing else

    async def prepared(name: str) -> Reconciler:
        store = Store(f"sqlite:///{tmp_path / name}.db")
        store.migrate()
        clock = [NOW]
        fake = FakeSlurm(clock)
        add(store, 30)
        settle = rec(store, fake, clock)
        await settle.tick()  # submitted
        fake.run_all_pending()
        await settle.tick()  # settled: every job running, its status written
        r = rec(store, fake, clock, budget_s=2.5, timer=lambda: t[0], plan_chunk=5)
        rows = r.memory.with_rows

        def counted(*args: Any, **kwargs: Any) -> Any:
            t[0] += 1.0
            return rows(*args, **kwargs)

        r.memory.with_rows = counted  # type: ignore[method-assign]
        return r

    alone = await prepared("alone")
    report = await alone.tick()
    assert (report.planned, report.deferred) == (15, 15)
    pair = [await prepared("a"), await prepared("b")]
    reports = await asyncio.gather(*(r.tick() for r in pair))
    assert [(r.planned, r.deferred) for r in reports] == [(15, 15), (15, 15)]
    # a tick whose every chunk waits 3 s (the clock moves while it is suspended): its
    # own time is one second a chunk, but its wall time reaches 3 x 2.5 s after two
    slow = await prepared("slow")
    accounting = slow._accounting

    async def waited(*args: Any, **kwargs: Any) -> Any:
        asyncio.get_running_loop().call_soon(lambda: t.__setitem__(0, t[0] + 3.0))
        await asyncio.sleep(0)
        return await accounting(*args, **kwargs)

    slow._accounting = waited  # type: ignore[method-assign]
    report = await slow.tick()
    assert (report.planned, report.deferred) == (10, 20)


async def test_own_time_counts_a_coroutines_steps_not_its_waits() -> None:
    """``driven`` passes results, exceptions and cancellations through, and counts the
    time of its coroutine's steps only: the clock that moves while it is suspended (other
    tasks run) is not its own."""
    from controller.reconcile.tick import OwnTime, driven

    t = [0.0]
    own = OwnTime(lambda: t[0])

    async def work() -> str:
        t[0] += 1.0  # its own step
        asyncio.get_running_loop().call_soon(lambda: t.__setitem__(0, t[0] + 10.0))
        await asyncio.sleep(0)  # suspended: the other task moves the clock
        t[0] += 0.5
        assert own.now() == 1.5  # (the step running now is counted as it goes)
        return "done"

    assert await driven(work(), own) == "done"
    assert own.seconds == 1.5 and t[0] == 11.5 and own.step_began is None

    async def fails() -> None:
        await asyncio.sleep(0)
        raise ValueError("inside")

    with pytest.raises(ValueError, match="inside"):
        await driven(fails(), OwnTime(lambda: t[0]))

    cancelled = []
    gate = asyncio.Event()

    async def waits() -> None:
        try:
            await gate.wait()
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    task = asyncio.ensure_future(driven(waits(), OwnTime(lambda: t[0])))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cancelled == [True]
