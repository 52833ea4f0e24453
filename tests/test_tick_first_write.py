"""A new leader's first Slurm write comes after its first plan chunk, not after all of
them (issue 9, item 5: failover time at 100k jobs): the jobs likely to act (a new job, a
job whose desired state a client changed) are planned first, and each chunk's actions
run right after that chunk's commit. ``bench/failover`` measures it at scale."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import pytest

from controller.metrics import Metrics
from controller.model.job import Desired
from controller.reconcile.tick import Reconciler, TickSettings
from controller.store import repo
from controller.store.db import Store
from tests.fakeslurm import FakeSlurm

DOC = {"command": ["true"], "workdir": "/tmp"}
NOW = 1_800_000_000
CHUNK = 3


def ids(n: int) -> list[str]:
    return [f"01JZ8Q2N5V00000000000000{i:02d}" for i in range(n)]


def reconciler(store: Store, fake: FakeSlurm, clock: list[int]) -> Reconciler:
    return Reconciler(store, fake, metrics=Metrics(), clock=lambda: clock[0],
                      settings=TickSettings(plan_chunk=CHUNK))


def add(store: Store, job_ids: Sequence[str]) -> None:
    with store.transaction() as tx:
        for jid in job_ids:
            repo.insert_job(tx, job_id=jid, document=DOC, now=1)


def counted(commits: list[int], writes: list[tuple[str, int]], fake: FakeSlurm,
            rec: Reconciler) -> None:
    """Note how many chunks were committed when each Slurm write happens."""
    commit = rec.applier.commit_plans

    def counting(plans: Any, now: int) -> set[str]:
        commits.append(len(plans))
        return commit(plans, now)

    rec.applier.commit_plans = counting  # type: ignore[method-assign]
    for name in ("start", "stop", "hold", "release"):
        method: Callable[..., Awaitable[Any]] = getattr(fake, name)

        def wrapped(*args: Any, _name: str = name,
                    _method: Callable[..., Awaitable[Any]] = method) -> Awaitable[Any]:
            writes.append((_name, len(commits)))
            return _method(*args)

        setattr(fake, name, wrapped)


@pytest.mark.parametrize("middle", [pytest.param(4, id="second-chunk"),
                                    pytest.param(8, id="third-chunk")])
async def test_new_leader_acts_after_its_first_chunk(sqlite_store: Store,
                                                     middle: int) -> None:
    clock = [NOW]
    fake = FakeSlurm(clock)
    jobs = ids(12)
    add(sqlite_store, jobs[:11])
    old = reconciler(sqlite_store, fake, clock)
    await old.tick()
    fake.run_all_pending()
    for _ in range(3):
        await old.tick()
    assert {v.phase for v in _views(sqlite_store)} == {"running"}

    # the old leader stops; meanwhile a client adds a job and stops a running one
    clock[0] += 40
    add(sqlite_store, jobs[11:])
    with sqlite_store.transaction() as tx:
        assert repo.set_desired(tx, [jobs[middle]], Desired.STOPPED, now=clock[0]) == 1
    new = reconciler(sqlite_store, fake, clock)  # a fresh reconciler: plans every job
    commits: list[int] = []
    writes: list[tuple[str, int]] = []
    counted(commits, writes, fake, new)
    report = await new.tick()

    assert report.full_load and report.planned == 12
    assert len(commits) == 4  # 12 jobs, chunks of 3
    assert report.actions["submit"] == 1 and report.actions["cancel"] == 1
    # every write (the submit, its release, the cancel) after the first chunk's commit,
    # not after the last
    assert sorted(writes) == [("release", 1), ("start", 1), ("stop", 1)], writes


async def test_small_todo_is_not_reordered_and_acts_once(sqlite_store: Store) -> None:
    """The usual tick (todo within one chunk) keeps one commit and one apply."""
    clock = [NOW]
    fake = FakeSlurm(clock)
    add(sqlite_store, ids(CHUNK))
    rec = reconciler(sqlite_store, fake, clock)
    commits: list[int] = []
    writes: list[tuple[str, int]] = []
    counted(commits, writes, fake, rec)
    report = await rec.tick()
    assert commits == [CHUNK] and report.actions["submit"] == CHUNK
    assert [w for w in writes if w[0] == "start"] == [("start", 1)] * CHUNK


def _views(store: Store) -> list[repo.JobView]:
    with store.transaction() as tx:
        return list(repo.list_jobs(tx))
