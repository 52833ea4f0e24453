"""New jobs are submitted while the tick's live read runs (issue 13: single-row latency
and the read off a burst's path), but only those that no Slurm object can belong to: no
status row (so no intent was ever committed, and every sbatch follows one) and a name
absent from the last complete live read of this leadership. A job whose row was deleted
and written again under the same id while its object runs is adopted, as before, never
submitted twice; the first tick of a leadership, and every tick after a failed read
until one succeeds, plans new jobs after the read."""

from __future__ import annotations

import asyncio
from collections.abc import Collection

from sqlalchemy import select, text

from controller.metrics import Metrics
from controller.model.ids import new_job_id
from controller.model.obs import ObjectObs, State
from controller.reconcile.tick import Reconciler, TickSettings
from controller.store import repo
from controller.store.db import Store
from controller.store.models import JobStatus
from tests.fakeslurm import FakeJob, FakeSlurm

DOC = {"command": ["true"], "workdir": "/tmp"}
NOW = 1_800_000_000


class SlowRead(FakeSlurm):
    """A live read that takes a while (squeue on a table of thousands of jobs), with
    the order in which reads began and ended and Starts ran."""

    def __init__(self, clock: list[int]) -> None:
        super().__init__(clock)
        self.order: list[str] = []
        self.read_s = 0.0

    async def find_many(self, job_ids: Collection[str], *,
                        strays: dict[str, list[ObjectObs]] | None = None,
                        ) -> dict[str, list[ObjectObs]]:
        self.order.append("read")
        await asyncio.sleep(self.read_s)
        try:
            return await super().find_many(job_ids, strays=strays)
        finally:
            self.order.append("read done")

    async def start(self, request):  # type: ignore[no-untyped-def]
        self.order.append("start")
        return await super().start(request)


def add(store: Store, job_id: str | None = None) -> str:
    job_id = job_id or str(new_job_id())
    with store.transaction() as tx:
        repo.insert_job(tx, job_id=job_id, document=DOC, now=1)
    return job_id


def rec(store: Store, fake: FakeSlurm, clock: list[int]) -> Reconciler:
    return Reconciler(store, fake, metrics=Metrics(), clock=lambda: clock[0],
                      settings=TickSettings())


async def one_running_job(store: Store) -> tuple[SlowRead, Reconciler, str, FakeJob]:
    """A leader's reconciler with one job running (two ticks: submitted, then seen
    running): the fake, the reconciler, the job id and its Slurm job."""
    clock = [NOW]
    fake = SlowRead(clock)
    job = add(store)
    r = rec(store, fake, clock)
    await r.tick()
    fake.run_all_pending()
    await r.tick()
    (first,) = fake.jobs.values()
    assert first.obs.state == State.RUNNING
    return fake, r, job, first


async def written_again_and_adopted(store: Store, fake: SlowRead, r: Reconciler, job: str,
                                    first: FakeJob) -> None:
    """The job's row is written again; the next tick plans it after its read, which
    adopts its running Slurm job: no Start, no second object."""
    add(store, job)
    fake.order.clear()
    report = await r.tick()
    assert "start" not in fake.order, fake.order
    assert report.actions["submit"] == 0 and len(fake.jobs) == 1
    with store.transaction() as tx:
        status = tx.scalar(select(JobStatus).where(JobStatus.job_id == job))
        assert status is not None and status.phase == "running"
        assert status.slurm_job_id == first.obs.ref.id


async def test_a_new_row_is_submitted_while_the_read_runs(sqlite_store: Store) -> None:
    clock = [NOW]
    fake = SlowRead(clock)
    r = rec(sqlite_store, fake, clock)
    await r.tick()  # the leadership's first read
    fake.read_s = 0.2
    fake.order.clear()
    job = add(sqlite_store)
    report = await r.tick()
    assert report.actions["submit"] == 1 and report.actions["release"] == 1
    # the Start ran before the read returned; the read still ran once
    assert fake.order == ["read", "start", "read done"], fake.order
    assert [fj.obs.ref.uid for fj in fake.jobs.values()] == [f"dj-{job}"]
    # the next tick plans it from its observation, and submits nothing more
    fake.order.clear()
    await r.tick()
    assert fake.order == ["read", "read done"]


async def test_a_leaders_first_tick_reads_before_it_submits(sqlite_store: Store) -> None:
    clock = [NOW]
    fake = SlowRead(clock)
    add(sqlite_store)
    r = rec(sqlite_store, fake, clock)
    await r.tick()
    assert fake.order == ["read", "read done", "start"]
    r.forget()  # leadership lost and taken again: nothing read in this one yet
    fake.order.clear()
    add(sqlite_store)
    await r.tick()
    assert fake.order == ["read", "read done", "start"]


async def test_a_row_written_again_under_the_same_id_adopts_its_running_object(
        sqlite_store: Store) -> None:
    """The row of a running job is deleted and written again with the same id before
    the next tick: it has no status row, but its name was in the last read, so it is
    planned after the read, which adopts the running object (no second run)."""
    fake, r, job, first = await one_running_job(sqlite_store)
    with sqlite_store.transaction() as tx:
        repo.delete_job(tx, job)
    await written_again_and_adopted(sqlite_store, fake, r, job, first)


async def test_after_a_failed_read_new_rows_wait_for_a_read(sqlite_store: Store) -> None:
    clock = [NOW]
    fake = SlowRead(clock)
    r = rec(sqlite_store, fake, clock)
    await r.tick()
    fake.fail_live = True
    await r.tick()  # the read fails: nothing known of Slurm now
    add(sqlite_store)
    fake.order.clear()
    report = await r.tick()
    assert not report.slurm_ok and fake.order == ["read", "read done"]
    assert not fake.jobs
    fake.fail_live = False
    fake.order.clear()
    await r.tick()
    assert fake.order == ["read", "read done", "start"]


async def test_a_new_row_whose_name_the_last_read_saw_as_a_stray_is_adopted(
        sqlite_store: Store) -> None:
    """The database is restored from before a job existed while its object runs (no row,
    no status, no tombstone: the object is a stray of the next read); a client writes the
    row again. The last read saw its name among the strays, so it is planned after the
    read, which adopts the running object: never a second sbatch."""
    fake, r, job, first = await one_running_job(sqlite_store)
    with sqlite_store.transaction() as tx:  # the restore: nothing of the job is left
        # (the tombstones last: deleting the row writes one)
        for table in ("events", "submissions", "job_status", "jobs", "tombstones"):
            column = "id" if table == "jobs" else "job_id"
            tx.execute(text(f"DELETE FROM {table} WHERE {column} = :job"), {"job": job})
        tx.execute(text("UPDATE change_seq SET n = 0"))  # (the restored feed's mark)
    report = await r.tick()  # its object is a stray of this read: unknown, not swept
    assert report.full_load and report.tracked == 0  # (the mark went back: all read)
    assert report.actions["sweep"] == 0 and first.obs.state == State.RUNNING
    await written_again_and_adopted(sqlite_store, fake, r, job, first)
