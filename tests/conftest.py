"""Shared fixtures: stores on real SQLite and real PostgreSQL, golden-file updating,
and the real local Slurm cluster started by ``scripts/slurm-up``."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from controller.store.db import Store

ROOT = Path(__file__).resolve().parent.parent
PG_ADMIN_URL = os.environ.get("DISPATCH_TEST_PG_URL",
                              "postgresql+psycopg://dispatch_test:dispatch_test@127.0.0.1:5432/dispatch_test")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", default=False,
                     help="rewrite golden files in testdata/ instead of comparing")


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--update-golden"):
        os.environ["UPDATE_GOLDEN"] = "1"


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[Store]:
    store = Store(f"sqlite:///{tmp_path / 'dispatch.db'}")
    store.migrate()
    yield store
    store.dispose()


def create_pg_database() -> str:
    """A fresh, empty database on the test PostgreSQL server; returns its URL."""
    name = "dispatch_test_" + uuid.uuid4().hex[:12]
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    return PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + name


def drop_pg_database(url: str) -> None:
    name = url.rsplit("/", 1)[1]
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture
def pg_url() -> Iterator[str]:
    url = create_pg_database()
    yield url
    drop_pg_database(url)


@pytest.fixture
def pg_store(pg_url: str) -> Iterator[Store]:
    store = Store(pg_url)
    store.migrate()
    yield store
    store.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def any_store(request: pytest.FixtureRequest) -> Store:
    name = "sqlite_store" if request.param == "sqlite" else "pg_store"
    store: Store = request.getfixturevalue(name)
    return store


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print the fault suite's figures (tests/test_fault_*.py) at the end of the run."""
    from tests.fault_support import format_table, session_rows

    rows = sorted(session_rows(), key=lambda r: r.fault)
    if rows:
        terminalreporter.write_sep("=", "fault suite summary")
        terminalreporter.write_line(format_table(rows))
