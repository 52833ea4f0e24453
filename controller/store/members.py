"""Replica membership: how many daemons share the shards, from one row each in ``replicas``.

Every daemon renews its row (``heartbeat``, from its keeper thread every quarter of the
lease TTL), with the lease TTL; the rows not expired are the live replicas, but for one
whose row names shards and none of whose leases is live (``_leads``). A daemon
takes at most ``fair_share`` of the shards (one per configured cluster), so replicas
spread the clusters among themselves and a replica that dies (its row and its shards'
leases expire) leaves its shards to the others within a TTL. Rows expired for a long
time are deleted by whoever renews next. Times are wall-clock milliseconds from the
injected clock, like the leases'.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sqlalchemy import ColumnElement, delete, exists, func, insert, or_, select, update
from sqlalchemy.exc import SQLAlchemyError

from controller.errors import DispatchError
from controller.store.db import Store
from controller.store.models import Lease as LeaseRow
from controller.store.models import Replica

log = logging.getLogger("dispatch.members")

_FORGET_AFTER_TTLS = 10  # an expired row is deleted this many TTLs after it expired


@dataclass(frozen=True, slots=True)
class ReplicaInfo:
    holder: str
    expires_at: float
    shards: tuple[str, ...]


def _leads(now_ms: int) -> ColumnElement[bool]:
    """A live replica's row says it holds no shard, or one of its leases is still live:
    a replica every lease of which has expired is gone (it died or stalled past its TTL)
    even while its row, renewed on another round than its leases, has time left -- so a
    survivor's fair share grows as the dead replica's leases expire, not up to a keeper
    period after (bench/shards: a 2-replica move took 14.4 s past the leases' expiry)."""
    return or_(Replica.shards == "",
               exists().where(LeaseRow.holder == Replica.holder,
                              LeaseRow.expires_at_ms > now_ms))


def fair_share(shards: int, replicas: int) -> int:
    """The most shards one replica takes: with every replica at it, every shard has one
    (10 shards over 4 replicas: at most 3 each, so 3/3/3/1 is a fair spread too)."""
    return math.ceil(shards / max(1, replicas)) if shards else 0


class Membership:
    """This daemon's row in ``replicas``: renewed from one thread at a time; ``live`` (the
    count it last saw) may be read from any."""

    def __init__(self, store: Store, *, holder: str, ttl_s: float,
                 clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.holder = holder
        self.ttl_s = ttl_s
        self._clock = clock
        self.live = 1  # replicas seen live at the last heartbeat (this one included)

    def heartbeat(self, shards: Sequence[str] = ()) -> int:
        """Renew this replica's row (with the shards it holds) and count the live rows.
        A database error keeps the last count."""
        now_ms = int(self._clock() * 1000)
        expires_ms = now_ms + int(self.ttl_s * 1000)
        held = ",".join(shards)
        try:
            with self.store.transaction() as tx:
                renewed = tx.execute(update(Replica).where(Replica.holder == self.holder)
                                     .values(expires_at_ms=expires_ms, shards=held))
                if int(renewed.rowcount or 0) == 0:  # type: ignore[attr-defined]
                    tx.execute(insert(Replica).values(holder=self.holder,
                                                      expires_at_ms=expires_ms,
                                                      started_at_ms=now_ms, shards=held))
                forget = now_ms - int(_FORGET_AFTER_TTLS * self.ttl_s * 1000)
                tx.execute(delete(Replica).where(Replica.expires_at_ms < forget))
                live = tx.scalar(select(func.count()).select_from(Replica)
                                 .where(Replica.expires_at_ms > now_ms, _leads(now_ms)))
        except (DispatchError, SQLAlchemyError) as exc:
            log.warning("membership: database unavailable", extra={"error": str(exc)[:300]})
            return self.live
        self.live = max(1, int(live or 0))
        return self.live

    def leave(self) -> None:
        """Delete this replica's row (shutdown): the others count one fewer at once."""
        try:
            with self.store.transaction() as tx:
                tx.execute(delete(Replica).where(Replica.holder == self.holder))
        except (DispatchError, SQLAlchemyError) as exc:  # it expires by itself anyway
            log.warning("membership: could not leave", extra={"error": str(exc)[:300]})


def list_replicas(store: Store, *, clock: Callable[[], float] = time.time,
                  ) -> list[ReplicaInfo]:
    """The live replicas and the shards each said it holds (``dispatchctl`` and tests)."""
    now_ms = int(clock() * 1000)
    with store.transaction() as tx:
        rows = tx.execute(select(Replica.holder, Replica.expires_at_ms, Replica.shards)
                          .where(Replica.expires_at_ms > now_ms)
                          .order_by(Replica.holder)).all()
    return [ReplicaInfo(holder, expires / 1000.0, tuple(s for s in shards.split(",") if s))
            for holder, expires, shards in rows]


__all__ = ["Membership", "ReplicaInfo", "fair_share", "list_replicas"]
