"""The sweep of strays: our live ``dj-`` Slurm jobs that no tracked record owns (a late
object of an abandoned intent after its job ended, or of a deleted job) are cancelled
from the tick's one squeue read, behind the identity check; foreign ones never."""

from __future__ import annotations

from dataclasses import replace

from controller.metrics import Metrics
from controller.model.obs import CauseKind, ObjectRef, State
from controller.reconcile.tick import Reconciler, TickSettings
from controller.store import repo
from controller.store.db import Store
from tests.fakeslurm import FakeJob, FakeSlurm

DOC = {"command": ["true"], "workdir": "/tmp"}
JOB = "01JZ8Q2N5V0000000000000001"
OTHER = "01JZ8Q2N5V0000000000000002"


def make(store: Store, clock: list[int]) -> tuple[Reconciler, FakeSlurm]:
    fake = FakeSlurm(clock)
    return Reconciler(store, fake, metrics=Metrics(), clock=lambda: clock[0],
                      settings=TickSettings(unknown_grace_s=100, adopt_window_s=60)), fake


def late_object(fake: FakeSlurm, job_id: str, submission: int, clock: list[int],
                *, foreign: bool = False) -> int:
    """A gated Slurm job of ``job_id``'s ``submission`` appears (a late sbatch)."""
    slurm_id = fake.next_id
    fake.next_id += 1
    ref = ObjectRef("lab", "dj-" + job_id, slurm_id, clock[0])
    first = next(iter(fake.jobs.values())).obs
    fake.jobs[slurm_id] = FakeJob(replace(first, ref=ref, state=State.GATED,
                                          submission=submission, foreign=foreign,
                                          submit=clock[0], start=None, end=None,
                                          cause=first.cause.__class__()))
    return slurm_id


async def test_late_object_of_an_ended_job_is_cancelled(sqlite_store: Store) -> None:
    clock = [1_800_000_000]
    rec, fake = make(sqlite_store, clock)
    with sqlite_store.transaction() as tx:
        repo.insert_job(tx, job_id=JOB, document=DOC, now=1)
    await rec.tick()
    (sid,) = fake.jobs
    fake.run(sid)
    fake.end(sid, CauseKind.COMPLETED)
    clock[0] += 5
    await rec.tick()
    with sqlite_store.transaction() as tx:
        assert repo.list_jobs(tx, job_id=JOB)[0].phase == "succeeded"
    late = late_object(fake, JOB, 7, clock)  # an intent abandoned long ago, now in Slurm
    foreign = late_object(fake, OTHER, 1, clock, foreign=True)
    fake.calls.clear()
    clock[0] += 5
    report = await rec.tick()
    assert fake.jobs[late].obs.state == State.ENDED  # cancelled
    assert fake.jobs[foreign].obs.state == State.GATED  # never touched
    assert "release" not in fake.calls and report.actions["sweep"] == 1
    with sqlite_store.transaction() as tx:
        kinds = [e.kind for e in repo.list_events(tx, JOB)]
    assert "OrphanCancelled" in kinds


async def test_object_of_a_deleted_job_is_cancelled(sqlite_store: Store) -> None:
    clock = [1_800_000_000]
    rec, fake = make(sqlite_store, clock)
    with sqlite_store.transaction() as tx:
        repo.insert_job(tx, job_id=JOB, document=DOC, now=1)
    await rec.tick()
    (sid,) = fake.jobs
    with sqlite_store.transaction() as tx:
        repo.delete_job(tx, JOB)
    clock[0] += 5
    await rec.tick()
    assert fake.jobs[sid].obs.state == State.ENDED
