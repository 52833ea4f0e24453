"""Shards over one database (issue 12), with fake clusters: each cluster's reconciler plans
only its own jobs, a refusal hands a job to the next acceptable cluster's shard, no shard
overwrites a status placed on another, and replicas spread the shards fairly and take a
dead replica's over. Proven on real clusters in tests/test_e2e_clusters.py."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import replace
from typing import Any

import pytest
from sqlalchemy import update

from controller.config import Config, parse_config
from controller.daemon.service import Daemon, build_shard, shard_lease
from controller.errors import ErrConflict, ErrInvalid
from controller.metrics import Metrics
from controller.model.ids import new_job_id
from controller.model.obs import ObjectRef, StartRequest
from controller.reconcile.placement import Clusters
from controller.reconcile.tick import Reconciler, TickReport
from controller.store import repo
from controller.store.db import Store
from controller.store.members import Membership, list_replicas
from controller.store.models import JobStatus, Submission
from controller.store.models import Lease as LeaseRow
from tests.daemon_harness import free_port
from tests.fakeslurm import FakeSlurm

NOW = 1_800_000_000
NAMES = ("cpu", "gpu", "new")


class Cluster(FakeSlurm):
    """A fake cluster with a name, which may refuse every submission."""

    def __init__(self, name: str, clock: list[int], *, refuse: bool = False) -> None:
        super().__init__(clock)
        self.cluster = name
        self.refuse = refuse

    async def start(self, request: StartRequest) -> ObjectRef:
        if self.refuse:
            self.calls.append("start-refused")
            raise ErrInvalid("Batch job submission failed: Required partition not available "
                             "(inactive or drain)")
        return await super().start(request)

    def job_ids(self) -> set[str]:
        return {j.obs.ref.uid.removeprefix("dj-") for j in self.jobs.values()}


def add(store: Store, cluster: object = None) -> str:
    job_id = str(new_job_id())
    doc: dict[str, Any] = {"command": ["true"], "workdir": "/tmp"}
    if cluster is not None:
        doc["cluster"] = cluster
    with store.transaction() as tx:
        repo.insert_job(tx, job_id=job_id, document=doc, now=NOW)
    return job_id


def reconciler(store: Store, fake: Cluster, names: tuple[str, ...] = NAMES[:2]) -> Reconciler:
    return Reconciler(store, fake, metrics=Metrics(cluster=fake.cluster),
                      clock=lambda: float(fake.clock[0]),
                      clusters=Clusters(names, fake.cluster))


def status(store: Store, job_id: str) -> JobStatus | None:
    with store.transaction() as tx:
        return tx.get(JobStatus, job_id)


def submissions(store: Store, job_id: str) -> list[tuple[int, str, str | None]]:
    with store.transaction() as tx:
        rows = tx.query(Submission).filter_by(job_id=job_id).order_by(Submission.submission)
        return [(r.submission, r.status, r.cluster) for r in rows]


async def test_each_shard_plans_and_submits_only_its_own_jobs(any_store: Store) -> None:
    clock = [NOW]
    cpu, gpu = Cluster("cpu", clock), Cluster("gpu", clock)
    jobs = {"default": add(any_store), "cpu": add(any_store, "cpu"),
            "gpu": add(any_store, "gpu"), "gpu-then-cpu": add(any_store, ["gpu", "cpu"]),
            "unknown": add(any_store, ["gpu", "new"])}
    a, b = reconciler(any_store, cpu), reconciler(any_store, gpu)
    for _ in range(2):
        await a.tick()
        await b.tick()
    assert cpu.job_ids() == {jobs["default"], jobs["cpu"]}
    assert gpu.job_ids() == {jobs["gpu"], jobs["gpu-then-cpu"]}
    for name, cluster in (("default", "cpu"), ("cpu", "cpu"), ("gpu", "gpu"),
                          ("gpu-then-cpu", "gpu")):
        row = status(any_store, jobs[name])
        assert row is not None and row.cluster == cluster, name
        assert submissions(any_store, jobs[name]) == [(1, "submitted", cluster)]
    # a cluster the configuration does not know: the default's shard says so, and the
    # job waits unplaced and unsubmitted
    row = status(any_store, jobs["unknown"])
    assert row is not None and row.cluster is None and row.phase == "pending"
    assert "cluster new is not configured" in row.conditions
    assert submissions(any_store, jobs["unknown"]) == []
    # a replica whose configuration gains that cluster: the job's first cluster (gpu)
    # places and submits it
    await reconciler(any_store, gpu, NAMES).tick()
    assert jobs["unknown"] in gpu.job_ids()
    assert submissions(any_store, jobs["unknown"]) == [(1, "submitted", "gpu")]


async def test_a_refusal_hands_the_job_to_the_next_cluster(any_store: Store) -> None:
    clock = [NOW]
    cpu, gpu = Cluster("cpu", clock, refuse=True), Cluster("gpu", clock)
    job_id = add(any_store, ["cpu", "gpu"])
    a, b = reconciler(any_store, cpu), reconciler(any_store, gpu)
    report = await a.tick()  # refused
    assert report.replan_soon and cpu.calls.count("start-refused") == 1
    report = await a.tick()  # the next plan moves it
    assert report.moved_to == {"gpu"}
    await b.tick()
    assert gpu.job_ids() == {job_id} and cpu.jobs == {}
    assert submissions(any_store, job_id) == [(1, "abandoned", "cpu"), (2, "submitted", "gpu")]
    row = status(any_store, job_id)
    assert row is not None and row.cluster == "gpu" and row.phase == "pending"
    await a.tick()  # cpu's shard no longer tracks it
    assert a.metrics.tracked._value.get() == 0  # type: ignore[attr-defined]


def test_a_shard_never_overwrites_a_status_placed_on_another(any_store: Store) -> None:
    job_id = add(any_store, "cpu")
    with any_store.transaction() as tx:
        (loaded,) = repo.load_tracked(tx, "cpu", ids=[job_id])
        repo.save_statuses(tx, [repo.StatusWrite(replace(loaded.state, cluster="cpu"), False)],
                           now=NOW, cluster="cpu")
    with pytest.raises(ErrConflict), any_store.transaction() as tx:
        (loaded,) = repo.load_tracked(tx, "gpu", ids=[job_id])
        repo.save_statuses(tx, [repo.StatusWrite(replace(loaded.state, reason="mine"), True)],
                           now=NOW, cluster="gpu")
    row = status(any_store, job_id)
    assert row is not None and row.cluster == "cpu" and row.reason == ""


# ---------------------------------------------------------------- replicas


def three_clusters() -> Config:
    return parse_config({"daemon": {"lease_ttl_s": 30, "tick_interval_s": 5},
                         "clusters": [{"name": name} for name in NAMES]})


def replica(store: Store, config: Config, clock: list[float]) -> Daemon:
    metrics = Metrics(cluster=config.default_cluster.name)
    fakes = [Cluster(name, [NOW]) for name in config.cluster_names]
    shards = [build_shard(config, fake.cluster, store=store, adapter=fake,
                          metrics=metrics.for_cluster(fake.cluster), clock=lambda: clock[0])
              for fake in fakes]
    for shard in shards[1:]:  # one holder id per replica
        shard.lease.holder = shards[0].lease.holder
    return Daemon(config, store=store, metrics=metrics, shards=shards, clock=lambda: clock[0],
                  membership=Membership(store, holder=shards[0].lease.holder,
                                        ttl_s=config.daemon.lease_ttl_s,
                                        clock=lambda: clock[0]))


async def rounds(daemons: list[Daemon], n: int) -> None:
    for _ in range(n):
        for d in daemons:
            d.count_replicas()
            await d.tick_once()


def held(daemons: list[Daemon]) -> list[list[str]]:
    return [sorted(s.name for s in d.held()) for d in daemons]


async def test_replicas_spread_the_shards_and_take_over_a_dead_ones(pg_store: Store) -> None:
    config = three_clusters()
    clock = [float(NOW)]
    first = replica(pg_store, config, clock)
    await rounds([first], 1)
    assert held([first]) == [list(NAMES)]  # alone: every shard
    daemons = [first, replica(pg_store, config, clock), replica(pg_store, config, clock)]
    await rounds(daemons, 4)  # the first gives one up per count, the others take them
    spread = held(daemons)
    assert sorted(len(h) for h in spread) == [1, 1, 1], spread
    assert sorted(n for h in spread for n in h) == sorted(NAMES)
    assert {r.holder: r.shards for r in list_replicas(pg_store, clock=lambda: clock[0])} == {
        d.membership.holder: tuple(h) for d, h in zip(daemons, spread, strict=True)}
    # the replica holding "gpu" dies: nothing renews its lease or its membership
    dead = next(d for d in daemons if [s.name for s in d.held()] == ["gpu"])
    alive = [d for d in daemons if d is not dead]
    step = config.daemon.tick_interval_s
    waited = 0.0
    while "gpu" not in {n for h in held(alive) for n in h}:
        assert waited <= config.daemon.lease_ttl_s + step, held(alive)  # TTL + one tick
        clock[0] += step
        waited += step
        await rounds(alive, 1)
    after = held(alive)
    assert sorted(n for h in after for n in h) == sorted(NAMES), after
    assert sorted(len(h) for h in after) == [1, 2]


async def test_a_lone_daemon_on_sqlite_holds_every_shard(sqlite_store: Store) -> None:
    config = three_clusters()
    clock = [float(NOW)]
    d = replica(sqlite_store, config, clock)
    await rounds([d], 2)
    assert held([d]) == [list(NAMES)]


def test_a_cluster_is_never_led_under_two_lease_names(any_store: Store) -> None:
    """Two replicas whose [[clusters]] differ in order call the same cluster's lease by two
    names (the default cluster's is ``controller``): the second cannot take it."""
    first = parse_config({"clusters": [{"name": "cpu"}, {"name": "gpu"}]})
    swapped = parse_config({"clusters": [{"name": "gpu"}, {"name": "cpu"}]})
    one, two = shard_lease(first, "cpu", any_store), shard_lease(swapped, "cpu", any_store)
    assert (one.name, two.name) == ("controller", "cluster/cpu")
    assert one.try_acquire()
    assert not two.try_acquire()
    # the other cluster: each takes it under its own name only while no one leads it
    gpu_two = shard_lease(swapped, "gpu", any_store)
    assert gpu_two.name == "controller" and not gpu_two.try_acquire()  # cpu's, held
    assert shard_lease(first, "gpu", any_store).try_acquire()
    one.release()
    assert two.try_acquire()  # once the first let go


# ---------------------------------------------------------------- found by bench/shards


async def test_a_replica_takes_no_more_than_its_share_even_at_once(pg_store: Store) -> None:
    """Every shard's first tick starts at once: each must not pass the fair-share check
    before the others' takes are counted (bench/shards saw held=8 with share 3)."""
    config = parse_config({"daemon": {"lease_ttl_s": 30, "tick_interval_s": 5},
                           "clusters": [{"name": f"c{i}"} for i in range(10)]})
    clock = [float(NOW)]
    for i in range(3):  # three other live replicas
        Membership(pg_store, holder=f"other-{i}", ttl_s=30,
                   clock=lambda: clock[0]).heartbeat()
    d = replica(pg_store, config, clock)
    d.count_replicas()
    assert d.share == 3  # ceil(10 / 4)
    await d.tick_once()
    assert len(d.held()) == 3


def spread_pair(store: Store, clusters: int, clock: list[float]) -> list[Daemon]:
    """Two replicas of ``clusters`` shards, spread evenly between them."""
    config = parse_config({"daemon": {"lease_ttl_s": 30, "tick_interval_s": 5},
                           "clusters": [{"name": f"c{i}"} for i in range(clusters)]})
    return [replica(store, config, clock), replica(store, config, clock)]


async def test_a_dead_replicas_shards_move_when_its_leases_expire(any_store: Store) -> None:
    """bench/shards, 2 replicas of 10 x 100k: the killed replica's leases ran out 28.9 s
    after the SIGKILL, and the survivor took them 14.4 s later. Its fair share grew only
    once the dead replica's membership row expired too, which is renewed on every keeper
    round while a lease is renewed only under half its TTL. A replica none of whose
    leases is live is gone, whatever its membership row says."""
    clock = [float(NOW)]
    pair = spread_pair(any_store, 4, clock)
    await rounds(pair, 4)
    assert sorted(len(h) for h in held(pair)) == [2, 2], held(pair)
    dead, alive = pair
    # the dead replica's last keeper round renews its row, not its leases (over half left)
    clock[0] += 10
    dead.membership.heartbeat([s.name for s in dead.held()])
    await rounds([alive], 1)
    clock[0] += 21  # its leases expired 1 s ago; its row has 9 s to go
    alive._keep_once(asyncio.get_running_loop())
    assert len(alive.held()) == 4, (held(pair), alive.membership.live)


async def test_the_keeper_wakes_when_a_lease_held_elsewhere_expires(any_store: Store) -> None:
    """The keeper's next round is due when the next lease held by another replica
    expires, if that comes before a quarter TTL: an orphan is taken as it expires, not up
    to a keeper period later (part of the same 14.4 s)."""
    clock = [float(NOW)]
    pair = spread_pair(any_store, 4, clock)
    await rounds(pair, 4)
    alive = pair[1]  # (the first dies: nothing renews its leases or its row)
    clock[0] += 27  # the other's leases expire in 3 s; alive renews its own
    loop = asyncio.get_running_loop()
    assert alive._keep_once(loop) == pytest.approx(3, abs=0.1)
    clock[0] += 1
    assert alive._keep_once(loop) == pytest.approx(2, abs=0.1)
    clock[0] += 2
    assert alive._keep_once(loop) == pytest.approx(30 / 4)  # taken: none expires sooner
    assert len(alive.held()) == 4


async def alone_with_four_then_joined(store: Store) -> Daemon:
    """A replica that started alone and took all 4 shards; then another replica's row
    appears (it counts 2 at its next count: a share of 2)."""
    config = parse_config({"daemon": {"lease_ttl_s": 30, "tick_interval_s": 5},
                           "clusters": [{"name": f"c{i}"} for i in range(4)]})
    clock = [float(NOW)]
    d = replica(store, config, clock)
    await rounds([d], 1)
    assert len(d.held()) == 4
    Membership(store, holder="other", ttl_s=30, clock=lambda: clock[0]).heartbeat()
    return d


async def test_a_replica_above_its_share_gives_every_surplus_shard_up_at_once(
        any_store: Store) -> None:
    """bench/shards, 4 replicas of 10 x 100k: the first replica up counted only itself
    and took every shard; it then gave the surplus up one shard per count, each after
    its cold first tick, and the shards took 389 s to spread. Every surplus shard is
    marked at once."""
    d = await alone_with_four_then_joined(any_store)
    d.count_replicas()
    assert d.share == 2
    assert sorted(s.name for s in d.held() if s.shed) == ["c2", "c3"]
    await d.tick_once()
    assert sorted(s.name for s in d.held()) == ["c0", "c1"]


async def test_the_keeper_sheds_as_soon_as_it_counts_a_new_replica(
        any_store: Store) -> None:
    """The keeper counts the replicas every quarter TTL; a replica that counts more than
    before sheds its surplus then, not at its next ``_members`` round (one tick interval
    later, on a loaded process: the other replica waits that long for its share)."""
    d = await alone_with_four_then_joined(any_store)
    loop = asyncio.get_running_loop()
    d._keep_once(loop)
    await asyncio.sleep(0)  # (the loop runs what the keeper thread handed it)
    assert sorted(s.name for s in d.held() if s.shed) == ["c2", "c3"]


async def test_a_shard_asked_to_shed_stops_its_tick_at_the_next_chunk(
        sqlite_store: Store) -> None:
    """A shard marked to shed during its (cold, long) first tick takes on no further
    chunk: the tick ends as at its budget, and the lease is given up at once -- not
    after every job was planned by a replica that is about to let them go."""
    config = parse_config({"daemon": {"lease_ttl_s": 30, "tick_interval_s": 5},
                           "reconcile": {"plan_chunk": 5},
                           "clusters": [{"name": "c0"}, {"name": "c1"}]})
    clock = [float(NOW)]
    d = replica(sqlite_store, config, clock)
    for _ in range(30):
        add(sqlite_store, "c0")
    await rounds([d], 2)
    shard = d.by_name["c0"]
    fake = shard.adapter
    assert isinstance(fake, Cluster) and len(fake.jobs) == 30
    shard.reconciler.forget()  # its next tick plans every job, 5 at a time
    read = fake.find_many
    reports: list[TickReport] = []
    tick = shard.reconciler.tick

    async def asked_to_shed(*args: Any, **kwargs: Any) -> Any:
        shard.shed = True  # (the daemon's count rose during the tick)
        return await read(*args, **kwargs)

    async def recorded() -> TickReport:
        reports.append(await tick())
        return reports[-1]

    fake.find_many = asked_to_shed  # type: ignore[method-assign]
    shard.reconciler.tick = recorded  # type: ignore[method-assign]
    await shard.tick_once()
    assert [(r.planned, r.deferred) for r in reports] == [(5, 25)]
    assert not shard.held and not shard.shed


def quick_config(**daemon: float) -> Config:
    port = free_port()
    return parse_config({"daemon": {"metrics_port": port, **daemon},
                         "clusters": [{"name": "cpu"}, {"name": "gpu"}]})


async def test_sigterm_finishes_the_tick_in_progress(sqlite_store: Store) -> None:
    config = quick_config(tick_interval_s=5, lease_ttl_s=30)
    clock = [float(NOW)]
    d = replica(sqlite_store, config, clock)
    began, finished = asyncio.Event(), []

    async def slow_tick() -> TickReport:
        began.set()
        await asyncio.sleep(1.0)
        finished.append(True)
        return TickReport()

    d.shards[0].reconciler.tick = slow_tick  # type: ignore[method-assign]
    run = asyncio.create_task(d.run(install_signals=False))
    await asyncio.wait_for(began.wait(), 30)
    d.stop_event.set()  # what SIGTERM does
    await asyncio.wait_for(run, 30)
    assert finished == [True]  # not cancelled half-way


async def test_a_long_tick_of_one_shard_does_not_let_anothers_lease_lapse(
        sqlite_store: Store) -> None:
    """Two shards whose ticks each run ~4 s of blocking work in 1 s pieces (a shard's
    first tick at 10k jobs): each renews its lease only when its tick starts, so without
    renewals between the pieces a lease of 3 s lapses and a rival replica takes it."""
    config = quick_config(tick_interval_s=1, lease_ttl_s=3, lease_margin_s=0.5)
    d = Daemon(config, store=sqlite_store, metrics=Metrics(), shards=[
        build_shard(config, name, store=sqlite_store, adapter=Cluster(name, [NOW]),
                    metrics=Metrics(cluster=name)) for name in ("cpu", "gpu")])
    for shard in d.shards[1:]:
        shard.lease.holder = d.shards[0].lease.holder
    done: list[str] = []

    def blocking_tick(name: str) -> Any:
        async def tick() -> TickReport:
            if name in done:
                return TickReport()
            for _ in range(4):
                time.sleep(1.0)  # CPU-bound planning, in pieces
                await asyncio.sleep(0)
            done.append(name)
            return TickReport()
        return tick

    for shard in d.shards:
        shard.reconciler.tick = blocking_tick(shard.name)  # type: ignore[method-assign]
    rival = shard_lease(config, "gpu", sqlite_store)
    rival.holder = "rival"  # another replica: its own thread, its own pace
    stolen: list[bool] = []
    stop = threading.Event()

    def rival_tries() -> None:
        while not stop.wait(0.2):
            if all(shard.held for shard in d.shards):  # (it tries once they hold theirs)
                stolen.append(rival.try_acquire())

    thread = threading.Thread(target=rival_tries)
    thread.start()
    run = asyncio.create_task(d.run(install_signals=False))
    try:
        while len(done) < 2:
            await asyncio.sleep(0.2)
    finally:
        stop.set()
        thread.join()
    d.stop_event.set()
    await asyncio.wait_for(run, 30)
    assert not any(stolen) and len(stolen) >= 5


async def test_the_keeper_outlives_a_failed_round(sqlite_store: Store,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A round that raises (a bug, a driver error the store does not wrap) is logged and
    the next round runs: leases keep being renewed."""
    config = parse_config({"daemon": {"lease_ttl_s": 2, "tick_interval_s": 1,
                                      "lease_margin_s": 0.5},
                           "clusters": [{"name": name} for name in NAMES]})
    clock = [float(NOW)]
    d = replica(sqlite_store, config, clock)
    d.count_replicas()
    await d.tick_once()
    rounds: list[int] = []
    heartbeat = d.membership.heartbeat

    def flaky(shards: Any = ()) -> int:
        rounds.append(1)
        if len(rounds) == 1:
            raise RuntimeError("boom")
        return heartbeat(shards)

    monkeypatch.setattr(d.membership, "heartbeat", flaky)
    stop = threading.Event()
    keeper = threading.Thread(target=d._keep, args=(stop, asyncio.get_running_loop()))
    keeper.start()
    try:
        for _ in range(100):
            if len(rounds) >= 3:
                break
            await asyncio.sleep(0.1)
    finally:
        stop.set()
        keeper.join()
    assert len(rounds) >= 3 and all(shard.held for shard in d.shards)


async def test_readyz_is_not_ready_before_the_first_lease_attempt(sqlite_store: Store) -> None:
    """The HTTP endpoint starts before any shard has tried its lease: a daemon that has
    not yet learnt whether it leads is starting, not a ready standby (CI saw /readyz 200
    with ``dispatch_leader`` still 0 in the image test)."""
    clock = [float(NOW)]
    d = replica(sqlite_store, three_clusters(), clock)
    ok, why = await d.ready()
    assert not ok and why.count("starting") == len(NAMES), why
    d.count_replicas()
    await d.tick_once()  # alone on SQLite: it leads every shard and has ticked
    ok, why = await d.ready()
    assert ok and "standby" not in why, why
    # a second replica that tried and lost is a ready standby
    other = replica(sqlite_store, three_clusters(), clock)
    await other.tick_once()
    ok, why = await other.ready()
    assert ok and why.count("standby") == len(NAMES), why


async def test_jobs_placed_on_a_cluster_the_configuration_dropped_are_counted(
        any_store: Store, caplog: pytest.LogCaptureFixture) -> None:
    """A job placed on a cluster that the configuration no longer names is planned by no
    shard here: it must not wait silently. The replica counts such jobs (a process-level
    gauge, ``DispatchJobsOnUnconfiguredCluster``) and logs the clusters, and the count
    falls once the configuration names the cluster again."""
    clock = [NOW]
    old = Cluster("old", clock)
    placed = add(any_store, "old")
    await reconciler(any_store, old, ("cpu", "old")).tick()  # placed and submitted on old
    assert status(any_store, placed) is not None
    assert status(any_store, placed).cluster == "old"  # type: ignore[union-attr]
    add(any_store, "cpu")  # unplaced, known: not counted
    wall = [float(NOW)]
    d = replica(any_store, parse_config({"clusters": [{"name": "cpu"}, {"name": "gpu"}]}),
                wall)
    with caplog.at_level("WARNING", logger="dispatch.daemon"):
        await d.check_placements()
    gauge = "dispatch_jobs_unconfigured_cluster"
    assert d.metrics.registry.get_sample_value(gauge) == 1
    assert any("old" in str(getattr(r, "clusters", "")) for r in caplog.records), caplog.text
    back = replica(any_store, parse_config({"clusters": [{"name": "cpu"}, {"name": "old"}]}),
                   wall)
    await back.check_placements()
    assert back.metrics.registry.get_sample_value(gauge) == 0


async def leading(store: Store) -> Daemon:
    """One replica of two clusters that has taken both shards and ticked once."""
    config = parse_config({"daemon": {"lease_ttl_s": 30, "tick_interval_s": 5},
                           "clusters": [{"name": name} for name in NAMES[:2]]})
    d = replica(store, config, [float(NOW)])
    d.count_replicas()
    await d.tick_once()
    return d


async def test_the_keeper_takes_no_shard_whose_tick_is_still_running(
        sqlite_store: Store) -> None:
    """This replica stalled past its lease while a tick of the shard ran: the keeper
    leaves the shard until that tick has ended, then takes it over."""
    d = await leading(sqlite_store)
    shard = d.shards[0]
    assert shard.held
    shard.lease.drop()  # the stall: the lease expired behind this replica
    with sqlite_store.transaction() as tx:
        tx.execute(update(LeaseRow).where(LeaseRow.name == shard.lease.name)
                   .values(expires_at_ms=0))
    async with shard._tick_lock:  # its tick is still running
        assert shard not in d._orphans()
    assert shard in d._orphans()


async def test_a_leader_whose_cluster_is_unreachable_is_not_ready(sqlite_store: Store) -> None:
    """/readyz follows the live read: one failed read makes the leader's shard not
    ready (within one tick, not after three intervals), one good read makes it ready."""
    d = await leading(sqlite_store)
    shard = d.shards[0]
    assert shard.status(60)[0]
    fake = shard.adapter
    assert isinstance(fake, Cluster)
    fake.fail_live = True
    await d.tick_once()
    ok, why = shard.status(60)
    assert not ok and "unreachable" in why
    assert d.shards[1].status(60)[0]  # the other cluster's shard is not affected
    fake.fail_live = False
    await d.tick_once()
    assert shard.status(60)[0]


# ---------------------------------------------------------------- shadow ticks (issue 19)


def shadowing(daemon: Daemon) -> dict[str, list[TickReport]]:
    """Note each shard's shadow ticks (their reports) as the shard makes them."""
    seen: dict[str, list[TickReport]] = {s.name: [] for s in daemon.shards}
    for shard in daemon.shards:
        shadow = shard.reconciler.shadow

        async def noted(name: str = shard.name, shadow: Any = shadow,
                        **kwargs: Any) -> TickReport:
            report: TickReport = await shadow(**kwargs)
            seen[name].append(report)
            return report

        shard.reconciler.shadow = noted  # type: ignore[method-assign]
    return seen


async def test_a_replica_that_leads_shards_shadows_no_other(pg_store: Store) -> None:
    """Shadow ticks every ``standby_shadow_s`` are a pure standby's: a replica that leads
    shards spends nothing on the shards other live replicas lead (bench/shards: with
    every replica shadowing every shard it did not hold, four replicas never spread
    their ten shards)."""
    config = three_clusters()
    clock = [float(NOW)]
    daemons = [replica(pg_store, config, clock) for _ in range(3)]
    notes = [shadowing(d) for d in daemons]
    await rounds(daemons, 6)
    assert sorted(len(h) for h in held(daemons)) == [1, 1, 1], held(daemons)
    for note in notes:
        for reports in note.values():
            reports.clear()
    step = config.daemon.tick_interval_s  # every lease renewed each round, as live
    for _ in range(int(2 * config.daemon.standby_shadow_s / step) + 1):
        clock[0] += step
        await rounds(daemons, 1)
    assert [n for note in notes for n in note.values() if n] == []


async def test_a_pure_standbys_shadow_stops_once_the_lease_is_given_up(
        sqlite_store: Store) -> None:
    """A shadow tick of a standby holding no shard runs a chunk at a time; once the leader
    gives the lease up (shedding, or stopping), the shadow stops at the next chunk and
    the next tick takes the lease: a shadow never holds the shard's loop from a take."""
    config = parse_config({"daemon": {"lease_ttl_s": 30, "tick_interval_s": 5},
                           "reconcile": {"plan_chunk": 5}})
    clock = [float(NOW)]
    leader, standby = replica(sqlite_store, config, clock), replica(sqlite_store, config,
                                                                     clock)
    for _ in range(40):
        add(sqlite_store)
    await rounds([leader], 1)
    assert held([leader, standby]) == [["lab"], []]
    notes = shadowing(standby)
    shard = standby.shards[0]
    memory = shard.reconciler.memory
    with_rows = memory.with_rows
    chunks = [0]

    def chunk(todo: Any, report: Any) -> Any:
        chunks[0] += 1
        if chunks[0] == 2:  # the leader gives the shard up while the shadow runs
            leader.shards[0].give_up("test")
            clock[0] += 2  # (the shadow reads the lease row at most once a second)
        return with_rows(todo, report)

    memory.with_rows = chunk  # type: ignore[method-assign]
    await rounds([standby], 1)
    (report,) = notes["lab"]
    assert report.reloaded == 10 and report.deferred == 30, report  # two chunks of 5
    assert held([leader, standby]) == [[], []]
    await rounds([standby], 1)
    assert held([leader, standby]) == [[], ["lab"]]
