"""The tick over a real SQLite/PostgreSQL store and a stateful fake Slurm: batching,
crash windows, adoption, duplicates, unknown handling. (The same scenarios run end to
end against real Slurm in tests/test_e2e_*.py.)"""

from __future__ import annotations

import pytest

from controller.errors import TransientError
from controller.metrics import Metrics
from controller.model.job import Desired
from controller.model.obs import CauseKind, State
from controller.reconcile.tick import Reconciler, TickSettings
from controller.store import repo
from controller.store.db import Store
from tests.fakeslurm import FakeSlurm

DOC = {"command": ["true"], "workdir": "/tmp"}


def ids(n: int) -> list[str]:
    return [f"01JZ8Q2N5V00000000000000{i:02d}" for i in range(n)]


@pytest.fixture
def clock() -> list[int]:
    return [1_800_000_000]


def make(store: Store, clock: list[int]) -> tuple[Reconciler, FakeSlurm]:
    fake = FakeSlurm(clock)
    rec = Reconciler(store, fake, metrics=Metrics(), clock=lambda: clock[0],
                     settings=TickSettings(unknown_grace_s=100, adopt_window_s=60))
    return rec, fake


def add(store: Store, job_ids: list[str], desired: str = "run") -> None:
    with store.transaction() as tx:
        for jid in job_ids:
            repo.insert_job(tx, job_id=jid, document=DOC, desired=desired, now=1)


def phases(store: Store) -> dict[str, str]:
    with store.transaction() as tx:
        return {v.id: v.phase for v in repo.list_jobs(tx)}


async def test_one_live_read_per_tick_for_many_jobs(any_store: Store, clock: list[int]) -> None:
    rec, fake = make(any_store, clock)
    add(any_store, ids(30))
    await rec.tick()
    assert fake.calls.count("find_many") == 1 and fake.calls.count("start") == 30
    fake.calls.clear()
    fake.run_all_pending()
    await rec.tick()
    assert fake.calls == ["find_many"]
    assert set(phases(any_store).values()) == {"running"}


async def test_job_lifecycle_to_success(sqlite_store: Store, clock: list[int]) -> None:
    rec, fake = make(sqlite_store, clock)
    (jid,) = ids(1)
    add(sqlite_store, [jid])
    await rec.tick()
    (sid,) = fake.jobs
    assert fake.jobs[sid].obs.state == State.PENDING  # released right after the ref commit
    fake.run(sid)
    await rec.tick()
    fake.end(sid, CauseKind.COMPLETED)
    await rec.tick()
    assert phases(sqlite_store)[jid] == "succeeded"
    with sqlite_store.transaction() as tx:
        (sub,) = repo.list_submissions(tx, jid)
        assert (sub.status, sub.slurm_job_id, sub.cause) == ("ended", sid, "completed")


async def test_crash_after_sbatch_is_adopted_not_resubmitted(sqlite_store: Store,
                                                             clock: list[int]) -> None:
    rec, fake = make(sqlite_store, clock)
    (jid,) = ids(1)
    add(sqlite_store, [jid])
    fake.crash_after_sbatch = True
    await rec.tick()  # sbatch ran; the ref never reached the database
    fake.crash_after_sbatch = False
    (sid,) = fake.jobs
    assert fake.jobs[sid].obs.state == State.GATED
    clock[0] += 5
    await rec.tick()
    assert len(fake.jobs) == 1 and fake.jobs[sid].obs.state == State.PENDING
    with sqlite_store.transaction() as tx:
        (view,) = repo.list_jobs(tx)
        assert view.slurm_job_id == sid


async def test_live_read_failure_changes_no_job(sqlite_store: Store, clock: list[int]) -> None:
    rec, fake = make(sqlite_store, clock)
    (jid,) = ids(1)
    add(sqlite_store, [jid])
    await rec.tick()
    fake.run_all_pending()
    await rec.tick()
    before = phases(sqlite_store)
    fake.fail_live = True
    clock[0] += 1000
    report = await rec.tick()
    assert not report.slurm_ok and phases(sqlite_store) == before
    assert fake.calls.count("start") == 1


async def test_accounting_down_keeps_job_unknown_then_grace(sqlite_store: Store,
                                                            clock: list[int]) -> None:
    rec, fake = make(sqlite_store, clock)
    (jid,) = ids(1)
    add(sqlite_store, [jid])
    await rec.tick()
    (sid,) = fake.jobs
    fake.run(sid)
    fake.end(sid, CauseKind.COMPLETED)
    fake.forget(sid)
    fake.fail_accounting = True
    await rec.tick()
    assert phases(sqlite_store)[jid] == "pending"  # unknown: neither succeeded nor failed
    fake.fail_accounting = False
    clock[0] += 10
    await rec.tick()
    assert phases(sqlite_store)[jid] == "succeeded"  # accounting returned: the real outcome
    assert fake.calls.count("start") == 1


async def test_node_lost_resubmits_once_per_policy(sqlite_store: Store,
                                                   clock: list[int]) -> None:
    rec, fake = make(sqlite_store, clock)
    (jid,) = ids(1)
    add(sqlite_store, [jid])
    await rec.tick()
    (sid,) = fake.jobs
    fake.run(sid)
    fake.end(sid, CauseKind.NODE_LOST)
    await rec.tick()
    assert fake.calls.count("start") == 1  # backoff first
    clock[0] += 60
    await rec.tick()
    assert fake.calls.count("start") == 2
    new = max(fake.jobs)
    assert fake.jobs[new].obs.attempt == 1 and fake.jobs[new].obs.submission == 2


async def test_stop_and_hold_by_desired_state(sqlite_store: Store, clock: list[int]) -> None:
    rec, fake = make(sqlite_store, clock)
    a, b = ids(2)
    add(sqlite_store, [a, b])
    await rec.tick()
    with sqlite_store.transaction() as tx:
        repo.set_desired(tx, [a], Desired.HELD, now=2)
        repo.set_desired(tx, [b], Desired.STOPPED, now=2)
    await rec.tick()
    await rec.tick()
    got = phases(sqlite_store)
    assert got == {a: "held", b: "cancelled"}
    with sqlite_store.transaction() as tx:
        repo.set_desired(tx, [a], Desired.RUN, now=3)
    await rec.tick()
    assert phases(sqlite_store)[a] == "pending"
    assert "release" in fake.calls and "hold" in fake.calls and "stop" in fake.calls


async def test_one_failing_action_does_not_stop_others(sqlite_store: Store,
                                                       clock: list[int]) -> None:
    rec, fake = make(sqlite_store, clock)
    add(sqlite_store, ids(3))
    original = fake.start
    calls = {"n": 0}

    async def flaky(request):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] == 2:
            raise TransientError("boom")
        return await original(request)

    fake.start = flaky  # type: ignore[method-assign]
    report = await rec.tick()
    assert report.actions["submit"] == 2 and len(report.errors) == 1
