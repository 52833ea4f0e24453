"""PostgreSQL LISTEN/NOTIFY: wake the loop as soon as a client writes a job."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import psycopg
from sqlalchemy.engine import make_url

log = logging.getLogger("dispatch.notify")

CHANNEL = "dispatch_jobs"


def _libpq_url(url: str) -> str:
    u = make_url(url)
    return u.set(drivername="postgresql").render_as_string(hide_password=False)


async def listen(url: str, wake: Callable[[], None], *, stop: asyncio.Event,
                 retry_s: float = 5.0) -> None:
    """Call ``wake`` on every notification until ``stop`` is set; reconnect on errors."""
    dsn = _libpq_url(url)
    while not stop.is_set():
        try:
            conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
            async with conn:
                await conn.execute(f"LISTEN {CHANNEL}")
                wake()  # anything written while we were not listening
                await _deliver(conn, wake, stop)
        except (psycopg.Error, OSError) as exc:
            log.warning("listen connection failed; retrying", extra={"error": str(exc)})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=retry_s)


async def _deliver(conn: psycopg.AsyncConnection[object], wake: Callable[[], None],
                   stop: asyncio.Event) -> None:
    """Wait until the connection's socket has something to read (the event loop's own
    poll: an idle listener costs nothing, where psycopg's ``notifies()`` wakes ten times a
    second), then take every notification libpq has and call ``wake`` once per batch.
    A closed or broken connection raises (``psycopg.OperationalError``)."""
    loop = asyncio.get_running_loop()
    pgconn = conn.pgconn
    fd = pgconn.socket
    readable = asyncio.Event()
    loop.add_reader(fd, readable.set)
    stopping = asyncio.ensure_future(stop.wait())
    try:
        while not stop.is_set():
            waiting = asyncio.ensure_future(readable.wait())
            await asyncio.wait({waiting, stopping}, return_when=asyncio.FIRST_COMPLETED)
            waiting.cancel()
            readable.clear()
            pgconn.consume_input()  # (raises once the server has gone)
            if pgconn.status != psycopg.pq.ConnStatus.OK:
                raise psycopg.OperationalError("the listen connection is closed")
            notes = 0
            while pgconn.notifies() is not None:
                notes += 1
            if notes:
                wake()
    finally:
        loop.remove_reader(fd)
        stopping.cancel()
