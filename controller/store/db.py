"""Engine creation, transactions and schema migration (Alembic) for SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, inspect, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError, OperationalError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from controller.errors import ErrConflict, ErrInvalid, TransientError
from controller.model.setting import redact_url

_PACKAGE_DIR = Path(__file__).resolve().parent.parent


def migrations_dir() -> Path:
    """The Alembic script directory: the repo's ``migrations/`` or the installed copy."""
    for candidate in (_PACKAGE_DIR.parent / "migrations", _PACKAGE_DIR / "_migrations"):
        if (candidate / "env.py").exists():
            return candidate
    raise FileNotFoundError("alembic migrations directory not found")


def normalise_url(url: str) -> str:
    """Use psycopg 3 for plain ``postgresql://`` URLs."""
    if url.startswith(("postgresql://", "postgres://")):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA busy_timeout=10000")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.close()


def make_engine(url: str, *, idle_tx_timeout_s: float | None = None) -> Engine:
    """``idle_tx_timeout_s`` (PostgreSQL): the server ends a session that sits inside a
    transaction that long (``idle_in_transaction_session_timeout``), releasing its locks. A
    daemon never waits inside a transaction, so only a stopped or hung process meets it:
    its row lock on the lease must not keep a standby from taking over."""
    url = normalise_url(url)
    try:
        parsed = make_url(url)
    except Exception as exc:
        raise ErrInvalid(f"not a database URL: {redact_url(url)}", field="database.url") from exc
    if parsed.get_backend_name() == "sqlite":
        engine = create_engine(url, connect_args={"timeout": 30})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    connect_args: dict[str, Any] = {"connect_timeout": 10}
    if idle_tx_timeout_s is not None and parsed.get_backend_name() == "postgresql":
        connect_args["options"] = (
            f"-c idle_in_transaction_session_timeout={max(1, int(idle_tx_timeout_s * 1000))}")
    return create_engine(url, pool_pre_ping=True, pool_size=5, max_overflow=5,
                         connect_args=connect_args)


def unavailable(exc: OperationalError) -> TransientError:
    """The driver's complaint (server down, file not writable) as one line."""
    reason = (str(exc.orig).strip().splitlines() or [type(exc.orig).__name__])[0]
    return TransientError(f"database unavailable: {reason[:200]}")


class Store:
    """Owns the engine and hands out transactions; the caller owns each transaction."""

    def __init__(self, url: str, *, idle_tx_timeout_s: float | None = None) -> None:
        self.url = normalise_url(url)
        self.engine = make_engine(self.url, idle_tx_timeout_s=idle_tx_timeout_s)
        self.dialect = self.engine.dialect.name
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)

    @contextmanager
    def transaction(self) -> Iterator[Session]:
        """A session inside one transaction: committed on success, rolled back on error.

        Database connectivity failures surface as TransientError; a row another writer
        inserted first (a unique key) as ErrConflict.
        """
        try:
            with self._sessions() as session, session.begin():
                yield session
        except OperationalError as exc:
            raise unavailable(exc) from exc
        except IntegrityError as exc:
            raise ErrConflict(f"another writer got there first: {exc.orig}") from exc

    def ping(self) -> bool:
        try:
            with self.engine.connect() as conn:
                conn.execute(text("SELECT 1"))
        except SQLAlchemyError:
            return False
        return True

    def migrate(self, revision: str = "head") -> None:
        """Upgrade the schema to ``revision`` with Alembic."""
        from alembic import command

        try:
            command.upgrade(self.alembic_config(), revision)
        except OperationalError as exc:
            raise unavailable(exc) from exc

    def alembic_config(self) -> Any:
        from alembic.config import Config as AlembicConfig

        cfg = AlembicConfig()
        cfg.set_main_option("script_location", str(migrations_dir()))
        cfg.attributes["engine"] = self.engine
        return cfg

    def current_revision(self) -> str | None:
        """The schema's Alembic revision; None before the first migration."""
        try:
            with self.engine.connect() as conn:
                if not inspect(conn).has_table("alembic_version"):
                    return None
                row = conn.execute(text("SELECT version_num FROM alembic_version")).first()
                return None if row is None else str(row[0])
        except OperationalError as exc:
            raise unavailable(exc) from exc

    def dispose(self) -> None:
        self.engine.dispose()
