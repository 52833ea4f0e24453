"""The daemon process: one shard per configured cluster, each ticking on its own schedule.

- ``AsyncIOScheduler`` runs each shard's tick (``controller.daemon.shard``) with
  ``max_instances=1, coalesce=True``; a PostgreSQL NOTIFY (a client wrote a job) or the
  first start wakes them at once. A cluster whose Slurm hangs delays its own shard only.
- Replicas share the shards through their leases: each daemon renews its row in
  ``replicas`` (``controller.store.members``) and takes at most its fair share,
  ``ceil(shards / live replicas)``; one that holds more (a replica joined) gives the
  whole surplus up at once, each shard's tick in progress ending at its next chunk; an
  orphaned shard (its replica died: the lease expired) is
  taken by a replica below its share. SQLite: one daemon holds every shard.
- A keeper thread renews the held leases and the membership row every quarter TTL (or
  as the next lease held elsewhere expires), takes orphaned shards and, when it counts
  more replicas than before, has the surplus shed at once, whatever the event loop is
  busy with.
- SIGTERM/SIGINT: finish the ticks in progress, release the leases (standbys take over
  at once), leave the membership, exit 0. Jobs are never cancelled on shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta

from apscheduler.schedulers.asyncio import AsyncIOScheduler

from controller.config import Config
from controller.daemon.http import HealthServer
from controller.daemon.shard import AGAIN_LIMIT, Shard, lease_name
from controller.errors import DispatchError
from controller.metrics import Metrics
from controller.reconcile.placement import Clusters
from controller.reconcile.ports import SchedulerPort
from controller.reconcile.tick import Clock, Reconciler
from controller.store import notify, repo
from controller.store.db import Store
from controller.store.lease import Lease, LeaseInfo, read_leases
from controller.store.members import Membership, fair_share

log = logging.getLogger("dispatch.daemon")


def shard_lease(config: Config, name: str, store: Store, *, clock: Clock = time.time,
                holder: str | None = None) -> Lease:
    """The lease of configured cluster ``name``'s shard (``controller.daemon.shard``);
    ``holder``: this replica's id (one for all its shards), else a new one."""
    d = config.daemon
    return Lease(store, ttl_s=d.lease_ttl_s, margin_s=d.lease_margin_s, clock=clock,
                 name=lease_name(name, default=name == config.default_cluster.name),
                 cluster=name, holder=holder)


def build_shard(config: Config, name: str, *, store: Store, adapter: SchedulerPort,
                metrics: Metrics, lease: Lease | None = None, clock: Clock = time.time,
                preflight: Callable[[], Awaitable[list[str]]] | None = None) -> Shard:
    """The shard of configured cluster ``name``: its lease and reconciler."""
    d = config.daemon
    if lease is None:
        lease = shard_lease(config, name, store, clock=clock)
    # a tick takes on no further chunk of work after a third of the lease TTL of its own
    # time (or a whole TTL of wall time, waits included: ``Reconciler._spent``): a burst
    # is spread over ticks, and a cold first tick of many jobs goes in pieces
    reconciler = Reconciler(store, adapter, metrics=metrics, clock=clock,
                            settings=config.reconcile, fence=lease,
                            budget_s=d.lease_ttl_s / 3,
                            clusters=Clusters(config.cluster_names, name))
    return Shard(name, store=store, adapter=adapter, metrics=metrics, lease=lease,
                 reconciler=reconciler, tick_interval_s=d.tick_interval_s, clock=clock,
                 preflight=preflight, shadow_s=d.standby_shadow_s)


class Daemon:
    """The process: its shards, the HTTP endpoint, the schedule and the membership.

    ``Daemon(config, store=, adapter=, metrics=)`` drives the configuration's default
    cluster through ``adapter`` alone (one shard); ``shards=`` gives every shard."""

    def __init__(self, config: Config, *, store: Store, metrics: Metrics,
                 adapter: SchedulerPort | None = None, clock: Clock = time.time,
                 lease: Lease | None = None,
                 preflight: Callable[[], Awaitable[list[str]]] | None = None,
                 shards: Sequence[Shard] | None = None,
                 membership: Membership | None = None) -> None:
        self.config = config
        self.store = store
        self.metrics = metrics
        self.clock = clock
        if shards is None:
            assert adapter is not None, "Daemon: give adapter= or shards="
            shards = [build_shard(config, config.default_cluster.name, store=store,
                                  adapter=adapter, metrics=metrics, lease=lease, clock=clock,
                                  preflight=preflight)]
        if not shards:
            raise ValueError("Daemon: no shard to drive")
        self.shards = list(shards)
        self.by_name = {shard.name: shard for shard in self.shards}
        d = config.daemon
        self.membership = membership if membership is not None else Membership(
            store, holder=self.shards[0].lease.holder, ttl_s=d.lease_ttl_s, clock=clock)
        self._take_lock = threading.Lock()  # one take at a time (``_take_now``)
        shadow_slot = asyncio.Lock()  # one shadow tick at a time (``Shard.shadow_slot``)
        for shard in self.shards:
            shard.may_take = self._may_take
            shard.idle = self._idle
            shard.shadow_slot = shadow_slot
            shard.take = self._take
            shard.on_moved = self._wake_clusters
        self.stop_event = asyncio.Event()
        self._scheduler: AsyncIOScheduler | None = None
        self.http: HealthServer | None = None

    # ------------------------------------------------------------ one shard's view
    # (the single-cluster daemon's attributes: tests and tools read them)

    @property
    def reconciler(self) -> Reconciler:
        return self.shards[0].reconciler

    @property
    def lease(self) -> Lease:
        return self.shards[0].lease

    @property
    def ticks(self) -> int:
        return sum(shard.ticks for shard in self.shards)

    async def tick_once(self) -> None:
        """Tick every shard once (each as its schedule would), concurrently."""
        await asyncio.gather(*(shard.tick_once() for shard in self.shards))

    # ------------------------------------------------------------ shards and replicas

    def held(self) -> list[Shard]:
        return [shard for shard in self.shards if shard.held]

    @property
    def share(self) -> int:
        """The most shards this daemon takes, from the live replicas last counted (every
        shard before the first count)."""
        return fair_share(len(self.shards), self.membership.live)

    def _may_take(self) -> bool:
        """Whether this daemon may take one more shard: it holds fewer than its fair
        share (the keeper thread keeps the count of live replicas fresh)."""
        return len(self.held()) < self.share

    def _idle(self) -> bool:
        """This daemon holds no shard: a pure standby, whose shards' shadow ticks may run
        every ``daemon.standby_shadow_s`` (a daemon that leads some shards shadows the
        others only when their leases go unrenewed: its cycles are its own shards')."""
        return not self.held()

    def _take_now(self, shard: Shard) -> bool:
        """Renew ``shard``'s lease if held; else take it if this daemon is below its fair
        share -- one take at a time (a thread lock), so shards whose ticks start
        together, and the keeper, cannot all pass the check before any of them holds its
        lease. A stopping daemon takes nothing. Any thread; a database round trip."""
        if shard.lease.held:
            return shard.lease.try_acquire()
        if self.stop_event.is_set():
            return False
        with self._take_lock:
            if not self._may_take():
                return False
            return shard.lease.try_acquire()

    async def _take(self, shard: Shard) -> bool:
        return await asyncio.to_thread(self._take_now, shard)

    def _keep(self, stop: threading.Event, loop: asyncio.AbstractEventLoop) -> None:
        """The keeper, a thread of its own, every quarter TTL or sooner (``_keep_once``):
        renews each held lease that has run under half its TTL and this replica's
        membership row, counts the live replicas, and takes orphaned shards (their
        replica died: the lease expired) while below the fair share, waking each taken
        shard's first tick. A busy event loop (shards' long first ticks, in pieces that
        wait behind one another) never lets a lease or the membership lapse, nor delays a
        takeover."""
        period = self._keep_period
        delay = period
        while not stop.wait(delay):
            try:
                delay = self._keep_once(loop)
            except Exception:  # the keeper never dies: the next round tries again
                log.exception("lease keeper round failed")
                delay = period

    @property
    def _keep_period(self) -> float:
        return max(0.2, self.config.daemon.lease_ttl_s / 4)

    def _keep_once(self, loop: asyncio.AbstractEventLoop) -> float:
        """One keeper round; returns the seconds to the next: a quarter TTL, or less when
        a lease held by another replica expires sooner (the keeper then takes the shard
        as its lease expires -- if its replica died, the survivors' share has grown by
        then, ``Membership``)."""
        held = []
        for shard in self.shards:
            if shard.lease.held:
                shard.lease.refresh()
                held.append(shard.name)
        before = self.membership.live
        if self.membership.heartbeat(held) > before:  # the share fell: shed now, not at
            loop.call_soon_threadsafe(self._rebalance)  # the next ``_members`` round
        leases = self._leases()
        if self._may_take():
            for shard in self._orphans(leases):
                if self._may_take() and self._take_now(shard):
                    loop.call_soon_threadsafe(shard.wake)
        now = self.clock()
        expiring = [info.expires_at - now for shard in self.shards if not shard.lease.held
                    and (info := leases.get(shard.lease.name)) is not None
                    and info.expires_at > now]
        return max(0.05, min([self._keep_period, *(left + 0.05 for left in expiring)]))

    def _leases(self) -> dict[str, LeaseInfo]:
        """Every lease row by name (none when the database does not answer)."""
        try:
            with self.store.transaction() as tx:
                return {info.name: info for info in read_leases(tx)}
        except DispatchError:
            return {}

    def _orphans(self, leases: dict[str, LeaseInfo] | None = None) -> list[Shard]:
        """The shards not held here whose lease was held and has expired: their replica
        died or stalled. A shard whose tick is still running here is not one: that tick
        must end (its fence stops it) before the shard is taken again. (A lease never
        taken is left to the shards' own ticks, which take in turn within the fair
        share: at startup the count of replicas is still growing.)"""
        if leases is None:
            leases = self._leases()
        now = self.clock()
        return [shard for shard in self.shards if not shard.lease.held and not shard.busy
                and (info := leases.get(shard.lease.name)) is not None
                and info.expires_at <= now]

    def count_replicas(self) -> None:
        """Renew this replica's row and count the live ones (``share`` follows), then
        ``_rebalance``."""
        self.membership.heartbeat([shard.name for shard in self.held()])
        self._rebalance()

    def _rebalance(self) -> None:
        """Publish the counts; a daemon above its fair share marks every surplus shard to
        give up (the last by name: every replica sheds the same way). Each one's tick in
        progress takes on no further chunk, and the lease goes at once: a replica that
        started first and took every shard does not finish a cold first tick of each
        before letting it go."""
        held = sorted(self.held(), key=lambda shard: shard.name)
        live = self.membership.live
        self.metrics.set_replicas_live(live)
        self.metrics.set_shards_held(len(held))
        surplus = [shard for shard in held[self.share:] if not shard.shed]
        if surplus:
            log.info("above the fair share: giving shards up",
                     extra={"clusters": [shard.name for shard in surplus],
                            "held": len(held), "share": self.share, "replicas": live})
        for shard in surplus:
            shard.shed = True
            shard.wake()

    async def _members(self) -> None:
        self._rebalance()  # (the keeper thread counts the replicas)

    def _wake_clusters(self, clusters: set[str]) -> None:
        """A tick moved jobs to these clusters: their shards (if here) tick at once."""
        for name in clusters:
            shard = self.by_name.get(name)
            if shard is not None:
                shard.wake()

    def wake(self) -> None:
        """Run every shard's tick as soon as possible (a client wrote a job)."""
        for shard in self.shards:
            shard.wake()

    async def refresh_cluster_stats(self) -> None:
        await asyncio.gather(*(shard.refresh_cluster_stats() for shard in self.shards),
                             self.check_placements())

    async def check_placements(self) -> None:
        """Count the non-terminal jobs placed on a cluster the configuration does not name
        (dropped or renamed since they were placed): no shard here plans them, so they
        would wait silently. A gauge (``dispatch_jobs_unconfigured_cluster``) and a
        warning naming the clusters; the jobs are left as they are (their Slurm jobs are
        on a cluster this daemon cannot reach), and are planned again once a
        configuration names the cluster."""
        names = [shard.name for shard in self.shards]

        def count() -> dict[str, int]:
            with self.store.transaction() as tx:
                return repo.placed_elsewhere(tx, names)

        try:
            elsewhere = await asyncio.to_thread(count)
        except DispatchError as exc:
            log.warning("placement check failed", extra={"error": str(exc)})
            return
        self.metrics.set_unconfigured(sum(elsewhere.values()))
        if elsewhere:
            log.warning("jobs placed on clusters not configured here: no shard reconciles "
                        "them until a configuration names the cluster again",
                        extra={"clusters": dict(sorted(elsewhere.items())),
                               "configured": names})

    async def ready(self) -> tuple[bool, str]:
        if not await asyncio.to_thread(self.store.ping):
            return False, "database unreachable"
        limit = max(3 * self.config.daemon.tick_interval_s, 30)
        states = [(shard.name, *shard.status(limit)) for shard in self.shards]
        ok = all(good for _, good, _ in states)
        if len(states) == 1:
            return ok, states[0][2]
        return ok, "; ".join(f"{name}: {why}" for name, _, why in states)

    # ------------------------------------------------------------ lifecycle

    def _kicker(self, shard: Shard) -> Callable[[], None]:
        def kick() -> None:
            if self._scheduler is not None and not self.stop_event.is_set():
                job = self._scheduler.get_job(f"tick:{shard.name}")
                if job is not None:
                    job.modify(next_run_time=datetime.now(UTC))
        return kick

    async def run(self, *, install_signals: bool = True) -> None:
        loop = asyncio.get_running_loop()
        if install_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.stop_event.set)
        d = self.config.daemon
        self.http = HealthServer(self.metrics.registry, self.ready, host=d.metrics_host,
                                 port=d.metrics_port)
        await self.http.start()
        await asyncio.to_thread(self.count_replicas)  # the fair share before any tick
        keeper_stop = threading.Event()
        keeper = threading.Thread(target=self._keep, args=(keeper_stop, loop),
                                  name="dispatch-lease-keeper", daemon=True)
        keeper.start()
        scheduler = AsyncIOScheduler(event_loop=loop)
        # (misfire_grace_time=None: a run the busy loop delayed still runs, late)
        scheduler.add_job(self._members, "interval", seconds=d.tick_interval_s,
                          id="members", max_instances=1, coalesce=True,
                          misfire_grace_time=None)
        for shard in self.shards:
            scheduler.add_job(shard.tick_once, "interval", seconds=d.tick_interval_s,
                              id=f"tick:{shard.name}", max_instances=1, coalesce=True,
                              misfire_grace_time=None, next_run_time=datetime.now(UTC))
            shard.kick = self._kicker(shard)
        scheduler.add_job(self.refresh_cluster_stats, "interval",
                          seconds=d.cluster_stats_interval_s, id="cluster-stats",
                          max_instances=1, coalesce=True,
                          next_run_time=datetime.now(UTC) + timedelta(seconds=1))
        self._scheduler = scheduler
        scheduler.start()
        listener: asyncio.Task[None] | None = None
        if self.store.dialect == "postgresql":
            listener = asyncio.create_task(notify.listen(self.store.url, self.wake,
                                                         stop=self.stop_event))
        log.info("daemon started", extra={"config": self.config.redacted(),
                                          "shards": [shard.name for shard in self.shards]})
        await self.stop_event.wait()
        log.info("stopping: finishing the ticks in progress")
        # before the scheduler stops: its shutdown cancels the coroutines it runs
        await asyncio.gather(*(shard.drain() for shard in self.shards))
        scheduler.shutdown(wait=False)
        if listener is not None:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listener
        await self.http.close()
        keeper_stop.set()
        await asyncio.to_thread(keeper.join)
        for shard in self.shards:
            await shard.release("shutdown")
        await asyncio.to_thread(self.membership.leave)
        log.info("daemon stopped")


__all__ = ["AGAIN_LIMIT", "Daemon", "build_shard", "shard_lease"]
