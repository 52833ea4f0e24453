"""The one file where the simulator is wired to production code: the database and its
schema, the client, the leader lease, the reconciler, and the shard loop and lease keeper
that the daemon runs around them (rewritten here single-threaded, see below).

Production code being changed elsewhere should only ever need this file changed here:

* ``Database``: one deployment's SQLite file (a copy of a schema made once per process
  by ``Store.migrate``), the client (``controller.client.Client``: inserts, desired
  state) and plain SQL (a client deleting a row), and the reads the invariants need
  (rows, statuses, the lease row);
* ``Replica``: one daemon replica of a deployment: its own ``Store`` (engine), its own
  ``Lease`` (injected virtual ``clock`` and ``monotonic``), its own ``Reconciler``
  (``clock``, ``fence=lease``, ``budget_s`` as the daemon passes it), whose
  ``SchedulerPort`` is the model cluster (``tests.sim.cluster.Port``) called with the
  lease's ``guard`` as the adapter's write guard. ``start_tick`` is
  ``Shard._tick_guarded`` up to the tick and ``keep`` is ``Daemon._keep_once`` for the
  replica's one shard, both without threads (the daemon runs them through
  ``asyncio.to_thread`` and a keeper thread, which no seeded scheduler can order);
* every committed write of a replica to ``job_status``, ``submissions`` or ``events`` is
  reported with the lease epoch it was fenced with (SQLAlchemy engine events), for
  invariant (c);
* the tick's budget and timings run on the virtual monotonic clock (``timer``);
* ``pending_outcomes``: the reconciler's action outcomes waiting for a plan
  (``Reconciler.outcomes``).
"""

from __future__ import annotations

import asyncio
import atexit
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import event, select, text

from controller.client import Client
from controller.errors import DispatchError, ErrNotFound, LeaseLost
from controller.metrics import Metrics
from controller.model.job import Desired
from controller.reconcile.tick import Reconciler, TickReport, TickSettings
from controller.store.db import Store
from controller.store.lease import Lease, read_lease
from controller.store.models import JobStatus
from tests.sim.cluster import Cluster, Port
from tests.sim.sched import VirtualClock

TTL_S = 30.0
MARGIN_S = 5.0
BUDGET_S = TTL_S / 3  # what the daemon passes (controller/daemon/service.py)
LEASE = "controller"  # the single-cluster daemon's lease
# shorter windows than the defaults, so a seed's quiet phase settles in fewer ticks
SETTINGS = TickSettings(adopt_window_s=60, unknown_grace_s=120)
DOC = {"command": ["true"], "workdir": "/tmp"}

__all__ = ["BUDGET_S", "LEASE", "SETTINGS", "TTL_S", "Database", "LeaseRow", "Replica",
           "Status", "TickReport", "new_database"]

# the tables whose committed writes invariant (c) watches
_WATCHED = ("JOB_STATUS", "SUBMISSIONS", "EVENTS")
_PENDING_KEY = "sim_writes"

_template: list[Path] = []


def _schema() -> Path:
    """An empty database at the head revision, made once per process."""
    if not _template:
        where = Path(tempfile.mkdtemp(prefix="dispatch-sim-schema-", dir="/tmp"))
        atexit.register(shutil.rmtree, where, True)
        store = Store(f"sqlite:///{where / 'schema.db'}")
        store.migrate()
        store.dispose()
        _template.append(where / "schema.db")
    return _template[0]


def new_database(path: Path) -> str:
    """A fresh database file with the schema; its URL."""
    source = _schema()
    shutil.copyfile(source, path)
    wal = source.with_name(source.name + "-wal")
    if wal.exists():
        shutil.copyfile(wal, path.with_name(path.name + "-wal"))
    return f"sqlite:///{path}"


@dataclass(frozen=True, slots=True)
class Status:
    phase: str
    slurm_id: int | None
    slurm_submit: int | None


@dataclass(frozen=True, slots=True)
class LeaseRow:
    epoch: int
    holder: str
    expires_at: float


class Database:
    """One deployment's database, as its clients and the invariants see it."""

    def __init__(self, name: str, url: str, clock: VirtualClock) -> None:
        self.name = name
        self.url = url
        self.clock = clock
        self.client = Client(url, clock=clock.wall)

    def insert(self, job_id: str, *, desired: str = "run") -> None:
        self.client.submit(DOC, job_id=job_id, held=desired == "held")
        if desired == "stopped":
            self.client.set_desired(job_id, Desired.STOPPED)

    def delete(self, job_id: str) -> bool:
        """A client deletes the row by plain SQL (its status and submissions go with it)."""
        with self.client.store.transaction() as tx:
            result = tx.execute(text("DELETE FROM jobs WHERE id = :id"), {"id": job_id})
            return int(result.rowcount or 0) > 0  # type: ignore[attr-defined]

    def set_desired(self, job_id: str, desired: str) -> bool:
        try:
            self.client.set_desired(job_id, Desired(desired))
        except ErrNotFound:
            return False
        return True

    def rows(self) -> dict[str, str]:
        """Every job row: id -> desired, by id."""
        with self.client.store.transaction() as tx:
            found = tx.execute(text("SELECT id, desired FROM jobs ORDER BY id")).all()
        return {str(job_id): str(desired) for job_id, desired in found}

    def statuses(self) -> dict[str, Status]:
        with self.client.store.transaction() as tx:
            found = tx.execute(select(JobStatus.job_id, JobStatus.phase,
                                      JobStatus.slurm_job_id, JobStatus.slurm_submit)).all()
        return {str(job_id): Status(str(phase), slurm_id, submit)
                for job_id, phase, slurm_id, submit in found}

    def lease(self) -> LeaseRow | None:
        with self.client.store.transaction() as tx:
            info = read_lease(tx, LEASE)
        return None if info is None else LeaseRow(info.epoch, info.holder, info.expires_at)

    def close(self) -> None:
        self.client.close()


# a replica's report of one committed transaction: (replica, its writes to the watched
# tables as (table, the lease epoch held when it ran))
DbWrite = Callable[["Replica", list[tuple[str, "int | None"]]], None]


class Replica:
    """One daemon replica of one deployment (module docstring)."""

    def __init__(self, name: str, db: Database, cluster: Cluster, clock: VirtualClock, *,
                 order: Callable[[], int], on_db_write: DbWrite,
                 on_tick_end: Callable[[Replica, TickReport | None], None]) -> None:
        self.name = name
        self.deployment = db.name
        self.db = db
        self.clock = clock
        self.store = Store(db.url)
        self.lease = Lease(self.store, ttl_s=TTL_S, margin_s=MARGIN_S, holder=name,
                           clock=clock.wall, monotonic=clock.mono)
        self.reconciler = Reconciler(self.store, Port(cluster, self), metrics=Metrics(),
                                     clock=clock.wall, settings=SETTINGS, fence=self.lease,
                                     budget_s=BUDGET_S, timer=clock.mono)
        self.held_epoch: int | None = None  # the epoch the last tick ran under (Shard)
        self.tick_epoch: int | None = None  # the epoch the tick in flight began under
        self.task: asyncio.Future[None] | None = None
        self.ticks = 0  # ticks begun
        self.shadows = 0  # shadow ticks begun (as a standby)
        self.tick_began = 0  # when the last began, in the driver's order of events
        self.last: TickReport | None = None
        self.ending = ""  # how the last tick ended, when it did not return a report
        self._order = order  # the driver's order of events (``Scheduler.next_seq``)
        self._on_db_write = on_db_write
        self._on_tick_end = on_tick_end
        self._watch()

    # ------------------------------------------------------------ the model's caller

    def guard(self) -> None:
        """The adapter's write guard, as the daemon wires it (``lease.guard``)."""
        self.lease.guard()

    @property
    def epoch(self) -> int | None:
        return self.lease.epoch

    @property
    def ticking(self) -> bool:
        return self.task is not None and not self.task.done()

    def pending_outcomes(self) -> list[str]:
        """The job ids with an action outcome no plan has spent yet."""
        return sorted(self.reconciler.outcomes.ids())

    # ------------------------------------------------------------ Shard and keeper

    def start_tick(self) -> bool:
        """``Shard._tick_guarded`` up to the tick: renew or take the lease; stand down
        when it is not ours and start a shadow tick; keep only what shadow ticks learned
        when the epoch moved (``Reconciler.lead``); start the tick (a task: it runs as
        the scheduler lets it)."""
        if self.ticking:
            return False
        if not self.lease.try_acquire():
            if self.held_epoch is not None:
                self._stand_down()
            # a standby's shadow tick (``Shard``: read-only; a task, as a tick)
            self.shadows += 1
            self.task = asyncio.ensure_future(self._shadow())
            return False
        if self.lease.epoch != self.held_epoch:
            self.reconciler.lead()  # another leader may have acted meanwhile
            self.held_epoch = self.lease.epoch
        self.tick_epoch = self.lease.epoch
        self.ticks += 1
        self.tick_began = self._order()
        self.task = asyncio.ensure_future(self._tick())
        return True

    async def _shadow(self) -> None:
        """``Reconciler.shadow`` until the lease may be taken (``Shard._lease_free``)."""
        row = self.db.lease()
        report = await self.reconciler.shadow(
            until=lambda: row is None or row.expires_at <= self.clock.wall())
        self.ending = "shadow" if report.slurm_ok else f"shadow: {report.errors[:1]}"

    async def _tick(self) -> None:
        report: TickReport | None = None
        try:
            report = await self.reconciler.tick()
            self.ending = "ok"
        except LeaseLost as exc:  # Shard._tick
            self.ending = f"lease lost: {exc}"
            self.lease.drop()
            self._stand_down()
        except DispatchError as exc:
            self.ending = f"tick failed: {type(exc).__name__}: {exc}"
        except Exception as exc:  # Shard logs "tick crashed"; the invariants report it
            self.ending = f"tick crashed: {type(exc).__name__}: {exc}"
        finally:
            self.tick_epoch = None
        self.last = report
        self._on_tick_end(self, report)

    def keep(self) -> str:
        """``Daemon._keep_once`` for this replica's one shard: refresh the lease held;
        take it when it was held by someone and has expired."""
        said = ""
        if self.lease.held:
            self.lease.refresh()
            if self.lease.held:
                return f"keeps epoch {self.lease.epoch}"
            said = "learns the lease is lost; "
        row = self.db.lease()
        if row is not None and row.expires_at <= self.clock.wall() and \
                self.lease.try_acquire():
            return f"{said}takes the expired lease: epoch {self.lease.epoch}"
        return said.rstrip("; ")

    def shed(self) -> None:
        """Give the lease up between ticks (``Shard.give_up``)."""
        self.lease.release()
        self._stand_down()

    def _stand_down(self) -> None:
        self.held_epoch = None
        self.reconciler.forget()

    def close(self) -> None:
        self.store.dispose()

    # ------------------------------------------------------------ committed writes

    def _watch(self) -> None:
        engine = self.store.engine

        def executed(conn: Any, cursor: Any, statement: str, parameters: Any,
                     context: Any, executemany: bool) -> None:
            words = statement.lstrip().split(None, 3)
            if len(words) < 2:
                return
            verb = words[0].upper()
            table = (words[2] if verb == "INSERT" and len(words) > 2 else words[1]).upper()
            if verb in ("INSERT", "UPDATE", "DELETE") and table.strip('"') in _WATCHED:
                conn.info.setdefault(_PENDING_KEY, []).append(
                    (table.strip('"').lower(), self.lease.epoch))

        def committed(conn: Any) -> None:
            writes = conn.info.pop(_PENDING_KEY, None)
            if writes:
                self._on_db_write(self, writes)

        def rolled_back(conn: Any) -> None:
            conn.info.pop(_PENDING_KEY, None)

        event.listen(engine, "after_cursor_execute", executed)
        event.listen(engine, "commit", committed)
        event.listen(engine, "rollback", rolled_back)
