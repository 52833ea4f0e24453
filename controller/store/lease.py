"""The leader lease: one row per lease in ``leases`` (holder, epoch, expires_at), the same
on SQLite and PostgreSQL, and the fence every write of the leader goes through.

* **Acquire**: a compare-and-set UPDATE that succeeds only when the lease is free, expired
  or already ours; taking it from someone else moves ``epoch`` on by one.
* **Renew**: every tick (and whenever a long tick runs low), a compare-and-set UPDATE on
  (holder, epoch); a rowcount of 0 means the lease moved: this process stands down.
* **Fence** (``check``): the first statement of every transaction that changes a job's
  status, allocates a submission or records a ref is an UPDATE of the lease row on
  (holder, epoch); rowcount 0 raises ``LeaseLost`` and the whole transaction rolls back.
  The row lock it takes orders the commit before any takeover (PostgreSQL), and SQLite
  serialises writers anyway: a stale leader's transaction can never commit.
* **One lease per cluster**: a shard's lease row names its cluster; taking one is refused
  while another live lease (another name: a replica that orders ``[[clusters]]``
  differently, so it calls the default cluster's lease ``controller``) names the same
  cluster. On PostgreSQL an advisory lock per cluster orders two such takes.
* **Slurm writes** (``guard``): allowed only while the local monotonic clock is before
  the deadline the last successful renewal earned (its request's start + TTL) minus a
  safety margin. The deadline is measured from before the renewal was sent, so it ends
  no later than ``expires_at`` as another replica sees it (up to the clocks' skew, which
  the margin covers). A process stopped for longer than that (SIGSTOP, a stuck loop)
  wakes up past its deadline and writes nothing until it holds the lease again.

Times in the row are wall-clock milliseconds from the injected ``clock``; the deadline
uses the injected ``monotonic`` clock. A ``Lease`` may be used from several threads (the
daemon renews its leases from a thread of its own, so a busy event loop never lets one
lapse): its methods hold one lock.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy import insert, select, text, update
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session

from controller.errors import DispatchError, LeaseLost
from controller.store.db import Store
from controller.store.models import Lease as LeaseRow

log = logging.getLogger("dispatch.lease")

DEFAULT_LEASE = "controller"


def new_holder_id() -> str:
    """A holder id unique to this process start: host, pid and a random suffix."""
    return f"{socket.gethostname()}:{os.getpid()}:{os.urandom(4).hex()}"


@dataclass(frozen=True, slots=True)
class LeaseInfo:
    """The lease row as stored (for ``/readyz``, ``describe``, metrics)."""

    name: str
    holder: str
    epoch: int
    expires_at: float  # wall-clock seconds
    acquired_at: float


def _info(row: LeaseRow) -> LeaseInfo:
    return LeaseInfo(row.name, row.holder, row.epoch, row.expires_at_ms / 1000.0,
                     row.acquired_at_ms / 1000.0)


def read_lease(tx: Session, name: str = DEFAULT_LEASE) -> LeaseInfo | None:
    row = tx.execute(select(LeaseRow).where(LeaseRow.name == name)).scalar_one_or_none()
    return None if row is None else _info(row)


def read_leases(tx: Session) -> list[LeaseInfo]:
    """Every lease row (one per shard), by name."""
    return [_info(row) for row in tx.execute(select(LeaseRow).order_by(LeaseRow.name))
            .scalars()]


_F = TypeVar("_F", bound=Callable[..., Any])


def _locked(method: _F) -> _F:
    """Run a ``Lease`` method under the lease's lock (re-entrant: renew inside guard)."""
    @functools.wraps(method)
    def call(self: Lease, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return method(self, *args, **kwargs)
    return call  # type: ignore[return-value]


class Lease:
    """This process's view of one lease; thread-safe (module docstring)."""

    def __init__(self, store: Store, *, ttl_s: float, margin_s: float,
                 holder: str | None = None, name: str = DEFAULT_LEASE,
                 cluster: str | None = None,
                 clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        if ttl_s <= 0 or margin_s < 0 or margin_s >= ttl_s:
            raise ValueError("lease: need ttl_s > margin_s >= 0")
        self.store = store
        self.ttl_s = ttl_s
        self.margin_s = margin_s
        self.holder = holder or new_holder_id()
        self.name = name
        self.cluster = cluster  # the shard's cluster (None: no check across names)
        self._clock = clock
        self._monotonic = monotonic
        self.epoch: int | None = None  # the epoch we hold, None when not the holder
        self._deadline = float("-inf")  # monotonic: our lease surely holds until then
        self._lock = threading.RLock()

    # ------------------------------------------------------------ state

    @property
    def held(self) -> bool:
        return self.epoch is not None

    def remaining(self) -> float:
        """Seconds left before this process must stop writing to Slurm (<= 0: none)."""
        if self.epoch is None:
            return 0.0
        return self._deadline - self.margin_s - self._monotonic()

    # ------------------------------------------------------------ acquire / renew

    @_locked
    def renew(self) -> bool:
        """Extend the lease we hold (never take it anew: a tick in progress must not carry
        on under a new epoch). False, and ``epoch`` dropped, when it moved."""
        if self.epoch is None:
            return False
        sent = self._monotonic()
        expires_ms = int(self._clock() * 1000) + int(self.ttl_s * 1000)
        try:
            with self.store.transaction() as tx:
                renewed = self._renew(tx, expires_ms)
        except (DispatchError, SQLAlchemyError) as exc:
            log.warning("lease: could not renew", extra={"error": str(exc)[:300]})
            return self.remaining() > 0
        if not renewed:
            log.warning("lease lost: another daemon holds it now; standing down",
                        extra={"holder": self.holder, "epoch": self.epoch})
            self.drop()
            return False
        self._deadline = sent + self.ttl_s
        return True

    @_locked
    def try_acquire(self) -> bool:
        """Renew the lease if we hold it, else take it if it is free or expired.

        Returns whether we hold it now. A lost renewal drops ``epoch`` (the caller must
        forget what it knew: another leader may have acted). Database errors count as
        not holding it (the deadline still protects the Slurm side)."""
        sent = self._monotonic()
        now_ms = int(self._clock() * 1000)
        expires_ms = now_ms + int(self.ttl_s * 1000)
        try:
            with self.store.transaction() as tx:
                if self.epoch is not None and self._renew(tx, expires_ms):
                    self._deadline = sent + self.ttl_s
                    return True
                if self.epoch is not None:
                    log.warning("lease lost: another daemon holds it now; standing down",
                                extra={"holder": self.holder, "epoch": self.epoch})
                    self.epoch = None
                epoch = self._take(tx, now_ms, expires_ms)
        except (DispatchError, SQLAlchemyError) as exc:  # the database failed: see below
            log.warning("lease: database unavailable", extra={"error": str(exc)[:300]})
            if self.epoch is not None and self.remaining() <= 0:
                self.epoch = None
            return self.epoch is not None and self.remaining() > 0
        if epoch is None:
            return False
        self.epoch = epoch
        self._deadline = sent + self.ttl_s
        log.info("lease acquired", extra={"holder": self.holder, "epoch": epoch})
        return True

    def _renew(self, tx: Session, expires_ms: int) -> bool:
        result = tx.execute(update(LeaseRow).where(
            LeaseRow.name == self.name, LeaseRow.holder == self.holder,
            LeaseRow.epoch == self.epoch).values(expires_at_ms=expires_ms))
        return int(result.rowcount or 0) == 1  # type: ignore[attr-defined]

    def _led_elsewhere(self, tx: Session, now_ms: int) -> str | None:
        """The name of another live lease of our cluster held by another process."""
        if self.cluster is None:
            return None
        if tx.get_bind().dialect.name == "postgresql":  # two takes of one cluster: in turn
            tx.execute(text("SELECT pg_advisory_xact_lock(:key)"),
                       {"key": zlib.crc32(f"dispatch-lease:{self.cluster}".encode())})
        return tx.execute(select(LeaseRow.name).where(
            LeaseRow.cluster == self.cluster, LeaseRow.name != self.name,
            LeaseRow.holder != self.holder, LeaseRow.expires_at_ms > now_ms)).scalar()

    def _take(self, tx: Session, now_ms: int, expires_ms: int) -> int | None:
        other = self._led_elsewhere(tx, now_ms)
        if other is not None:
            log.warning("cluster led under another lease name: the replicas' [[clusters]] "
                        "differ; not taking it", extra={"cluster": self.cluster,
                                                         "lease": self.name, "other": other})
            return None
        row = tx.execute(select(LeaseRow.epoch, LeaseRow.holder, LeaseRow.expires_at_ms)
                         .where(LeaseRow.name == self.name)).first()
        if row is None:
            try:
                with tx.begin_nested():
                    tx.execute(insert(LeaseRow).values(
                        name=self.name, holder=self.holder, epoch=1, expires_at_ms=expires_ms,
                        acquired_at_ms=now_ms, cluster=self.cluster))
            except IntegrityError:
                return None  # another replica created it first
            return 1
        epoch, holder, expires = row
        if holder != self.holder and expires > now_ms:
            return None
        result = tx.execute(update(LeaseRow).where(
            LeaseRow.name == self.name, LeaseRow.epoch == epoch,
            LeaseRow.holder == holder).values(
                holder=self.holder, epoch=epoch + 1, expires_at_ms=expires_ms,
                acquired_at_ms=now_ms, cluster=self.cluster))
        if int(result.rowcount or 0) != 1:  # type: ignore[attr-defined]
            return None  # someone else moved it between our read and our write
        return int(epoch) + 1

    @_locked
    def release(self) -> None:
        """Give the lease up (shutdown): expire it at once so a standby takes over."""
        if self.epoch is None:
            return
        try:
            with self.store.transaction() as tx:
                tx.execute(update(LeaseRow).where(
                    LeaseRow.name == self.name, LeaseRow.holder == self.holder,
                    LeaseRow.epoch == self.epoch).values(expires_at_ms=0))
        except (DispatchError, SQLAlchemyError) as exc:  # it expires by itself anyway
            log.warning("lease: could not release", extra={"error": str(exc)[:300]})
        self.epoch = None
        self._deadline = float("-inf")

    @_locked
    def drop(self) -> None:
        """Forget the lease locally (after ``LeaseLost``): no more writes until acquired."""
        self.epoch = None
        self._deadline = float("-inf")

    # ------------------------------------------------------------ the fence

    @_locked
    def check(self, tx: Session) -> None:
        """Fence a write transaction: its first statement. ``LeaseLost`` if the lease moved
        (the caller's ``transaction()`` rolls everything back)."""
        if self.epoch is None:
            raise LeaseLost("not the lease holder")
        result = tx.execute(update(LeaseRow).where(
            LeaseRow.name == self.name, LeaseRow.holder == self.holder,
            LeaseRow.epoch == self.epoch).values(epoch=LeaseRow.epoch))
        if int(result.rowcount or 0) != 1:  # type: ignore[attr-defined]
            held = self.epoch
            self.drop()
            raise LeaseLost(f"lease epoch {held} is no longer ours")

    @_locked
    def refresh(self) -> None:
        """Renew when under half the TTL is left (a long tick between its writes); a
        failed renewal is left to ``check`` and ``guard`` to act on."""
        if self.epoch is not None and self.remaining() < self.ttl_s / 2:
            self.renew()

    @_locked
    def guard(self) -> None:
        """Before a Slurm write: ``LeaseLost`` unless the lease surely holds, with margin.
        A tick that ran long renews here first (one small transaction)."""
        if self.epoch is None:
            raise LeaseLost("not the lease holder")
        if self.remaining() < self.ttl_s / 2 and not self.renew():
            self.drop()
            raise LeaseLost("the lease could not be renewed in time")
        if self.remaining() <= 0:
            held = self.epoch
            self.drop()  # we cannot know it still holds: act as if lost (safe either way)
            raise LeaseLost(f"too close to the deadline of lease epoch {held} to write")
