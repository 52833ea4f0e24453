"""Shared fixtures: stores on real SQLite and real PostgreSQL, golden-file updating,
and the lanes of ``scripts/test``.

**Lanes.** ``scripts/test`` runs three pytest processes at once, each its tests in
collection order: ``--lane host`` (every test of the host's 22.05 cluster or of
PostgreSQL, whose server the fault suite restarts, and every test that is not known to
belong elsewhere), ``--lane chroot`` (the ``@matrix`` tests of the 24.11 and 26.05 chroot
clusters: their own slurmctld, slurmd, munged and sshd; no PostgreSQL) and ``--lane free``
(the tests of ``CLUSTER_FREE`` modules that use no PostgreSQL) and ``--lane gridengine``
(the ``GRIDENGINE`` modules: the real Grid Engine of ``scripts/gridengine-up``, which no
other lane uses; its tests that change the cell hold ``tests.ge_fixtures.cell_lock``). A
module not listed there
is in the host lane: a new test is serial unless someone says otherwise. The
``ALL_CLUSTERS`` modules (every cluster at once) run last in the chroot lane, holding the
host lane's lock: the host lane's Slurm modules wait for them, and they for it. Without
``--lane`` pytest runs everything, in order.

pytest-xdist's ``loadgroup`` was tried first (2026-12-01): with pytest 9.2 its group
suffix no longer reaches the node ids, so grouped tests were spread over both workers,
host tests ran beside each other and failed.
"""

from __future__ import annotations

import fcntl
import os
import signal
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
    parser.addoption("--lane", choices=LANES, default=None,
                     help="run only this lane's tests (tests/conftest.py; scripts/test)")
    # the interleaving simulator (tests/sim/test_sim.py)
    parser.addoption("--sim-seeds", type=int, default=SIM_SEEDS, metavar="N",
                     help=f"simulate seeds 0..N-1 (default {SIM_SEEDS})")
    parser.addoption("--sim-seed", type=int, default=None, metavar="S",
                     help="simulate seed S alone (the replay of a failing seed)")
    parser.addoption("--sim-steps", type=int, default=None, metavar="K",
                     help="steps per seed before its quiet phase (default: tests/sim/run.py)")
    parser.addoption("--sim-trace", action="store_true", default=False,
                     help="a failing seed prints every step, not the last ones")


def pytest_configure(config: pytest.Config) -> None:
    # A lane that ``scripts/test`` starts in the background inherits SIGINT ignored (a
    # non-interactive shell's background job), and so would every program a test starts:
    # a Snakemake sent Ctrl-C by a test went on running. The tests' processes get SIGINT's
    # default back (a handler is reset to the default at exec; an ignored signal is not).
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if config.getoption("--update-golden"):
        os.environ["UPDATE_GOLDEN"] = "1"


LANES = ("host", "chroot", "free", "gridengine")
SIM_SEEDS = 240
# the chroot clusters (tests.slurm_fixtures.matrix's slurm_version)
CHROOT_VERSIONS = frozenset({"24.11", "26.05"})
# Modules that touch no Slurm cluster, no sshd of the fault suite and no shared server
# but PostgreSQL (whose tests are kept in the host lane by ``_uses_postgres``).
CLUSTER_FREE = frozenset({
    "test_adapter_output_listing", "test_classify", "test_cli", "test_cli_database",
    "test_config", "test_daemon_wake", "test_deploy", "test_dialects", "test_helm",
    "test_hostlist", "test_lease", "test_metrics", "test_output_layout",
    "test_output_scripts_golden", "test_placement", "test_plan", "test_plan_defects",
    "test_plan_outcomes", "test_shards",
    "test_plan_outcomes_tick", "test_plan_recheck", "test_prometheus_rules",
    "test_runner_local", "test_schema", "test_script_exec", "test_script_golden",
    "test_script_refusals", "test_sluid", "test_store", "test_tick", "test_tick_burst",
    "test_tick_first_write", "test_tick_incremental", "test_tick_lost", "test_tick_memory",
    "test_tick_fresh", "test_tick_sweep", "test_tick_owned", "test_scripts", "test_sim",
    "test_adapter_owner", "test_change_feed", "test_warm_takeover", "test_bench_smoke",
    "test_ge_parse", "test_ge_script", "test_plan_listed_dead", "test_ge_verify",
    "test_ge_adapter_fake", "test_snakemake_mapping", "test_snakemake_journal",
    "test_client_views_by_ids", "test_snakemake_refusals", "test_snakemake_journal_resume",
})
# Modules of the real Grid Engine (scripts/gridengine-up): the gridengine lane. A module
# that also uses the host's Slurm cluster holds the host lane's lock (``ALL_CLUSTERS``'s
# rule, ``HOST_LANE_LOCK``).
GRIDENGINE = frozenset({"test_ge_adapter", "test_ge_daemon", "test_ge_faults",
                        "test_ge_mixed"})
_PG_FIXTURES = frozenset({"pg_url", "pg_store", "any_store"})
# Modules that use every cluster at once (the host's and both chroot clusters, and
# PostgreSQL): they run last in the chroot lane, once its own tests are done, holding the
# host lane's lock (``_host_lane_lock``) so that no host-lane module runs beside them.
ALL_CLUSTERS = frozenset({"test_e2e_clusters"})
# gridengine-lane modules that drive the host's Slurm cluster too: they hold its lock
BOTH_KINDS = frozenset({"test_ge_mixed"})
HOST_LANE_LOCK = Path("/tmp/dispatch-host-lane.lock")


def _module_name(item: pytest.Item) -> str:
    return item.module.__name__.rsplit(".", 1)[-1] if item.module is not None else ""


def _uses_postgres(item: pytest.Item) -> bool:
    return (bool(_PG_FIXTURES & set(getattr(item, "fixturenames", ())))
            or "postgres" in item.nodeid.lower())


def lane(item: pytest.Item) -> str:
    """The lane of ``item`` (module docstring)."""
    callspec = getattr(item, "callspec", None)
    version = callspec.params.get("slurm_version") if callspec is not None else None
    if _module_name(item) in ALL_CLUSTERS:
        return "chroot"
    if _module_name(item) in GRIDENGINE:
        return "gridengine"
    if version in CHROOT_VERSIONS and not _uses_postgres(item):
        return "chroot"
    if _module_name(item) in CLUSTER_FREE and not _uses_postgres(item):
        return "free"
    return "host"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    wanted = config.getoption("--lane")
    if wanted is None:
        return
    kept = [item for item in items if lane(item) == wanted]
    config.hook.pytest_deselected(items=[item for item in items if lane(item) != wanted])
    kept.sort(key=lambda item: _module_name(item) in ALL_CLUSTERS)  # stable: those last
    items[:] = kept


@pytest.fixture(scope="module", autouse=True)
def _host_lane_lock(request: pytest.FixtureRequest) -> Iterator[None]:
    """While a module that uses the host's cluster (or PostgreSQL's server) runs, no
    other such module runs in another lane: each holds ``HOST_LANE_LOCK``. Only the
    host lane's Slurm modules and the ``ALL_CLUSTERS`` modules take it; in one process
    (no ``--lane``) the modules run one after another anyway."""
    name = request.module.__name__.rsplit(".", 1)[-1]
    wanted = request.config.getoption("--lane")
    if wanted is None or name in CLUSTER_FREE or (
            wanted != "host" and name not in ALL_CLUSTERS | BOTH_KINDS):
        yield
        return
    with HOST_LANE_LOCK.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


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
