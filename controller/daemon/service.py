"""The daemon process: one tick at a time on an APScheduler interval, leader-only.

- ``AsyncIOScheduler`` runs the tick with ``max_instances=1, coalesce=True``; a
  PostgreSQL NOTIFY (a client wrote a job) or the first start wakes it at once.
- Only the holder of the leader lock ticks; the others stand by and retry.
- SIGTERM/SIGINT: finish the tick in progress, release the lock, exit 0. Jobs are
  never cancelled on shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from datetime import UTC, datetime, timedelta

from apscheduler.schedulers.asyncio import AsyncIOScheduler

from controller.config import Config
from controller.daemon.http import HealthServer
from controller.errors import DispatchError
from controller.metrics import Metrics
from controller.reconcile.ports import SlurmPort
from controller.reconcile.tick import Clock, Reconciler, TickSettings
from controller.store import notify
from controller.store.db import Store
from controller.store.lock import LeaderLock

log = logging.getLogger("dispatch.daemon")


class Daemon:
    def __init__(self, config: Config, *, store: Store, adapter: SlurmPort, metrics: Metrics,
                 clock: Clock = time.time) -> None:
        self.config = config
        self.store = store
        self.adapter = adapter
        self.metrics = metrics
        self.clock = clock
        d = config.daemon
        self.reconciler = Reconciler(store, adapter, metrics=metrics, clock=clock,
                                     settings=TickSettings(
                                         unknown_grace_s=int(d.unknown_grace_s),
                                         sacct_window_s=d.sacct_window_s))
        self.lock = LeaderLock(store)
        self.stop_event = asyncio.Event()
        self._tick_lock = asyncio.Lock()
        self._scheduler: AsyncIOScheduler | None = None
        self.http: HealthServer | None = None
        self.ticks = 0

    # ------------------------------------------------------------ jobs

    async def tick_once(self) -> None:
        """One leader-guarded tick; safe to call concurrently (one runs at a time)."""
        if self.stop_event.is_set():
            return
        async with self._tick_lock:
            leader = await asyncio.to_thread(self.lock.try_acquire)
            self.metrics.leader.set(1 if leader else 0)
            if not leader:
                log.info("standing by: another daemon holds the leader lock")
                return
            try:
                report = await self.reconciler.tick()
            except DispatchError as exc:
                log.warning("tick failed", extra={"error": str(exc)})
                self.metrics.ticks.labels(result="error").inc()
                return
            except Exception:
                log.exception("tick crashed")
                self.metrics.ticks.labels(result="error").inc()
                return
            self.ticks += 1
            log.info("tick", extra={"tracked": report.tracked, "actions": dict(report.actions),
                                    "errors": len(report.errors), "slurm_ok": report.slurm_ok,
                                    "seconds": round(report.duration_s, 3)})

    async def refresh_cluster_stats(self) -> None:
        if not self.lock.held:
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
        """Run the tick as soon as possible (coalesced with one already queued)."""
        if self._scheduler is not None and not self.stop_event.is_set():
            job = self._scheduler.get_job("tick")
            if job is not None:
                job.modify(next_run_time=datetime.now(UTC))

    async def ready(self) -> tuple[bool, str]:
        if not await asyncio.to_thread(self.store.ping):
            return False, "database unreachable"
        if not self.lock.held:
            return True, "standby (not leader)"
        last = self.reconciler.last_success
        limit = max(3 * self.config.daemon.tick_interval_s, 30)
        if last is None or self.clock() - last > limit:
            return False, "no successful tick recently"
        return True, "ok"

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
        await asyncio.to_thread(self.lock.release)
        log.info("daemon stopped")
