"""Exactly once, round three (issue 18): the tick writes only what this database owns,
fences each tick by the epoch it began with, and its fast paths never starve, leak or
double-run. One test per defect found by the review, each written to fail first.

- a ``dj-`` Slurm job whose id this database never had is a neighbour deployment's:
  counted and listed, never written (even by a daemon on an empty database);
- a row deleted by SQL leaves a tombstone (its live job is still stopped by its own
  deployment; the id written again is read before it is submitted);
- a tick whose lease was lost and taken again behind it writes nothing more;
- new rows submitted before the read never starve jobs with a status;
- an action outcome of a job that left tracking is dropped with it;
- a failed read of any kind ends the tick at once, even with Starts in flight;
- the sweep asks the database who owns a job at its end, not at the tick's start;
- a recorded ref whose status half failed leaves its submission row a duplicate.
"""

from __future__ import annotations

import asyncio
import gc
import shutil
from collections.abc import Collection, Sequence
from pathlib import Path

import pytest
from sqlalchemy import select, text, update

from controller.errors import (
    CommandFailed,
    ErrBackPressure,
    LeaseLost,
    OwnershipConflict,
    TransientError,
)
from controller.metrics import Metrics
from controller.model.ids import new_job_id
from controller.model.job import Desired
from controller.model.obs import (
    Cause,
    CauseKind,
    ObjectObs,
    ObjectRef,
    Source,
    StartRequest,
    State,
)
from controller.reconcile.plan import ClaimStep, claim
from controller.reconcile.tick import Reconciler, TickSettings
from controller.store import repo
from controller.store.db import Store
from controller.store.lease import Lease
from controller.store.models import JobStatus, Submission, Tombstone
from tests.fakeslurm import FakeJob, FakeSlurm

DOC = {"command": ["true"], "workdir": "/tmp"}
NOW = 1_800_000_000


def add(store: Store, job_id: str | None = None) -> str:
    job_id = job_id or str(new_job_id())
    with store.transaction() as tx:
        repo.insert_job(tx, job_id=job_id, document=DOC, now=1)
    return job_id


def delete(store: Store, job_id: str) -> None:
    with store.transaction() as tx:
        repo.delete_job(tx, job_id)


def rec(store: Store, fake: FakeSlurm, clock: list[int], **kwargs: object) -> Reconciler:
    return Reconciler(store, fake, metrics=Metrics(), clock=lambda: clock[0],
                      settings=TickSettings(), **kwargs)  # type: ignore[arg-type]


def neighbour(fake: FakeSlurm, clock: list[int], *, state: State = State.RUNNING) -> int:
    """A job of another deployment on the same Slurm account: our name format, our
    comment, an id this database never had."""
    slurm_id = fake.next_id
    fake.next_id += 1
    ref = ObjectRef(fake.cluster, f"dj-{new_job_id()}", slurm_id, clock[0])
    fake.jobs[slurm_id] = FakeJob(ObjectObs(
        ref=ref, state=state, cause=Cause(), submission=1, attempt=0, foreign=False,
        restart_count=0, hold_instance=None, requeued=False, exit_code=None, nodes=("n1",),
        reason="", submit=clock[0], start=clock[0], end=None, source=Source.LIVE,
        observed_at=clock[0]))
    return slurm_id


async def running(store: Store, fake: FakeSlurm,
                  clock: list[int]) -> tuple[Reconciler, str, int]:
    """A reconciler, and one job of it running on ``fake`` (its row, its Slurm id)."""
    job = add(store)
    r = rec(store, fake, clock)
    await r.tick()
    fake.run_all_pending()
    await r.tick()
    (sid,) = fake.jobs
    return r, job, sid


def objects_of(fake: FakeSlurm, job_id: str) -> list[FakeJob]:
    return [fj for fj in fake.jobs.values() if fj.obs.ref.uid == f"dj-{job_id}"]


def status(store: Store, job_id: str) -> JobStatus | None:
    with store.transaction() as tx:
        row = tx.scalar(select(JobStatus).where(JobStatus.job_id == job_id))
        if row is not None:
            tx.expunge(row)
        return row


class Hooked(FakeSlurm):
    """A fake whose live read runs a hook first (what happens while squeue runs)."""

    def __init__(self, clock: list[int]) -> None:
        super().__init__(clock)
        self.during_read: list[object] = []
        self.gc_during_read: list[bool] = []

    async def find_many(self, job_ids: Collection[str], *,
                        strays: dict[str, list[ObjectObs]] | None = None,
                        ) -> dict[str, list[ObjectObs]]:
        self.gc_during_read.append(gc.isenabled())
        while self.during_read:
            hook = self.during_read.pop(0)
            assert callable(hook)
            result = hook()
            if asyncio.iscoroutine(result):
                await result
        return await super().find_many(job_ids, strays=strays)


# ---------------------------------------------------------------- ownership


async def test_a_neighbours_job_is_counted_and_never_written(sqlite_store: Store) -> None:
    clock = [NOW]
    fake = FakeSlurm(clock)
    ours = add(sqlite_store)
    r = rec(sqlite_store, fake, clock)
    await r.tick()
    other = neighbour(fake, clock)
    pending = neighbour(fake, clock, state=State.PENDING)
    fake.calls.clear()
    report = await r.tick()
    assert fake.jobs[other].obs.state == State.RUNNING
    assert fake.jobs[pending].obs.state == State.PENDING
    assert "stop" not in fake.calls and report.actions["sweep"] == 0
    assert r.metrics.unowned._value.get() == 2
    with sqlite_store.transaction() as tx:
        listed = repo.list_unowned(tx)
    assert sorted(u.slurm_job_id for u in listed) == sorted([other, pending])
    assert objects_of(fake, ours)  # (our own job was submitted as usual)


async def test_a_daemon_on_an_empty_database_cancels_nothing(sqlite_store: Store) -> None:
    clock = [NOW]
    fake = FakeSlurm(clock)
    theirs = [neighbour(fake, clock) for _ in range(10)]
    r = rec(sqlite_store, fake, clock)
    await r.tick()
    await r.tick()
    assert [fake.jobs[sid].obs.state for sid in theirs] == [State.RUNNING] * 10
    assert "stop" not in fake.calls


async def test_a_deleted_row_leaves_a_tombstone_with_its_refs(any_store: Store) -> None:
    clock = [NOW]
    fake = FakeSlurm(clock)
    job = add(any_store)
    r = rec(any_store, fake, clock)
    await r.tick()
    (sid,) = fake.jobs
    delete(any_store, job)
    with any_store.transaction() as tx:
        (stone,) = repo.list_tombstones(tx)
        assert (stone.job_id, stone.refs) == (job, f"1={sid}@lab")
        assert repo.tombstoned(tx, [job, str(new_job_id())]) == {job}
    await r.tick()  # its live job is still this deployment's: stopped
    assert fake.jobs[sid].obs.state == State.ENDED


# ---------------------------------------------------------------- fencing


async def test_a_tick_writes_nothing_under_an_epoch_taken_again_behind_it(
        sqlite_store: Store) -> None:
    """The tick begins under E1 and waits on its read; the replica stalls past the TTL,
    another takes the lease (E2) and gives it up, and this replica's keeper takes it
    again (E3) while the tick still runs: the tick's later writes must not pass."""
    clock = [NOW]
    mono = [100.0]
    fake = Hooked(clock)
    ours = Lease(sqlite_store, ttl_s=10, margin_s=1, holder="a", clock=lambda: clock[0],
                 monotonic=lambda: mono[0])
    rival = Lease(sqlite_store, ttl_s=10, margin_s=1, holder="b", clock=lambda: clock[0],
                  monotonic=lambda: mono[0])
    assert ours.try_acquire()
    r = rec(sqlite_store, fake, clock, fence=ours)
    await r.tick()  # the leadership's first read
    job = add(sqlite_store)

    def stall_and_retake() -> None:
        clock[0] += 20
        mono[0] += 20
        assert rival.try_acquire()  # E2
        rival.release()
        assert ours.try_acquire()  # the keeper: E3, while the tick runs

    fake.during_read.append(stall_and_retake)
    r._seen = None  # (read before planning: the new row's plan comes after the stall)
    with pytest.raises(LeaseLost):
        await r.tick()
    assert not objects_of(fake, job) and "start" not in fake.calls
    assert status(sqlite_store, job) is None
    with sqlite_store.transaction() as tx:
        assert not tx.scalars(select(Submission)).all()


# ---------------------------------------------------------------- the fast path


async def test_a_row_written_again_one_tick_after_its_first_submission_runs_once(
        sqlite_store: Store) -> None:
    clock = [NOW]
    fake = Hooked(clock)
    r = rec(sqlite_store, fake, clock)
    await r.tick()  # the leadership's first read
    job = add(sqlite_store)
    await r.tick()  # submitted while the read (which cannot see it) runs
    assert len(objects_of(fake, job)) == 1
    delete(sqlite_store, job)
    add(sqlite_store, job)
    await r.tick()
    await r.tick()
    assert len(objects_of(fake, job)) == 1, [fj.obs for fj in objects_of(fake, job)]
    row = status(sqlite_store, job)
    assert row is not None and row.slurm_job_id == objects_of(fake, job)[0].obs.ref.id


async def test_new_rows_never_starve_the_jobs_with_a_status(sqlite_store: Store) -> None:
    clock = [NOW]
    fake = FakeSlurm(clock)
    r = Reconciler(sqlite_store, fake, metrics=Metrics(), clock=lambda: clock[0],
                   settings=TickSettings(), budget_s=0.0)  # every tick is over budget
    job = add(sqlite_store)
    await r.tick()
    await r.tick()
    fake.run_all_pending()
    (sid,) = fake.jobs
    with sqlite_store.transaction() as tx:
        repo.set_desired(tx, [job], Desired.STOPPED, now=2)
    for _ in range(3):
        add(sqlite_store)  # a stream of new rows
        clock[0] += 1
        await r.tick()
    assert fake.jobs[sid].obs.state == State.ENDED  # cancelled


async def test_an_outcome_of_a_job_that_left_tracking_is_spent(sqlite_store: Store) -> None:
    clock = [NOW]

    class Limited(FakeSlurm):
        async def start(self, request: StartRequest) -> ObjectRef:
            raise ErrBackPressure("QOSMaxSubmitJobPerUserLimit")

    fake = Limited(clock)
    r = rec(sqlite_store, fake, clock)
    job = add(sqlite_store)
    report = await r.tick()
    assert report.replan_soon  # the deferral waits for the job's next plan
    delete(sqlite_store, job)
    reports = [await r.tick() for _ in range(2)]
    assert [rp.replan_soon for rp in reports] == [False, False]


# ---------------------------------------------------------------- failed reads


async def test_an_unrecognised_read_error_takes_the_failed_read_path(
        sqlite_store: Store) -> None:
    clock = [NOW]

    class Odd(FakeSlurm):
        async def find_many(self, job_ids: Collection[str], *,
                            strays: dict[str, list[ObjectObs]] | None = None,
                            ) -> dict[str, list[ObjectObs]]:
            raise CommandFailed("squeue: error: something new")

    r = rec(sqlite_store, Odd(clock), clock)
    add(sqlite_store)
    report = await r.tick()
    assert not report.slurm_ok and r.metrics.slurm_up._value.get() == 0


async def test_a_dead_slurmctld_does_not_hold_the_tick(sqlite_store: Store) -> None:
    """slurmctld stops while new rows arrive: their Starts (before the read) hang on it;
    the read fails; the tick ends at once, and slurm_up says so."""
    clock = [NOW]
    never = asyncio.Event()

    class Dead(FakeSlurm):
        dead = False

        async def start(self, request: StartRequest) -> ObjectRef:
            if self.dead:
                await never.wait()  # sbatch retrying a controller that is gone
            return await super().start(request)

        async def find_many(self, job_ids: Collection[str], *,
                            strays: dict[str, list[ObjectObs]] | None = None,
                            ) -> dict[str, list[ObjectObs]]:
            if self.dead:
                await asyncio.sleep(0)  # (the Starts are under way)
                raise TransientError("Unable to contact slurm controller")
            return await super().find_many(job_ids, strays=strays)

    fake = Dead(clock)
    r = rec(sqlite_store, fake, clock)
    await r.tick()
    assert r.metrics.slurm_up._value.get() == 1
    fake.dead = True
    job = add(sqlite_store)
    report = await asyncio.wait_for(r.tick(), timeout=10)
    assert not report.slurm_ok and r.metrics.slurm_up._value.get() == 0
    # the intent was committed before its Start: the next tick adopts or abandons it
    with sqlite_store.transaction() as tx:
        assert [s.status for s in repo.list_submissions(tx, job)] == ["intent"]


async def test_a_tick_leaves_the_cyclic_collector_alone(sqlite_store: Store) -> None:
    clock = [NOW]
    fake = Hooked(clock)
    add(sqlite_store)
    r = rec(sqlite_store, fake, clock)
    assert gc.isenabled()
    await r.tick()
    assert fake.gc_during_read == [True]


# ---------------------------------------------------------------- the sweep


async def test_the_sweep_asks_who_owns_a_job_at_its_end(sqlite_store: Store) -> None:
    """A running job's row is deleted, then written again while the next tick reads:
    its object is the new row's (adopted next tick), never cancelled and run again."""
    clock = [NOW]
    fake = Hooked(clock)
    r, job, sid = await running(sqlite_store, fake, clock)
    delete(sqlite_store, job)
    fake.during_read.append(lambda: add(sqlite_store, job))
    await r.tick()
    await r.tick()
    assert [fj.obs.state for fj in fake.jobs.values()] == [State.RUNNING]
    row = status(sqlite_store, job)
    assert row is not None and (row.phase, row.slurm_job_id) == ("running", sid)


# ---------------------------------------------------------------- recording a ref


def test_a_ref_whose_status_did_not_take_it_leaves_a_duplicate_row(
        sqlite_store: Store) -> None:
    job = add(sqlite_store)
    ref = ObjectRef("lab", f"dj-{job}", 42, NOW)
    with sqlite_store.transaction() as tx:
        tx.add(JobStatus(job_id=job, phase="succeeded", submission=1, current_submission=1,
                         updated_at=1))
        tx.add(Submission(job_id=job, submission=1, attempt=0, status="intent",
                          created_at=1))
    with sqlite_store.transaction() as tx:
        assert repo.record_submitted_many(tx, [(job, 1, ref)]) == [False]
    with sqlite_store.transaction() as tx:
        (sub,) = repo.list_submissions(tx, job)
        assert sub.status == "duplicate"


def test_tombstones_expire_by_the_databases_clock(any_store: Store) -> None:
    """A tombstone's age is read on the clock that stamped it (the database's), never on
    the daemon's: a daemon whose clock runs weeks ahead keeps its tombstones."""
    job = add(any_store)
    delete(any_store, job)
    with any_store.transaction() as tx:
        assert repo.prune_tombstones(tx, ttl_s=3600) == 0
        assert repo.tombstoned(tx, [job]) == {job}
    with any_store.transaction() as tx:
        tx.execute(update(Tombstone).values(deleted_at_ms=Tombstone.deleted_at_ms - 7200_000))
    with any_store.transaction() as tx:
        assert repo.prune_tombstones(tx, ttl_s=3600) == 1
        assert repo.tombstoned(tx, [job]) == set()


async def test_a_row_written_again_while_its_job_runs_takes_that_jobs_ending(
        sqlite_store: Store) -> None:
    """A running job's row is deleted and written again, and the job completes before
    the new row's first plan: the new row takes that ending (succeeded), it is not
    submitted again (the simulator's seed 56: the work ran twice)."""
    clock = [NOW]
    fake = FakeSlurm(clock)
    r, job, sid = await running(sqlite_store, fake, clock)
    delete(sqlite_store, job)
    add(sqlite_store, job)
    clock[0] += 5
    fake.end(sid, CauseKind.COMPLETED)
    await r.tick()
    await r.tick()
    assert list(fake.jobs) == [sid] and fake.calls.count("start") == 1
    row = status(sqlite_store, job)
    assert row is not None and (row.phase, row.slurm_job_id) == ("succeeded", sid)


def test_the_adapters_write_guard_holds_the_ticks_epoch(sqlite_store: Store) -> None:
    """The adapter's last-moment write guard (``Lease.guard``, wired into every Slurm
    write) refuses once the lease was taken again behind the tick that pinned its epoch
    (the simulator's seed 5: a gated sbatch landed under epoch 3 for a tick of epoch 1)."""
    clock = [NOW]
    mono = [100.0]
    ours = Lease(sqlite_store, ttl_s=10, margin_s=1, holder="a", clock=lambda: clock[0],
                 monotonic=lambda: mono[0])
    rival = Lease(sqlite_store, ttl_s=10, margin_s=1, holder="b", clock=lambda: clock[0],
                  monotonic=lambda: mono[0])
    assert ours.try_acquire()
    ours.pin()  # a tick begins
    ours.guard()
    clock[0] += 20
    mono[0] += 20
    assert rival.try_acquire()
    rival.release()
    assert ours.try_acquire() and ours.epoch == 3
    with pytest.raises(LeaseLost):
        ours.guard()  # the tick of epoch 1 is still running
    ours.pin()  # the next tick, under epoch 3
    ours.guard()


async def test_a_plan_of_a_row_that_moved_while_the_tick_ran_is_not_written(
        sqlite_store: Store) -> None:
    """The row is deleted and written again while the tick reads accounting for it: the
    plan made from the old row is not committed (the simulator's seed 410: it wrote a
    submission row of the old life into the new row, whose own first Start was then
    taken for a duplicate and cancelled, and the job ended cancelled without running)."""
    clock = [NOW]
    hook: list[str] = []  # the rows written again while sacct is read

    class Rewritten(FakeSlurm):
        async def inspect_many(self, refs: Sequence[ObjectRef], *,
                               since: int) -> dict[ObjectRef, ObjectObs]:
            for job_id in hook:
                delete(sqlite_store, job_id)
                add(sqlite_store, job_id)
            hook.clear()
            return await super().inspect_many(refs, since=since)

    fake = Rewritten(clock)
    r, job, sid = await running(sqlite_store, fake, clock)
    fake.end(sid, CauseKind.COMPLETED)
    fake.forget(sid)  # left squeue: the tick asks sacct, and the row moves meanwhile
    hook.append(job)
    report = await r.tick()
    with sqlite_store.transaction() as tx:
        assert [(s.submission, s.slurm_job_id) for s in repo.list_submissions(tx, job)] == []
    assert status(sqlite_store, job) is None
    assert report.replan_soon  # planned again at once, from the new row


# ---------------------------------------------------------------- a restored backup


def backup_of(store: Store, tmp_path: Path, name: str) -> Store:
    """A copy of ``store``'s SQLite database as it is now (a backup restored later)."""
    source = Path(str(store.engine.url.database))
    target = tmp_path / name
    with store.transaction() as tx:  # the WAL's pages go into the file first
        tx.execute(text("PRAGMA wal_checkpoint(FULL)"))
    shutil.copyfile(source, target)
    return Store(f"sqlite:///{target}")


async def test_a_backup_restored_while_its_deployment_runs_is_refused(
        sqlite_store: Store, tmp_path: Path) -> None:
    """The backup is restored after its origin took the cluster over again: the
    restored database's leader finds the marker is neither of its tokens and acts not at
    all (before: both databases knew the same ids and both acted on them)."""
    clock = [NOW]
    fake = FakeSlurm(clock)
    job = add(sqlite_store)
    origin = rec(sqlite_store, fake, clock)
    await origin.tick()
    backup = backup_of(sqlite_store, tmp_path, "restored.db")
    origin.forget()  # a new leadership of the origin: a new token in the marker
    await origin.tick()
    fake.run_all_pending()
    (sid,) = fake.jobs
    restored = rec(backup, fake, clock)
    with backup.transaction() as tx:
        repo.set_desired(tx, [job], Desired.STOPPED, now=2)  # it would cancel the job
    fake.calls.clear()
    with pytest.raises(OwnershipConflict):
        await restored.tick()
    assert fake.calls == [] and fake.jobs[sid].obs.state == State.RUNNING
    assert restored.metrics.ownership_conflict._value.get() == 1
    assert restored.owner.conflict is not None and "restored" in restored.owner.conflict
    await origin.tick()  # the origin goes on
    assert origin.owner.conflict is None
    backup.dispose()


async def test_the_origin_refuses_once_its_backup_took_the_marker(
        sqlite_store: Store, tmp_path: Path) -> None:
    """The backup is restored before its origin rotated its token again: the restored
    database's leader claims the marker, and the origin's next check refuses to act."""
    clock = [NOW]
    fake = FakeSlurm(clock)
    add(sqlite_store)
    origin = rec(sqlite_store, fake, clock)
    await origin.tick()
    backup = backup_of(sqlite_store, tmp_path, "restored.db")
    restored = rec(backup, fake, clock)
    await restored.tick()
    clock[0] += origin.settings.owner_check_s
    with pytest.raises(OwnershipConflict):
        await origin.tick()
    backup.dispose()


async def test_a_rotation_cut_short_is_finished_not_refused(sqlite_store: Store) -> None:
    """The new token is in the database but the marker write failed: the next check
    finds the previous token and writes the new one (no false conflict)."""
    clock = [NOW]

    class Flaky(FakeSlurm):
        fail = False

        async def set_owner_marker(self, deployment: str, token: str) -> None:
            if self.fail:
                self.fail = False
                raise TransientError("ssh: connection reset")
            await super().set_owner_marker(deployment, token)

    fake = Flaky(clock)
    r = rec(sqlite_store, fake, clock)
    await r.tick()
    r.forget()
    fake.fail = True
    report = await r.tick()  # the marker could not be written: nothing acts
    assert not report.slurm_ok
    await r.tick()
    assert r.owner.conflict is None
    with sqlite_store.transaction() as tx:
        (claim,) = repo.list_claims(tx)
        deployment = repo.read_deployment_id(tx)
    assert deployment is not None and fake.markers[deployment] == claim.token


@pytest.mark.parametrize(("marker", "token", "previous", "takeover", "step"), [
    pytest.param(None, None, None, True, ClaimStep.MARK, id="first-claim"),
    pytest.param(None, "b", "a", False, ClaimStep.MARK, id="marker-removed"),
    pytest.param("b", "b", "a", True, ClaimStep.ROTATE, id="takeover-rotates"),
    pytest.param("b", "b", "a", False, ClaimStep.KEEP, id="check-keeps"),
    pytest.param("a", "b", "a", False, ClaimStep.RESUME, id="rotation-cut-short"),
    pytest.param("c", "b", "a", False, ClaimStep.CONFLICT, id="another-database"),
    pytest.param("c", None, None, True, ClaimStep.CONFLICT, id="marked-before-our-claim"),
])
def test_what_a_leader_does_with_the_marker(marker: str | None, token: str | None,
                                            previous: str | None, takeover: bool,
                                            step: ClaimStep) -> None:
    assert claim(marker, token, previous, takeover=takeover) is step
