"""The leader lease on real SQLite and PostgreSQL: compare-and-set acquire and renew,
epochs, the fence on every write transaction, the Slurm-write deadline, and a stale
leader that writes nothing (to the database or to Slurm) after another took over."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import func, select, update

from controller.errors import LeaseLost
from controller.metrics import Metrics
from controller.model.obs import ObjectRef, StartRequest
from controller.reconcile.tick import Reconciler, TickSettings
from controller.store import repo
from controller.store.db import Store
from controller.store.lease import Lease, read_lease
from controller.store.models import Event, JobStatus, Submission
from tests.fakeslurm import FakeSlurm

DOC = {"command": ["true"], "workdir": "/tmp"}
T0 = 1_800_000_000.0


class Clocks:
    """A wall clock and a monotonic clock that tests move by hand."""

    def __init__(self) -> None:
        self.wall = T0
        self.mono = 1000.0

    def advance(self, seconds: float) -> None:
        self.wall += seconds
        self.mono += seconds


def lease(store: Store, clocks: Clocks, holder: str, *, ttl: float = 30,
          margin: float = 5) -> Lease:
    return Lease(store, ttl_s=ttl, margin_s=margin, holder=holder,
                 clock=lambda: clocks.wall, monotonic=lambda: clocks.mono)


def ids(n: int) -> list[str]:
    return [f"01JZ8Q2N5V00000000000000{i:02d}" for i in range(n)]


def add(store: Store, job_ids: list[str]) -> None:
    with store.transaction() as tx:
        for jid in job_ids:
            repo.insert_job(tx, job_id=jid, document=DOC, now=1)


def counts(store: Store) -> tuple[int, int, int, int]:
    """Rows the controller writes, plus the sum of status versions (moves on any write)."""
    with store.transaction() as tx:
        return (tx.scalar(select(func.count()).select_from(JobStatus)) or 0,
                tx.scalar(select(func.count()).select_from(Submission)) or 0,
                tx.scalar(select(func.count()).select_from(Event)) or 0,
                tx.scalar(select(func.coalesce(func.sum(JobStatus.version), 0))) or 0)


def test_one_holder_epochs_and_takeover(any_store: Store) -> None:
    clocks = Clocks()
    a, b = lease(any_store, clocks, "a"), lease(any_store, clocks, "b")
    assert a.try_acquire() and a.epoch == 1
    assert not b.try_acquire() and b.epoch is None
    clocks.advance(20)
    assert a.try_acquire() and a.epoch == 1  # renewed, same epoch
    clocks.advance(29)
    assert not b.try_acquire()  # a renewed 29 s ago: still valid
    clocks.advance(2)
    assert b.try_acquire() and b.epoch == 2  # expired: taken, epoch moves
    assert not a.renew() and a.epoch is None  # a learns it lost
    assert not a.try_acquire()
    with any_store.transaction() as tx:
        info = read_lease(tx)
    assert info is not None and (info.holder, info.epoch) == ("b", 2)
    b.release()
    assert a.try_acquire() and a.epoch == 3  # released: taken at once


def test_fence_rolls_back_a_stale_leaders_transaction(any_store: Store) -> None:
    clocks = Clocks()
    a, b = lease(any_store, clocks, "a"), lease(any_store, clocks, "b")
    add(any_store, ids(1))
    assert a.try_acquire()
    clocks.advance(31)
    assert b.try_acquire()
    with pytest.raises(LeaseLost), any_store.transaction() as tx:
        a.check(tx)
        repo.add_event(tx, ids(1)[0], "Stale", "must never be committed", now=1)
    assert counts(any_store)[2] == 0
    assert a.epoch is None


def test_guard_refuses_slurm_writes_near_the_deadline(any_store: Store) -> None:
    clocks = Clocks()
    a = lease(any_store, clocks, "a", ttl=30, margin=5)
    assert a.try_acquire()
    a.guard()
    clocks.advance(16)  # under half the TTL left: guard renews first
    a.guard()
    assert a.remaining() == pytest.approx(25)
    # stalled (SIGSTOP): the monotonic clock runs on; the database says nothing new
    clocks.mono += 26
    b = lease(any_store, clocks, "b")
    clocks.wall += 31
    assert b.try_acquire()
    with pytest.raises(LeaseLost):
        a.guard()
    assert a.epoch is None


def test_guard_without_a_database_stops_at_the_deadline(sqlite_store: Store,
                                                       tmp_path: Path) -> None:
    clocks = Clocks()
    a = lease(sqlite_store, clocks, "a", ttl=30, margin=5)
    assert a.try_acquire()
    a.store = Store(f"sqlite:///{tmp_path}/no/such/dir/dispatch.db")  # database gone
    clocks.mono += 24.9
    a.guard()  # the renewal failed, but 0.1 s of the lease is left
    clocks.mono += 0.2
    with pytest.raises(LeaseLost):
        a.guard()
    assert a.epoch is None


def make(store: Store, clocks: Clocks, fence: Lease) -> tuple[Reconciler, FakeSlurm]:
    wall = [int(clocks.wall)]
    fake = FakeSlurm(wall)
    rec = Reconciler(store, fake, metrics=Metrics(), clock=lambda: clocks.wall,
                     settings=TickSettings(unknown_grace_s=100, adopt_window_s=60),
                     fence=fence)
    return rec, fake


async def test_stale_leader_writes_nothing_after_takeover(any_store: Store) -> None:
    """The leader stalls after its lease renewal; a standby takes over; when the old one
    resumes its tick it neither commits a plan nor touches Slurm."""
    clocks = Clocks()
    a, b = lease(any_store, clocks, "a"), lease(any_store, clocks, "b")
    assert a.try_acquire()
    rec_a, fake = make(any_store, clocks, a)
    add(any_store, ids(3))
    await rec_a.tick()
    assert fake.calls.count("start") == 3
    add(any_store, ids(6)[3:])
    clocks.advance(31)  # a stalls past its lease: b takes over
    assert b.try_acquire() and b.epoch == 2
    before = counts(any_store)
    fake.calls.clear()
    with pytest.raises(LeaseLost):
        await rec_a.tick()
    assert fake.calls == ["find_many"]  # a read, no write
    assert counts(any_store) == before
    # the new leader submits the three new jobs exactly once
    rec_b = Reconciler(any_store, fake, metrics=Metrics(), clock=lambda: clocks.wall,
                       settings=TickSettings(unknown_grace_s=100, adopt_window_s=60),
                       fence=b)
    fake.calls.clear()
    await rec_b.tick()
    assert fake.calls.count("start") == 3
    with any_store.transaction() as tx:
        epochs = sorted(e for (e,) in tx.execute(select(Submission.epoch)))
    assert epochs == [1, 1, 1, 2, 2, 2]


async def test_stale_leader_stops_between_actions(any_store: Store) -> None:
    """The lease runs out while the tick applies its actions: the rest are not run, and
    no later wave's intent is committed under the lost epoch (waves of one here)."""
    clocks = Clocks()
    a = lease(any_store, clocks, "a")
    assert a.try_acquire()
    rec, fake = make(any_store, clocks, a)
    add(any_store, ids(4))
    real_start = fake.start
    b = lease(any_store, clocks, "b")

    async def slow_start(request: StartRequest) -> ObjectRef:
        ref = await real_start(request)
        if fake.calls.count("start") == 1:  # the process stalls during the first sbatch
            clocks.advance(40)
            assert b.try_acquire()
        return ref

    fake.start = slow_start  # type: ignore[method-assign]
    rec.settings = TickSettings(unknown_grace_s=100, adopt_window_s=60, action_concurrency=1)
    with pytest.raises(LeaseLost):
        await rec.tick()
    assert fake.calls.count("start") == 1
    assert "release" not in fake.calls  # the object is left gated for the new leader
    with any_store.transaction() as tx:
        rows = [(s.slurm_job_id, s.epoch) for s in tx.scalars(select(Submission))]
    # the first wave's intent, and at most the second's (committed while the first
    # sbatch ran, before the lease moved); nothing recorded under the lost epoch
    assert 1 <= len(rows) <= 2 and rows == [(None, 1)] * len(rows), rows


async def test_release_only_what_is_recorded(any_store: Store) -> None:
    """The intent stops being current while sbatch runs (abandoned by a replan): the new
    gated object is cancelled as a duplicate and never released."""
    clocks = Clocks()
    a = lease(any_store, clocks, "a")
    assert a.try_acquire()
    rec, fake = make(any_store, clocks, a)
    (jid,) = ids(1)
    add(any_store, [jid])
    real_start = fake.start

    async def start_then_abandoned(request: StartRequest) -> ObjectRef:
        ref = await real_start(request)
        with any_store.transaction() as tx:  # what a replan by the same leader could do
            tx.execute(update(Submission).where(Submission.job_id == jid)
                       .values(status="abandoned"))
            tx.execute(update(JobStatus).where(JobStatus.job_id == jid)
                       .values(current_submission=None))
        return ref

    fake.start = start_then_abandoned  # type: ignore[method-assign]
    await rec.tick()
    assert fake.calls.count("start") == 1
    assert "release" not in fake.calls
    assert "stop" in fake.calls
    (job,) = fake.jobs.values()
    assert job.obs.state.value == "ended"
    with any_store.transaction() as tx:
        (sub,) = tx.scalars(select(Submission))
        assert (sub.status, sub.slurm_job_id) == ("abandoned", None)


def test_stopped_leaders_lock_is_taken_back_on_postgresql(pg_url: str) -> None:
    """A leader stopped inside a fenced transaction holds the lease row's lock; the server
    ends its session (idle_in_transaction_session_timeout) so the standby can take over,
    and the stopped leader's transaction can never commit."""
    store = Store(pg_url, idle_tx_timeout_s=1)
    store.migrate()
    clocks = Clocks()
    a, b = lease(store, clocks, "a"), lease(store, clocks, "b")
    assert a.try_acquire()
    add(store, ids(1))
    session = store._sessions()  # a transaction left open, as by a stopped process
    session.begin()
    a.check(session)
    repo.add_event(session, ids(1)[0], "Stale", "never committed", now=1)
    session.flush()
    clocks.advance(31)
    assert b.try_acquire() and b.epoch == 2  # not blocked for good behind a's row lock
    with pytest.raises(Exception):  # noqa: B017 -- the server ended a's session
        session.commit()
    session.close()
    assert counts(store)[2] == 0
    store.dispose()


def test_refresh_renews_only_past_half_the_ttl(sqlite_store: Store) -> None:
    clocks = Clocks()
    a = lease(sqlite_store, clocks, "a", ttl=30, margin=5)
    assert a.try_acquire()
    clocks.advance(5)
    a.refresh()
    assert a.remaining() == pytest.approx(20)  # not renewed: more than half left
    clocks.advance(6)
    a.refresh()
    assert a.remaining() == pytest.approx(25)  # renewed
    with sqlite_store.transaction() as tx:
        info = read_lease(tx)
    assert info is not None and info.expires_at == pytest.approx(clocks.wall + 30)
