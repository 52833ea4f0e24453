"""PostgreSQL LISTEN/NOTIFY (``controller.store.notify.listen``): a committed job row
wakes the listener; a listener whose connection the server ends reconnects and wakes
again; ``stop`` ends it."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable

import pytest
from sqlalchemy import text

from controller.store import notify
from controller.store.db import Store

pytestmark = pytest.mark.postgres

DOC = json.dumps({"command": ["true"], "workdir": "/tmp"})


async def until(what: str, check: Callable[[], bool], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        await asyncio.sleep(0.02)


def insert(store: Store, job_id: str) -> None:
    with store.engine.begin() as conn:
        conn.execute(text("INSERT INTO jobs (id, spec) VALUES (:id, :spec)"),
                     {"id": job_id, "spec": DOC})


def listening(store: Store) -> list[int]:
    with store.engine.connect() as conn:
        return list(conn.execute(text(
            "SELECT pid FROM pg_stat_activity WHERE query = :q AND pid <> pg_backend_pid()"),
            {"q": f"LISTEN {notify.CHANNEL}"}).scalars())


async def test_a_commit_wakes_and_a_lost_connection_is_listened_again(
        pg_store: Store) -> None:
    wakes = [0]

    def wake() -> None:
        wakes[0] += 1

    stop = asyncio.Event()
    task = asyncio.create_task(notify.listen(pg_store.url, wake, stop=stop, retry_s=0.1))
    try:
        await until("the first wake (after LISTEN)", lambda: wakes[0] == 1)
        await until("the listener's session", lambda: len(listening(pg_store)) == 1)
        insert(pg_store, "01JZ8Q2N5V000000000000000A")
        await until("a wake by the commit", lambda: wakes[0] == 2)
        # nothing committed: no wake (a wake per notification batch, none without)
        with pg_store.engine.begin() as conn:
            conn.execute(text("SELECT 1"))
        insert(pg_store, "01JZ8Q2N5V000000000000000B")
        await until("a wake by the second commit", lambda: wakes[0] == 3)
        # the server ends the listener's session: it reconnects, LISTENs and wakes
        (pid,) = listening(pg_store)
        with pg_store.engine.begin() as conn:
            conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
        await until("the wake after listening again", lambda: wakes[0] == 4)
        await until("a new listener session", lambda: listening(pg_store) not in ([], [pid]))
        insert(pg_store, "01JZ8Q2N5V000000000000000C")
        await until("a wake by a commit after the reconnect", lambda: wakes[0] == 5)
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=10)
    assert task.done() and task.exception() is None
    await until("the listener's session gone", lambda: listening(pg_store) == [])
