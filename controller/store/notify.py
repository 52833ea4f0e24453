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
                while not stop.is_set():
                    async for _ in conn.notifies(timeout=1.0):
                        wake()
        except (psycopg.Error, OSError) as exc:
            log.warning("listen connection failed; retrying", extra={"error": str(exc)})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=retry_s)
