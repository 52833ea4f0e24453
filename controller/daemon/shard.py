"""One shard: one cluster's lease, reconciler and tick loop inside the daemon.

- Only the holder of the shard's lease (``controller.store.lease``) ticks it; the others
  stand by and try to take it every tick -- when their daemon may take one more shard
  (``may_take``: its fair share, ``controller.store.members``). The lease is renewed
  before every tick (and by the fence when a tick runs long); the tick's writes are
  fenced on its epoch, and its Slurm writes stop at the lease deadline minus a margin:
  a leader that stalled (SIGSTOP, a stuck loop) past its lease wakes up as a standby and
  writes nothing.
- Standing by: shadow ticks, read-only (``controller.reconcile.standby``), at every tick
  while the lease goes unrenewed (a takeover may come) and, in a daemon that holds no
  shard, every ``daemon.standby_shadow_s``, so that the first tick as leader starts from
  memory; a shadow stops as soon as the lease may be taken.
- On gaining the lease: forget what only a leader's ticks may trust (``Reconciler.lead``;
  the first tick reads what changed since the shadow ticks' last mark, or every job
  without them) and run preflight, logging what the cluster supports.
- Ticks run back to back while work waits (a burst's slices, action outcomes, a wake
  during a tick), at most ``AGAIN_LIMIT`` in a row.
- A shard asked to shed (its daemon holds more than its fair share) gives its lease up
  after the tick in progress, which takes on no further chunk of work (a cold first tick
  is not finished for a shard about to go): another replica takes it at once.
- Each shard has its own transport, rate budget, capabilities and health: a cluster whose
  slurmctld is down fails its own reads only.

The lease of the configuration's default (first) cluster is named ``controller`` -- the
one lease of the single-cluster daemons before it, so a rolling upgrade never has an old
and a new leader acting at once; every other cluster's is ``cluster/<name>``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from controller.errors import DispatchError, LeaseLost, OwnershipConflict
from controller.metrics import Metrics
from controller.reconcile.ports import SchedulerPort
from controller.reconcile.tick import Clock, Reconciler, TickReport
from controller.store.db import Store
from controller.store.lease import DEFAULT_LEASE, Lease, LeaseInfo, read_lease

log = logging.getLogger("dispatch.daemon")

# Ticks run back to back (a burst's slices, outcomes waiting, wakes during a tick) at most
# this many times before the interval schedule takes over again: a rule that asks for
# "again" every tick cannot spin the daemon.
AGAIN_LIMIT = 100


def lease_name(cluster: str, *, default: bool) -> str:
    """The lease of a cluster's shard (module docstring)."""
    return DEFAULT_LEASE if default else f"cluster/{cluster}"


class Shard:
    """One cluster's loop. ``may_take`` says whether the daemon may take one more shard
    now; ``on_moved`` is told the clusters a tick moved jobs to."""

    def __init__(self, name: str, *, store: Store, adapter: SchedulerPort, metrics: Metrics,
                 lease: Lease, reconciler: Reconciler, tick_interval_s: float,
                 clock: Clock = time.time, shadow_s: float = 0.0,
                 preflight: Callable[[], Awaitable[list[str]]] | None = None,
                 may_take: Callable[[], bool] = lambda: True,
                 on_moved: Callable[[set[str]], None] = lambda clusters: None) -> None:
        self.name = name
        self.store = store
        self.adapter = adapter
        self.metrics = metrics
        self.lease = lease
        self.reconciler = reconciler
        reconciler.stop_when = self._shedding  # (a shard being given up: ``_shedding``)
        self.tick_interval_s = tick_interval_s
        self.clock = clock
        # a standby's shadow ticks: at least every ``shadow_s`` (0: only while the lease
        # goes unrenewed), at every tick while it does (``daemon.standby_shadow_s``)
        self.shadow_s = shadow_s
        self._shadow_due = 0.0
        # one shadow tick at a time in a daemon (``Daemon`` shares one lock among its
        # shards): a standby of ten shards warms them one after the other, never all at
        # once on cycles its takes and its own shards need; a shard whose turn is taken
        # skips (it never waits holding its own loop)
        self.shadow_slot = asyncio.Lock()
        self.preflight = preflight
        self.may_take = may_take
        # the daemon holds no shard (``Daemon._idle``): periodic shadow ticks allowed
        self.idle: Callable[[], bool] = lambda: not self.lease.held
        self.on_moved = on_moved
        # renew the lease if held, else take it if the daemon may (``Daemon._take``
        # counts and serialises the takes of its shards)
        self.take: Callable[[Shard], Awaitable[bool]] = _take_alone
        self._held_epoch: int | None = None  # the epoch the last tick ran under
        self.seen: LeaseInfo | None = None  # the lease row as last read
        self.tried = False  # the lease was tried at least once (until then: starting)
        self.stopping = False
        self.shed = False  # give the lease up after the tick in progress
        self._tick_lock = asyncio.Lock()
        self._again = False  # tick again right after this one (``wake``)
        self.kick: Callable[[], None] = lambda: None  # the scheduler's "run now"
        self.ticks = 0

    @property
    def held(self) -> bool:
        return self.lease.held

    @property
    def busy(self) -> bool:
        """A tick of this shard is in progress (the keeper takes no such shard: the tick
        would go on under an epoch taken behind it; its fence stops it anyway)."""
        return self._tick_lock.locked()

    # ------------------------------------------------------------ the loop

    async def tick_once(self) -> None:
        """Leader-guarded ticks; safe to call concurrently (one runs at a time). A wake
        during a tick is not lost: the next tick follows at once, at most ``AGAIN_LIMIT``
        in a row before the interval schedule takes over again."""
        for _ in range(AGAIN_LIMIT):
            self._again = False
            await self._tick_guarded()
            if not self._again or self.stopping:
                return

    async def _tick_guarded(self) -> None:
        if self.stopping:
            return
        async with self._tick_lock:
            if self.shed and self.lease.held:
                await self.release("shed: more than a fair share held")
                return  # (not taken again at once: another replica's turn)
            leader = await self.take(self)
            self.tried = True
            await asyncio.to_thread(self._read_lease)
            if not leader:
                self._standing_by()
                near = self._takeover_near()
                if self.may_take() and not self.shadow_slot.locked() and (near or (
                        self.shadow_s > 0 and self.idle()
                        and self.clock() >= self._shadow_due)):
                    # keep warm: the first tick as leader starts from memory
                    self._shadow_due = self.clock() + self.shadow_s
                    async with self.shadow_slot:
                        await self.reconciler.shadow(until=self._shadow_over(near))
                return
            if self.lease.epoch != self._held_epoch:
                # another leader may have acted meanwhile: what only a leader's own
                # ticks know is dropped; what shadow ticks learned is checked against
                # the change feed and a new live read by the first tick
                self.reconciler.lead()
                self._held_epoch = self.lease.epoch
                log.info("leading", extra={"cluster": self.name, "holder": self.lease.holder,
                                           "epoch": self.lease.epoch})
                await self._run_preflight()
            self._publish_leader()
            report = await self._tick()
            if report is None:
                return
            self.ticks += 1
            if report.replan_soon:  # an outcome or a burst's rest waits: at once
                self._again = True
            if report.moved_to:
                self.on_moved(report.moved_to)
            log.info("tick", extra={"cluster": self.name, "tracked": report.tracked,
                                    "planned": report.planned, "deferred": report.deferred,
                                    "changed_rows": report.changed_rows,
                                    "reloaded": report.reloaded,
                                    "actions": dict(report.actions),
                                    "errors": len(report.errors), "slurm_ok": report.slurm_ok,
                                    "epoch": self.lease.epoch,
                                    "seconds": round(report.duration_s, 3),
                                    "phases": {k: round(v, 3)
                                               for k, v in report.timings.items()}})

    async def _tick(self) -> TickReport | None:
        try:
            return await self.reconciler.tick()
        except OwnershipConflict:
            pass  # (logged once by the owner; /readyz and the gauge say so every tick)
        except LeaseLost as exc:
            log.warning("stood down: lease lost during the tick; no further writes",
                        extra={"cluster": self.name, "epoch": self._held_epoch,
                               "error": str(exc)})
            self.lease.drop()
            self._stand_down()
            self._publish_leader()
        except DispatchError as exc:
            log.warning("tick failed", extra={"cluster": self.name, "error": str(exc)})
        except Exception:
            log.exception("tick crashed", extra={"cluster": self.name})
        self.metrics.ticks.labels(result="error").inc()
        return None

    def _shedding(self) -> bool:
        """The tick in progress stops at its next chunk: this shard is being given up
        (what it left is the next holder's first tick)."""
        return self.shed

    def _standing_by(self) -> None:
        seen = self.seen
        if self._held_epoch is not None:
            log.warning("stood down: the lease moved; no further writes",
                        extra={"cluster": self.name, "epoch": self._held_epoch,
                               "holder": seen.holder if seen else None})
            self._stand_down()
        else:
            log.debug("standing by", extra={"cluster": self.name,
                                            "holder": seen.holder if seen else None,
                                            "epoch": seen.epoch if seen else None})
        self._publish_leader()

    async def release(self, why: str) -> None:
        """``give_up`` in a worker thread (a database round trip)."""
        await asyncio.to_thread(self.give_up, why)

    def give_up(self, why: str) -> None:
        """Release the lease (shutdown, or shedding): another replica takes it at once."""
        if self.lease.held:
            log.info("giving the shard up", extra={"cluster": self.name, "why": why,
                                                   "epoch": self.lease.epoch})
        self.lease.release()
        self.shed = False
        self._stand_down()
        self._publish_leader()

    def _takeover_near(self) -> bool:
        """The lease we stand by has gone unrenewed for half its TTL (a healthy leader
        renews it every tick, and a long tick halfway): a takeover may come soon."""
        seen = self.seen
        window = max(self.lease.ttl_s / 2, self.tick_interval_s + 1)
        return seen is not None and seen.expires_at - self.clock() <= window

    def _shadow_over(self, near: bool) -> Callable[[], bool]:
        """When a shadow tick must stop (checked between its chunks): the lease it stands
        by may be taken now -- expired, or released by a leader shedding it (the lease
        row is read again, at most once a second) -- or, for a periodic shadow, this
        daemon took a shard meanwhile (its cycles are its own shards' now). A shadow
        never holds the shard's loop when a take is due."""
        checked = [self.clock()]

        def over() -> bool:
            if not near and not self.idle():
                return True
            now = self.clock()
            if now - checked[0] >= 1.0:
                checked[0] = now
                self._read_lease()
            seen = self.seen
            return seen is None or seen.expires_at <= now

        return over

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
            log.warning("preflight failed", extra={"cluster": self.name, "error": str(exc)})
            return
        if problems:
            log.warning("preflight: the cluster lacks what the daemon needs",
                        extra={"cluster": self.name, "problems": problems})
        else:
            log.info("preflight ok", extra={"cluster": self.name})

    async def refresh_cluster_stats(self) -> None:
        if not self.lease.held:
            return
        try:
            stats = await self.adapter.cluster_stats()
        except DispatchError as exc:
            log.warning("cluster stats failed", extra={"cluster": self.name, "error": str(exc)})
            return
        self.reconciler.cluster_stats = stats
        self.metrics.cluster_running.set(stats.running)
        self.metrics.cluster_pending.set(stats.pending)
        if stats.estimated_wait_s is not None:
            self.metrics.queue_wait.labels(method="estimate").set(stats.estimated_wait_s)
        if stats.observed_wait_s is not None:
            self.metrics.queue_wait.labels(method="observed").set(stats.observed_wait_s)

    def wake(self) -> None:
        """Run the tick as soon as possible; during a tick, the next one follows it at
        once (the scheduler would skip a run while one is in flight)."""
        self._again = True
        if not self._tick_lock.locked() and not self.stopping:
            self.kick()

    def status(self, limit_s: float) -> tuple[bool, str]:
        """Readiness of this shard: it has tried its lease (before that the daemon does
        not know whether it leads: starting); a leader's last live read succeeded (a
        dead slurmctld shows within one tick) and it ticked within ``limit_s``; a standby
        is ready."""
        seen = self.seen
        who = f"holder={seen.holder} epoch={seen.epoch}" if seen else "no lease yet"
        if not self.tried and not self.lease.held:
            return False, "starting: the lease not tried yet"
        if not self.lease.held:
            return True, f"standby (not leader); {who}"
        if self.reconciler.owner.conflict is not None:
            return False, f"{self.reconciler.owner.conflict}; {who}"
        if self.reconciler.slurm_ok is False:  # (from the read, not the tick's end)
            return False, f"the cluster is unreachable: the last live read failed; {who}"
        last = self.reconciler.last_success
        if last is None or self.clock() - last > limit_s:
            return False, f"no successful tick recently; {who}"
        return True, f"ok; leader {who}"

    async def drain(self) -> None:
        """Stop ticking; wait for the tick in progress."""
        self.stopping = True
        async with self._tick_lock:
            pass


async def _take_alone(shard: Shard) -> bool:
    """A shard on its own: renew, or take when ``may_take`` says so."""
    if not shard.lease.held and not shard.may_take():
        return False
    return await asyncio.to_thread(shard.lease.try_acquire)


__all__ = ["AGAIN_LIMIT", "Shard", "lease_name"]
