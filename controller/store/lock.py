"""Leader election: a PostgreSQL advisory lock, or a file lock beside a SQLite database.

Exactly one daemon per database acts; the others stand by and retry each tick.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from pathlib import Path
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError

from controller.store.db import Store

log = logging.getLogger("dispatch.leader")

ADVISORY_KEY = 0x64697370  # "disp"


class LeaderLock:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._conn: Any = None
        self._fd: int | None = None
        self.held = False

    def _sqlite_path(self) -> Path | None:
        db = make_url(self.store.url).database
        if not db or db == ":memory:":
            return None
        return Path(db + ".leader")

    def try_acquire(self) -> bool:
        """Take the lock if free; confirm it is still ours if held. Never blocks."""
        if self.store.dialect == "postgresql":
            return self._pg()
        return self._file()

    def _pg(self) -> bool:
        if self._conn is not None:
            try:
                self._conn.execute(text("SELECT 1"))
                return True
            except SQLAlchemyError:
                log.warning("leader connection lost; leadership dropped")
                self._drop_pg()
        try:
            conn = self.store.engine.connect()
            got = bool(conn.execute(text("SELECT pg_try_advisory_lock(:k)"),
                                    {"k": ADVISORY_KEY}).scalar())
            conn.commit()
        except SQLAlchemyError:
            self.held = False
            return False
        if not got:
            conn.close()
            self.held = False
            return False
        self._conn = conn
        self.held = True
        return True

    def _drop_pg(self) -> None:
        with contextlib.suppress(SQLAlchemyError):
            self._conn.invalidate()
        self._conn = None
        self.held = False

    def _file(self) -> bool:
        if self._fd is not None:
            return True
        path = self._sqlite_path()
        if path is None:
            self.held = True
            return True
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            self.held = False
            return False
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        self.held = True
        return True

    def release(self) -> None:
        if self._conn is not None:
            try:
                self._conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": ADVISORY_KEY})
                self._conn.close()
            except SQLAlchemyError:
                pass
            self._conn = None
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
        self.held = False
