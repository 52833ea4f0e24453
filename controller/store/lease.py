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
* **A tick's own epoch** (``pin``): a tick captures the epoch it starts under, and its
  fence (``Pinned``) passes only while the lease still holds *that* epoch. A lease lost
  and taken again by this very process (its keeper thread, after a stall) carries a new
  epoch: a tick begun under the old one writes nothing more, neither to the database
  (the check's UPDATE names the captured epoch) nor to Slurm, even though the process
  holds the lease again. Plans made from rows read before another leader acted can
  never be committed under the new epoch.
* **Slurm writes** (``guard``): allowed only while the local monotonic clock is before
  the deadline the last successful renewal earned (its request's start + TTL) minus a
  safety margin. The deadline is measured from before the renewal was sent, so it ends
  no later than ``expires_at`` as another replica sees it (up to the clocks' skew, which
  the margin covers). A process stopped for longer than that (SIGSTOP, a stuck loop)
  wakes up past its deadline and writes nothing until it holds the lease again.

Times in the row are wall-clock milliseconds from the injected ``clock``; the deadline
uses the injected ``monotonic`` clock. A ``Lease`` may be used from several threads (the
daemon renews its leases from a thread of its own, so a busy event loop never lets one
lapse): a round trip lock serialises renewals, takes and releases, and a state lock,
never held across a round trip, guards the epoch and deadline.
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
    """Run a ``Lease`` method under the lease's state lock (held briefly, never across a
    database round trip)."""
    @functools.wraps(method)
    def call(self: Lease, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return method(self, *args, **kwargs)
    return call  # type: ignore[return-value]


def _serial(method: _F) -> _F:
    """Run a ``Lease`` method that makes a database round trip under the lease's round
    trip lock: one renewal, take or release at a time (re-entrant: renew inside guard)."""
    @functools.wraps(method)
    def call(self: Lease, *args: Any, **kwargs: Any) -> Any:
        with self._io:
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
        self._pinned: int | None = None  # the epoch the last tick began with (``pin``)
        self._lock = threading.RLock()  # the state: epoch and deadline
        self._io = threading.RLock()  # the round trips: renew, take, release

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

    @_serial
    def renew(self) -> bool:
        """Extend the lease we hold (never take it anew: a tick in progress must not carry
        on under a new epoch). False, and ``epoch`` dropped, when it moved. The database
        round trip runs without the state lock: a tick's ``guard`` never waits on it."""
        epoch = self.epoch
        if epoch is None:
            return False
        sent = self._monotonic()
        expires_ms = int(self._clock() * 1000) + int(self.ttl_s * 1000)
        try:
            with self.store.transaction() as tx:
                renewed = self._renew(tx, expires_ms, epoch)
        except (DispatchError, SQLAlchemyError) as exc:
            log.warning("lease: could not renew", extra={"error": str(exc)[:300]})
            return self.remaining() > 0
        with self._lock:
            if self.epoch != epoch:  # dropped meanwhile (a tick's LeaseLost): stays so
                return False
            if not renewed:
                log.warning("lease lost: another daemon holds it now; standing down",
                            extra={"holder": self.holder, "epoch": epoch})
                self.drop()
                return False
            self._deadline = sent + self.ttl_s
        return True

    @_serial
    def try_acquire(self) -> bool:
        """Renew the lease if we hold it, else take it if it is free or expired.

        Returns whether we hold it now. A lost renewal drops ``epoch`` (the caller must
        forget what it knew: another leader may have acted). Database errors count as
        not holding it (the deadline still protects the Slurm side). A lease taken anew
        has a new epoch: a tick begun under the old one stays fenced out (``Pinned``)."""
        epoch = self.epoch
        sent = self._monotonic()
        now_ms = int(self._clock() * 1000)
        expires_ms = now_ms + int(self.ttl_s * 1000)
        taken: int | None = None
        try:
            with self.store.transaction() as tx:
                if epoch is not None and self._renew(tx, expires_ms, epoch):
                    with self._lock:
                        if self.epoch == epoch:
                            self._deadline = sent + self.ttl_s
                            return True
                        # dropped meanwhile (a tick's LeaseLost): taken anew below
                elif epoch is not None:
                    log.warning("lease lost: another daemon holds it now; standing down",
                                extra={"holder": self.holder, "epoch": epoch})
                    self._drop_at(epoch)
                taken = self._take(tx, now_ms, expires_ms)
        except (DispatchError, SQLAlchemyError) as exc:  # the database failed: see below
            log.warning("lease: database unavailable", extra={"error": str(exc)[:300]})
            with self._lock:
                if self.epoch is not None and self.remaining() <= 0:
                    self.drop()
                return self.epoch is not None and self.remaining() > 0
        if taken is None:
            return False
        with self._lock:
            self.epoch = taken
            self._deadline = sent + self.ttl_s
        log.info("lease acquired", extra={"holder": self.holder, "epoch": taken})
        return True

    def _renew(self, tx: Session, expires_ms: int, epoch: int) -> bool:
        result = tx.execute(update(LeaseRow).where(
            LeaseRow.name == self.name, LeaseRow.holder == self.holder,
            LeaseRow.epoch == epoch).values(expires_at_ms=expires_ms))
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

    @_serial
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
        self.drop()

    @_locked
    def drop(self) -> None:
        """Forget the lease locally (after ``LeaseLost``): no more writes until acquired."""
        self.epoch = None
        self._deadline = float("-inf")

    # ------------------------------------------------------------ the fence

    def pin(self) -> Pinned:
        """The fence of one tick: this lease at the epoch held now (module docstring).
        It is also the epoch ``guard`` checks from now on -- the adapter's write guard,
        the last moment before a Slurm command -- until the next tick pins anew."""
        pinned = Pinned(self, self.epoch)
        self._pinned = pinned.epoch
        return pinned

    def check(self, tx: Session) -> None:
        """Fence a write transaction at the epoch held now (``Pinned.check``)."""
        Pinned(self, self.epoch).check(tx)

    def _check_at(self, tx: Session, epoch: int | None) -> None:
        """The fence's statement for ``epoch``: an UPDATE of our row at that epoch; a
        rowcount of 0 means it moved (dropped here, if we still thought it ours)."""
        if epoch is None or self.epoch != epoch:
            raise LeaseLost(f"lease epoch {epoch} is no longer ours")
        result = tx.execute(update(LeaseRow).where(
            LeaseRow.name == self.name, LeaseRow.holder == self.holder,
            LeaseRow.epoch == epoch).values(epoch=LeaseRow.epoch))
        if int(result.rowcount or 0) != 1:  # type: ignore[attr-defined]
            with self._lock:
                if self.epoch == epoch:
                    self.drop()
            raise LeaseLost(f"lease epoch {epoch} is no longer ours")

    def refresh(self) -> None:
        """Renew when under half the TTL is left (a long tick between its writes); a
        failed renewal is left to ``check`` and ``guard`` to act on."""
        if self.epoch is not None and self.remaining() < self.ttl_s / 2:
            self.renew()

    def guard(self) -> None:
        """Before a Slurm write (the adapter's write guard): at the epoch the tick in
        progress pinned (``pin``), else at the epoch held now (``Pinned.guard``). A lease
        taken again behind a tick never lets that tick's last-moment writes through."""
        self._guard_at(self._pinned if self._pinned is not None else self.epoch)

    def _guard_at(self, epoch: int | None) -> None:
        """``LeaseLost`` unless the lease surely holds ``epoch``, with margin. Reads two
        fields without the lock (the keeper's renewal holds it across a database round
        trip); a tick that ran long renews here first (one small transaction)."""
        if epoch is None or self.epoch != epoch:
            raise LeaseLost(f"lease epoch {epoch} is no longer ours")
        if self.remaining() < self.ttl_s / 2 and not self.renew():
            self._drop_at(epoch)
            raise LeaseLost("the lease could not be renewed in time")
        if self.epoch != epoch:
            raise LeaseLost(f"lease epoch {epoch} is no longer ours")
        if self.remaining() <= 0:
            self._drop_at(epoch)  # we cannot know it still holds: act as if lost
            raise LeaseLost(f"too close to the deadline of lease epoch {epoch} to write")

    def _drop_at(self, epoch: int) -> None:
        with self._lock:
            if self.epoch == epoch:
                self.drop()


class Pinned:
    """A lease at one epoch: the fence of one tick (``Lease.pin``). ``check`` and
    ``guard`` pass only while the lease still holds ``epoch``: never for an epoch taken
    again behind the tick."""

    def __init__(self, lease: Lease, epoch: int | None) -> None:
        self.lease = lease
        self.epoch = epoch

    def pin(self) -> Pinned:
        return self

    def check(self, tx: Session) -> None:
        """Fence a write transaction: its first statement. ``LeaseLost`` unless the lease
        still holds this epoch (the caller's ``transaction()`` rolls everything back)."""
        self.lease._check_at(tx, self.epoch)

    def guard(self) -> None:
        """Before a Slurm write: ``LeaseLost`` unless the lease surely holds this epoch,
        with margin."""
        self.lease._guard_at(self.epoch)

    def refresh(self) -> None:
        """Renew when under half the TTL is left, while this epoch is held."""
        if self.epoch is not None and self.lease.epoch == self.epoch:
            self.lease.refresh()
