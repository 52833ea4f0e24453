"""Cost proportional to change, and a new leader that starts from memory (issue 19).

- a steady tick reads the change feed, not every tracked job's row versions: with
  nothing changed it reads no version triple and no row; with three rows changed by a
  client, those three;
- a standby's shadow ticks write nothing (no row, no Slurm command but the live read);
- a warm standby's first tick as leader re-reads what the database says changed since
  its shadow ticks (a client's stop, the old leader's intent) and adopts the object of an
  intent the old leader committed before it submits anything; the jobs nothing changed
  are not planned again.
"""

from __future__ import annotations

import pytest
from sqlalchemy import event, select

from controller.metrics import Metrics
from controller.model.ids import new_job_id
from controller.model.job import Desired
from controller.model.obs import State
from controller.reconcile.tick import Reconciler, TickSettings
from controller.store import repo
from controller.store.db import Store
from controller.store.models import Job, JobStatus
from tests.fakeslurm import FakeSlurm

DOC = {"command": ["true"], "workdir": "/tmp"}
NOW = 1_800_000_000


@pytest.fixture
def clock() -> list[int]:
    return [NOW]


def add(store: Store, n: int) -> list[str]:
    ids = [str(new_job_id()) for _ in range(n)]
    with store.transaction() as tx:
        for job_id in ids:
            repo.insert_job(tx, job_id=job_id, document=DOC, now=1)
    return ids


def rec(store: Store, fake: FakeSlurm, clock: list[int]) -> Reconciler:
    return Reconciler(store, fake, metrics=Metrics(), clock=lambda: clock[0],
                      settings=TickSettings())


async def settled(store: Store, fake: FakeSlurm, clock: list[int],
                  n: int) -> tuple[Reconciler, list[str]]:
    """A leader with ``n`` jobs running, whose last tick changed nothing."""
    ids = add(store, n)
    leader = rec(store, fake, clock)
    await leader.tick()
    fake.run_all_pending()
    for _ in range(3):
        clock[0] += 5
        await leader.tick()
    return leader, ids


class Statements:
    """Every SQL statement SQLite runs for ``store`` while it is open, as SQLite sees it
    (``set_trace_callback`` on each connection checked out: the raw DBAPI cursors of
    the bulk reads included)."""

    def __init__(self, store: Store) -> None:
        self.engine = store.engine
        self.seen: list[str] = []

    def _trace(self, statement: str) -> None:
        self.seen.append(" ".join(statement.split()))

    def _checkout(self, dbapi_connection: object, record: object, proxy: object) -> None:
        dbapi_connection.set_trace_callback(self._trace)  # type: ignore[attr-defined]

    def __enter__(self) -> list[str]:
        event.listen(self.engine, "checkout", self._checkout)
        return self.seen

    def __exit__(self, *exc: object) -> None:
        event.remove(self.engine, "checkout", self._checkout)
        self.engine.dispose()  # (no connection keeps the callback)


def versions_read_in_full(statements: list[str]) -> list[str]:
    """The statements that read the row versions of every tracked job (no restriction
    by change stamp or by id)."""
    return [s for s in statements
            if s.startswith("SELECT jobs.id, jobs.version, job_status.version")
            and "jobs.id IN (" not in s]


async def test_a_steady_tick_reads_only_the_rows_that_changed(sqlite_store: Store,
                                                              clock: list[int]) -> None:
    fake = FakeSlurm(clock)
    leader, ids = await settled(sqlite_store, fake, clock, 60)
    clock[0] += 5
    with Statements(sqlite_store) as statements:
        report = await leader.tick()
    assert report.tracked == 60 and report.planned == 0
    assert statements and versions_read_in_full(statements) == []
    assert (report.full_load, report.changed_rows, report.reloaded) == (False, 0, 0)
    with sqlite_store.transaction() as tx:  # a client stops three jobs
        repo.set_desired(tx, ids[:3], Desired.STOPPED, now=clock[0])
    clock[0] += 5
    with Statements(sqlite_store) as statements:
        report = await leader.tick()
    assert versions_read_in_full(statements) == []
    assert (report.changed_rows, report.reloaded, report.planned) == (3, 3, 3)
    assert fake.calls.count("stop") == 3


async def test_a_shadow_tick_writes_nothing(sqlite_store: Store, clock: list[int]) -> None:
    fake = FakeSlurm(clock)
    _, ids = await settled(sqlite_store, fake, clock, 20)
    add(sqlite_store, 2)  # new rows: the standby would submit them as leader
    with sqlite_store.transaction() as tx:
        repo.set_desired(tx, ids[:2], Desired.STOPPED, now=clock[0])
        before = sorted(tx.execute(select(Job.id, Job.version, Job.changed)))
        status_before = sorted(tx.execute(select(JobStatus.job_id, JobStatus.version)))
    standby = rec(sqlite_store, fake, clock)
    fake.calls.clear()
    clock[0] += 5
    with Statements(sqlite_store) as statements:
        report = await standby.shadow()
        await standby.shadow()
    assert report.slurm_ok and report.tracked == 22 and report.planned == 22
    assert fake.calls == ["find_many", "find_many"]
    assert not [s for s in statements if not s.startswith("SELECT")]
    with sqlite_store.transaction() as tx:
        assert sorted(tx.execute(select(Job.id, Job.version, Job.changed))) == before
        assert sorted(tx.execute(select(JobStatus.job_id, JobStatus.version))) == status_before


async def test_a_warm_standby_adopts_before_it_submits_and_rereads_what_changed(
        sqlite_store: Store, clock: list[int]) -> None:
    fake = FakeSlurm(clock)
    leader, ids = await settled(sqlite_store, fake, clock, 30)
    standby = rec(sqlite_store, fake, clock)
    clock[0] += 5
    shadow = await standby.shadow()
    assert shadow.planned == 30
    # the old leader's last tick: a new job's intent committed and its sbatch made, the
    # ref never recorded (it died there)
    (new,) = add(sqlite_store, 1)
    fake.crash_after_sbatch = True
    clock[0] += 5
    await leader.tick()
    fake.crash_after_sbatch = False
    (made,) = [sid for sid, fj in fake.jobs.items() if fj.obs.ref.uid == f"dj-{new}"]
    # then a client stops a job, with no leader
    with sqlite_store.transaction() as tx:
        repo.set_desired(tx, [ids[0]], Desired.STOPPED, now=clock[0])
    clock[0] += 5
    await standby.shadow()  # still a standby: sees both, does nothing
    assert fake.calls.count("stop") == 0
    standby.lead()
    fake.calls.clear()
    clock[0] += 5
    report = await standby.tick()
    assert fake.calls.count("start") == 0, fake.calls  # adopted, not submitted again
    assert fake.calls.count("stop") == 1 and fake.jobs[made].obs.state != State.ENDED
    assert not report.full_load and report.planned <= 3 and report.skipped >= 28
    with sqlite_store.transaction() as tx:
        views = {v.id: v for v in repo.list_jobs(tx)}
    assert views[new].slurm_job_id == made
    ended = [fj for fj in fake.jobs.values() if fj.obs.ref.uid == f"dj-{ids[0]}"]
    assert [fj.obs.state for fj in ended] == [State.ENDED]
