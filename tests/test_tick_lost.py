"""Jobs the cluster loses (acknowledged by sbatch, then absent from squeue and sacct
while both answer), through the tick: the planner asks whether the object ever started
(its Slurm output file), the tick looks, and the next plan resubmits -- for free when it
never started, under the policy's budget when it did. (Real Slurm: test_e2e_lost_jobs.)"""

from __future__ import annotations

import pytest

from controller.metrics import Metrics
from controller.reconcile.tick import Reconciler, TickSettings
from controller.store import repo
from controller.store.db import Store
from tests.fakeslurm import FakeSlurm

DOC = {"command": ["true"], "workdir": "/tmp"}
JOB = "01JZ8Q2N5V0000000000000001"


@pytest.mark.parametrize("ran_unseen, budget", [(False, {}), (True, {"lost": 1})],
                         ids=["never-started-free", "ran-unseen-spends-budget"])
async def test_lost_job_is_resubmitted(sqlite_store: Store, ran_unseen: bool,
                                       budget: dict[str, int]) -> None:
    clock = [1_800_000_000]
    fake = FakeSlurm(clock)
    rec = Reconciler(sqlite_store, fake, metrics=Metrics(), clock=lambda: clock[0],
                     settings=TickSettings(unknown_grace_s=100, adopt_window_s=60))
    with sqlite_store.transaction() as tx:
        repo.insert_job(tx, job_id=JOB, document=DOC, now=1)
    await rec.tick()
    (first,) = fake.jobs
    fake.lose(first, ran_unseen=ran_unseen)
    ticks = 0
    while "started_evidence" not in fake.calls:  # unseen until past the grace: it asks
        clock[0] += 30
        await rec.tick()
        ticks += 1
        assert ticks < 10
    assert clock[0] - 1_800_000_000 > 100  # not before the grace
    await rec.tick()  # decides from the evidence
    assert fake.calls.count("started_evidence") == 1
    clock[0] += 120  # past the backoff
    await rec.tick()
    with sqlite_store.transaction() as tx:
        (view,) = repo.list_jobs(tx, job_id=JOB)
        subs = repo.list_submissions(tx, JOB)
        status = repo.load_tracked(tx, "lab")[0].state
    assert [s.status for s in subs] == ["ended", "submitted"]
    assert (view.phase, view.attempt) == ("pending", 1)
    assert dict(status.budgets_used) == budget
    assert len(fake.jobs) == 1 and first not in fake.jobs
