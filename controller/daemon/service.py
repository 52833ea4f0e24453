"""The daemon process: one tick at a time on an APScheduler interval, leader-only.

- ``AsyncIOScheduler`` runs the tick with ``max_instances=1, coalesce=True``; a
  PostgreSQL NOTIFY (a client wrote a job) or the first start wakes it at once.
- Only the holder of the leader lease (``controller.store.lease``) ticks; the others
  stand by and try to take it every tick. The lease is renewed before every tick (and by
  the fence when a tick runs long); the tick's writes are fenced on its epoch, and its
  Slurm writes stop at the lease deadline minus a margin: a leader that stalled (SIGSTOP,
  a stuck loop) past its lease wakes up as a standby and writes nothing.
- On gaining the lease: forget everything remembered (the next tick reloads every job)
  and run preflight, logging what the cluster supports.
- SIGTERM/SIGINT: finish the tick in progress, release the lease (a standby takes over at
  once), exit 0. Jobs are never cancelled on shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

from apscheduler.schedulers.asyncio import AsyncIOScheduler

from controller.config import Config
from controller.daemon.http import HealthServer
from controller.errors import DispatchError, LeaseLost
from controller.metrics import Metrics
from controller.reconcile.ports import SlurmPort
from controller.reconcile.tick import Clock, Reconciler
from controller.store import notify
from controller.store.db import Store
from controller.store.lease import Lease, LeaseInfo, read_lease

log = logging.getLogger("dispatch.daemon")

# Ticks run back to back (a burst's slices, outcomes waiting, wakes during a tick) at most
# this many times before the interval schedule takes over again: a rule that asks for
# "again" every tick cannot spin the daemon.
AGAIN_LIMIT = 100


class Daemon:
    def __init__(self, config: Config, *, store: Store, adapter: SlurmPort, metrics: Metrics,
                 clock: Clock = time.time, lease: Lease | None = None,
                 preflight: Callable[[], Awaitable[list[str]]] | None = None) -> None:
        self.config = config
        self.store = store
        self.adapter = adapter
        self.metrics = metrics
        self.clock = clock
        d = config.daemon
        self.lease = lease if lease is not None else Lease(
            store, ttl_s=d.lease_ttl_s, margin_s=d.lease_margin_s, clock=clock)
        # a tick takes on no further chunk of work after a third of the lease TTL: it
        # renews its lease long before the deadline, and a burst is spread over ticks
        self.reconciler = Reconciler(store, adapter, metrics=metrics, clock=clock,
                                     settings=config.reconcile, fence=self.lease,
                                     budget_s=config.daemon.lease_ttl_s / 3)
        self._held_epoch: int | None = None  # the epoch the last tick ran under
        self.seen: LeaseInfo | None = None  # the lease row as last read
        self.preflight = preflight
        self.stop_event = asyncio.Event()
        self._tick_lock = asyncio.Lock()
        self._again = False  # tick again right after this one (``wake``)
        self._scheduler: AsyncIOScheduler | None = None
        self.http: HealthServer | None = None
        self.ticks = 0

    # ------------------------------------------------------------ jobs

    async def tick_once(self) -> None:
        """Leader-guarded ticks; safe to call concurrently (one runs at a time). A wake
        during a tick (a row committed, an action outcome or the rest of a burst waiting:
        ``wake``) is not lost: the next tick follows at once, at most ``AGAIN_LIMIT`` in
        a row before the interval schedule takes over again."""
        for _ in range(AGAIN_LIMIT):
            self._again = False
            await self._tick_guarded()
            if not self._again or self.stop_event.is_set():
                return

    async def _tick_guarded(self) -> None:
        if self.stop_event.is_set():
            return
        async with self._tick_lock:
            leader = await asyncio.to_thread(self.lease.try_acquire)
            await asyncio.to_thread(self._read_lease)
            if not leader:
                if self._held_epoch is not None:
                    log.warning("stood down: the lease moved; no further writes",
                                extra={"epoch": self._held_epoch,
                                       "holder": self.seen.holder if self.seen else None})
                    self._stand_down()
                else:
                    log.info("standing by: another daemon holds the lease",
                             extra={"holder": self.seen.holder if self.seen else None,
                                    "epoch": self.seen.epoch if self.seen else None})
                self._publish_leader()
                if self._takeover_near():
                    await self.reconciler.prewarm()
                return
            if self.lease.epoch != self._held_epoch:
                self.reconciler.forget()  # another leader may have acted meanwhile
                self._held_epoch = self.lease.epoch
                log.info("leading", extra={"holder": self.lease.holder,
                                           "epoch": self.lease.epoch})
                await self._run_preflight()
            self._publish_leader()
            try:
                report = await self.reconciler.tick()
            except LeaseLost as exc:
                log.warning("stood down: lease lost during the tick; no further writes",
                            extra={"epoch": self._held_epoch, "error": str(exc)})
                self.lease.drop()
                self._stand_down()
                self._publish_leader()
                self.metrics.ticks.labels(result="error").inc()
                return
            except DispatchError as exc:
                log.warning("tick failed", extra={"error": str(exc)})
                self.metrics.ticks.labels(result="error").inc()
                return
            except Exception:
                log.exception("tick crashed")
                self.metrics.ticks.labels(result="error").inc()
                return
            self.ticks += 1
            if report.replan_soon:  # an outcome or a burst's rest waits: at once
                self._again = True
            log.info("tick", extra={"tracked": report.tracked, "actions": dict(report.actions),
                                    "errors": len(report.errors), "slurm_ok": report.slurm_ok,
                                    "epoch": self.lease.epoch,
                                    "seconds": round(report.duration_s, 3)})

    def _takeover_near(self) -> bool:
        """The lease we stand by has gone unrenewed for half its TTL (a healthy leader
        renews it every tick, and a long tick halfway): a takeover may come soon."""
        seen = self.seen
        window = max(self.lease.ttl_s / 2, self.config.daemon.tick_interval_s + 1)
        return seen is not None and seen.expires_at - self.clock() <= window

    def _stand_down(self) -> None:
        self._held_epoch = None
        self.reconciler.forget()

    def _read_lease(self) -> None:
        try:
            with self.store.transaction() as tx:
                self.seen = read_lease(tx, self.lease.name)
        except DispatchError:
            pass  # the last one seen stays

    def _publish_leader(self) -> None:
        seen = self.seen
        self.metrics.set_leader(held=self.lease.held, epoch=self.lease.epoch,
                                holder=seen.holder if seen else None,
                                seen_epoch=seen.epoch if seen else None)

    async def _run_preflight(self) -> None:
        """On gaining the lease: what does the cluster support? Logged, never fatal here
        (``dispatchctl preflight`` is the strict check)."""
        if self.preflight is None:
            return
        try:
            problems = await self.preflight()
        except DispatchError as exc:
            log.warning("preflight failed", extra={"error": str(exc)})
            return
        if problems:
            log.warning("preflight: the cluster lacks what the daemon needs",
                        extra={"problems": problems})
        else:
            log.info("preflight ok")

    async def refresh_cluster_stats(self) -> None:
        if not self.lease.held:
            return
        try:
            stats = await self.adapter.cluster_stats()
        except DispatchError as exc:
            log.warning("cluster stats failed", extra={"error": str(exc)})
            return
        self.reconciler.cluster_stats = stats
        self.metrics.cluster_running.set(stats.running)
        self.metrics.cluster_pending.set(stats.pending)
        if stats.estimated_wait_s is not None:
            self.metrics.queue_wait.labels(method="estimate").set(stats.estimated_wait_s)
        if stats.observed_wait_s is not None:
            self.metrics.queue_wait.labels(method="observed").set(stats.observed_wait_s)

    def wake(self) -> None:
        """Run the tick as soon as possible (coalesced with one already queued); during a
        tick, the next one follows it at once (the scheduler would skip a run while one
        is in flight)."""
        self._again = True
        if self._tick_lock.locked():
            return
        if self._scheduler is not None and not self.stop_event.is_set():
            job = self._scheduler.get_job("tick")
            if job is not None:
                job.modify(next_run_time=datetime.now(UTC))

    async def ready(self) -> tuple[bool, str]:
        if not await asyncio.to_thread(self.store.ping):
            return False, "database unreachable"
        seen = self.seen
        who = f"holder={seen.holder} epoch={seen.epoch}" if seen else "no lease yet"
        if not self.lease.held:
            return True, f"standby (not leader); {who}"
        last = self.reconciler.last_success
        limit = max(3 * self.config.daemon.tick_interval_s, 30)
        if last is None or self.clock() - last > limit:
            return False, f"no successful tick recently; {who}"
        return True, f"ok; leader {who}"

    # ------------------------------------------------------------ lifecycle

    async def run(self, *, install_signals: bool = True) -> None:
        loop = asyncio.get_running_loop()
        if install_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.stop_event.set)
        d = self.config.daemon
        self.http = HealthServer(self.metrics.registry, self.ready, host=d.metrics_host,
                                 port=d.metrics_port)
        await self.http.start()
        scheduler = AsyncIOScheduler(event_loop=loop)
        scheduler.add_job(self.tick_once, "interval", seconds=d.tick_interval_s, id="tick",
                          max_instances=1, coalesce=True, misfire_grace_time=None,
                          next_run_time=datetime.now(UTC))
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
        log.info("daemon started", extra={"config": self.config.redacted()})
        await self.stop_event.wait()
        log.info("stopping: finishing the tick in progress")
        scheduler.shutdown(wait=False)
        async with self._tick_lock:  # the tick in progress finishes first
            pass
        if listener is not None:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listener
        await self.http.close()
        await asyncio.to_thread(self.lease.release)
        log.info("daemon stopped")
