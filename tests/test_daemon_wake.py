"""The daemon ticks again at once when work waits (issue 13): the rest of a burst past a
tick's submit slice, an action outcome, or a wake (a row committed, PostgreSQL NOTIFY)
that came while a tick was running -- the interval scheduler would skip a run while one
is in flight, so such a wake was lost until the next interval (bench/burst saw a row
committed mid-burst wait for it). Back-to-back ticks are capped (``AGAIN_LIMIT``)."""

from __future__ import annotations

from dataclasses import replace

from controller.config import Config
from controller.daemon.service import AGAIN_LIMIT, Daemon
from controller.metrics import Metrics
from controller.model.ids import new_job_id
from controller.reconcile.settings import ReconcileConfig
from controller.reconcile.tick import TickReport
from controller.store import repo
from controller.store.db import Store
from tests.fakeslurm import FakeSlurm

DOC = {"command": ["true"], "workdir": "/tmp"}


def add(store: Store, n: int) -> None:
    with store.transaction() as tx:
        for _ in range(n):
            repo.insert_job(tx, job_id=str(new_job_id()), document=DOC, now=1)


def make(store: Store, **reconcile: int) -> tuple[Daemon, FakeSlurm]:
    fake = FakeSlurm([1_800_000_000])
    config = replace(Config(), reconcile=ReconcileConfig(**reconcile))
    return Daemon(config, store=store, adapter=fake, metrics=Metrics()), fake


async def test_a_burst_goes_out_in_back_to_back_ticks(sqlite_store: Store) -> None:
    add(sqlite_store, 10)
    d, fake = make(sqlite_store, submit_slice=3)
    await d.tick_once()
    assert len(fake.jobs) == 10
    assert d.ticks == 4  # 3 + 3 + 3 + 1: the last leaves nothing waiting


async def test_a_wake_during_a_tick_is_not_lost(sqlite_store: Store) -> None:
    d, fake = make(sqlite_store)
    tick = d.reconciler.tick
    calls = 0

    async def tick_with_a_commit_meanwhile() -> TickReport:
        nonlocal calls
        calls += 1
        report = await tick()
        if calls == 1:  # a client commits a row while this tick runs: NOTIFY -> wake
            add(sqlite_store, 1)
            d.wake()
        return report

    d.reconciler.tick = tick_with_a_commit_meanwhile  # type: ignore[method-assign]
    await d.tick_once()
    assert calls == 2 and len(fake.jobs) == 1


async def test_back_to_back_ticks_are_capped(sqlite_store: Store) -> None:
    d, _ = make(sqlite_store)
    calls = 0

    async def always_again() -> TickReport:
        nonlocal calls
        calls += 1
        return TickReport(replan_soon=True)

    d.reconciler.tick = always_again  # type: ignore[method-assign]
    await d.tick_once()
    assert calls == AGAIN_LIMIT
