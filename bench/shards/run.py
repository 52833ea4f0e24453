#!/usr/bin/env python3
"""bench/shards: many clusters shared by 1, 2 and 4 daemon replicas on PostgreSQL -- the CPU
of a tick per replica, and how long a shard takes to move when its replica is killed
(issue 12, deliverable 5).

Run: .venv/bin/python bench/shards/run.py [--clusters 10] [--jobs 10000] [--replicas 1,2,4]
                                          [--interval 2] [--ttl 10] [--window 10] [--quick]

``--quick`` is a smoke run: 3 clusters x 1000 jobs, replicas 1,2, a window of 4 intervals.
The PostgreSQL server is the one of ``DISPATCH_TEST_PG_URL`` (an admin URL, as the tests
use: ``export DISPATCH_TEST_PG_URL=$(scripts/postgres-up | tail -n1)``), else the one
``scripts/postgres-up`` starts; a fresh database is created on it and dropped at the end
(``--keep-db`` keeps it). No Slurm is used.

- setup (its own process): the database, migrated; ``--clusters`` clusters ``c0``..``cN``
  with ``--jobs`` jobs each, written in bulk: the job document names its cluster
  (``"cluster": "c3"``), its status row is placed there (``job_status.cluster``) with a
  current submission and its ref (Slurm id, submit time), and a ``submissions`` row
  records that sbatch. Four jobs in five run, the fifth pends. Then one tick of a
  reconciler per cluster (as bench/tick's ``settle``) over that cluster's synthesised
  ``squeue``, so every status is what the planner writes and later ticks are steady;
- each replica is a separate OS process running the real ``Daemon.run()`` (its
  APScheduler, membership heartbeat, NOTIFY listener and HTTP endpoint) with one shard
  per cluster, each shard a real ``SlurmAdapter`` over a fake runner that answers the
  job read with that cluster's synthesised squeue text (bench/tick's rows, in that
  cluster's name, so parsing and identity checks run for real), and a lease named as
  ``controller.wiring`` names it. Every ``--interval`` seconds a replica prints a JSON
  line on stdout: its process CPU seconds (``time.process_time``: every thread), the
  shards it holds, each shard's tick count and the wall time of each tick since the
  last line;
- for each replica count: start the replicas together, wait until the shards are
  spread (``replicas.shards``: every cluster held once, by a live replica holding at
  most ``ceil(clusters / replicas)``, and the ``leases`` rows agree), then until every
  held shard has ticked 3 times since (the first tick of a new holder loads and plans
  every job), then measure ``--window`` intervals: CPU seconds per interval per replica
  (each held shard ticks once an interval: "CPU per tick"), CPU per shard tick, the
  wall time of a shard's tick, and whether any lease moved meanwhile (it should not);
- with 2 or more replicas, SIGKILL the replica holding the most shards and poll
  ``leases`` until each of its shards is held by a survivor (holder changed, not
  expired): the move time, from the kill, next to ``lease_ttl_s + tick_interval_s``
  (the lease runs out up to a TTL after the victim's last renewal; a survivor's next
  tick, at most an interval later, takes it); then until the leases are spread over
  the survivors again (none above its new fair share). The survivors are then stopped
  with SIGTERM (they release their leases) before the next replica count starts.
- the replicas' logs tell how the shards got there: shards stood down from (a lease
  that expired or moved under its holder) and shards shed above the fair share.

Figures are printed with ratios against the 1-replica CPU per interval of the same run
(measured even when 1 is not in --replicas): these machines are shared and noisy. The
PostgreSQL server's own CPU is not in any replica's figure.
"""

from __future__ import annotations

import argparse
import asyncio
import calendar
import contextlib
import itertools
import json
import math
import os
import resource
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT))

from sqlalchemy import create_engine, insert, select, text  # noqa: E402

from bench.fakes import Markers  # noqa: E402
from controller.config import Config, parse_config  # noqa: E402
from controller.daemon.service import Daemon, build_shard  # noqa: E402
from controller.daemon.shard import lease_name  # noqa: E402
from controller.metrics import Metrics  # noqa: E402
from controller.reconcile.placement import Clusters  # noqa: E402
from controller.reconcile.settings import ReconcileConfig  # noqa: E402
from controller.reconcile.tick import Reconciler, TickReport  # noqa: E402
from controller.runner.base import CommandResult  # noqa: E402
from controller.slurm import dialects  # noqa: E402
from controller.slurm.adapter import SlurmAdapter  # noqa: E402
from controller.slurm.capabilities import IDENTITY_CLASSIC, Capabilities  # noqa: E402
from controller.slurm.script import StartSettings  # noqa: E402
from controller.store.db import Store  # noqa: E402
from controller.store.lease import Lease  # noqa: E402
from controller.store.members import fair_share, list_replicas  # noqa: E402
from controller.store.models import Job, JobStatus, Submission  # noqa: E402
from controller.store.models import Lease as LeaseRow  # noqa: E402
from controller.wiring import setup_logging  # noqa: E402

USER = "dispatch"
CHUNK = 5000
PENDING_EVERY = 5  # every fifth job pends, the others run
WARM_TICKS = 3  # complete ticks of every held shard after the spread before measuring
COLUMNS = dialects.SQUEUE_TEXT_COLUMNS  # 22.05's: the classic identity
START_SETTINGS = StartSettings(output_dir="/tmp/out", pass_names=("PATH",))

# ---------------------------------------------------------------- the jobs (as bench/tick)


def cluster_names(n: int) -> tuple[str, ...]:
    return tuple(f"c{c}" for c in range(n))


def job_id_of(i: int) -> str:
    """The i-th job's id: a valid ULID, the same in every process."""
    alphabet = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
    digits = ""
    for _ in range(10):
        i, rest = divmod(i, 32)
        digits = alphabet[rest] + digits
    return "01JZ8Q2N5V" + "0" * 6 + digits


def rows_of(cluster: int, n: int) -> Iterator[tuple[int, str, bool]]:
    """(Slurm job id, dispatch job id, pending) of cluster ``cluster``'s N jobs. Slurm ids
    are distinct across clusters too (c3's run from 3_001_000)."""
    return ((cluster * 1_000_000 + 1000 + i, job_id_of(cluster * n + i),
             i % PENDING_EVERY == PENDING_EVERY - 1) for i in range(n))


def stamp(t: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t))


def text_row(slurm_id: int, job_id: str, pending: bool, *, cluster: str, t0: int) -> str:
    """The job's squeue row in 22.05's columns (each field followed by '|'). The times are
    around ``t0`` (setup's clock): the daemons run on the real clock, and no start or end
    time is crossed during a run (their observations stay remembered, as in steady state)."""
    submit = stamp(t0 - 600)
    if pending:
        state = ("PD", "PENDING", "Priority", "N/A", "N/A", "")
    else:
        state = ("R", "RUNNING", "None", stamp(t0 - 590), stamp(t0 - 590 + 2 * 86400),
                 f"node{slurm_id % 500:03d}")
    compact, long, reason, start, end, nodes = state
    values = {"JobID": str(slurm_id), "Name": f"dj-{job_id}", "UserName": USER,
              "StateCompact": compact, "State": long, "Reason": reason,
              "SubmitTime": submit, "EligibleTime": submit, "StartTime": start,
              "EndTime": end, "PreemptTime": "N/A", "TimeLimit": "2-00:00:00",
              "Requeue": "0", "RestartCnt": "0", "exit_code": "0", "NodeList": nodes,
              "Cluster": cluster, "Comment": "dispatch:s=1;a=0"}
    return "".join(values[column] + "|" for column in COLUMNS)


def squeue_text(cluster: int, n: int, t0: int) -> str:
    return "".join(text_row(slurm_id, job_id, pending, cluster=f"c{cluster}", t0=t0) + "\n"
                   for slurm_id, job_id, pending in rows_of(cluster, n))


def capabilities(cluster: str) -> Capabilities:
    """What Preflight finds on a 22.05 cluster of scripts/slurm-up (as bench/tick)."""
    return Capabilities(slurm_version="22.05.8", accounting_history=True, job_comment=True,
                        whoami=True, output_dir_writable=True, cluster_name=cluster,
                        identity=IDENTITY_CLASSIC)


class FakeRunner:
    """Answers the job read (``squeue --me -O <22.05's columns>``) with one cluster's
    synthesised text, every other command with nothing; counts commands."""

    def __init__(self, full: str) -> None:
        self.full = full
        self.format = dialects.squeue_format(COLUMNS)
        self.commands = 0
        self.markers = Markers()

    async def run(self, argv: Sequence[str], *, stdin: str | None = None,
                  timeout: float | None = None,
                  env: Mapping[str, str] | None = None) -> CommandResult:
        self.commands += 1
        asked = argv[argv.index("-O") + 1] if "-O" in argv else None
        job_read = argv[0] == "squeue" and "-j" not in argv and asked == self.format
        return CommandResult(argv=tuple(argv), returncode=0,
                             stdout=self.full if job_read else "", stderr="",
                             duration_s=0.0)

    async def run_script(self, script: str, *, timeout: float | None = None) -> CommandResult:
        if (marker := self.markers.answer(script)) is not None:
            return marker  # the ownership marker (``bench/fakes.py``)
        raise AssertionError("no submissions in this benchmark")

    async def close(self) -> None:
        return None


# ---------------------------------------------------------------- setup (its own process)


def populate(store: Store, names: Sequence[str], n: int, t0: int) -> None:
    """N jobs per cluster, placed on it, each with its submission; a chunk at a time."""
    base = {"observed_generation": 1, "submission": 1, "attempt": 0,
            "current_submission": 1, "current_since": t0 - 600, "slurm_submit": t0 - 600,
            "cause": "none", "cause_detail": "", "exit_code": None, "reason": "",
            "budgets_used": "{}", "excluded_nodes": "{}", "conditions": "[]",
            "not_before": None, "unknown_since": None, "hold_instance": 0,
            "ended_at": None, "outputs_verified": False, "updated_at": t0 - 600}
    with store.engine.begin() as conn:
        for c, name in enumerate(names):
            spec = json.dumps({"command": ["true"], "workdir": "/tmp", "cluster": name})
            rows = rows_of(c, n)
            left = n
            while chunk := [next(rows) for _ in range(min(CHUNK, left))]:
                left -= len(chunk)
                conn.execute(insert(Job), [
                    {"id": job_id, "spec": spec, "labels": "{}", "desired": "run",
                     "policy": None, "generation": 1, "created_at": t0 - 700,
                     "updated_at": t0 - 700} for _, job_id, _ in chunk])
                conn.execute(insert(JobStatus), [
                    {**base, "job_id": job_id, "slurm_job_id": slurm_id, "cluster": name,
                     "phase": "pending" if pending else "running",
                     "object_state": "pending" if pending else "running",
                     "nodes": "" if pending else f"node{slurm_id % 500:03d}",
                     "started_at": None if pending else t0 - 590, "sluid": None}
                    for slurm_id, job_id, pending in chunk])
                conn.execute(insert(Submission), [
                    {"job_id": job_id, "submission": 1, "attempt": 0, "status": "submitted",
                     "cluster": name, "slurm_job_id": slurm_id, "slurm_submit": t0 - 600,
                     "state": "pending" if pending else "running", "cause": "none",
                     "cause_detail": "", "exit_code": None,
                     "nodes": "" if pending else f"node{slurm_id % 500:03d}",
                     "restart_count": 0, "created_at": t0 - 600,
                     "started_at": None if pending else t0 - 590, "ended_at": None,
                     "epoch": None, "sluid": None}
                    for slurm_id, job_id, pending in chunk])


def setup(url: str, clusters: int, n: int) -> dict[str, Any]:
    """The database: migrated, populated, and settled by one tick per cluster; then two
    more ticks per cluster: the second plans every job again (the first's status writes
    moved their row versions) and writes nothing, the third should plan (almost) none."""
    t0 = int(time.time())
    names = cluster_names(clusters)
    store = Store(url)
    started = time.perf_counter()
    store.migrate()
    populate(store, names, n, t0)
    populate_s = time.perf_counter() - started
    settle_cpu = settle_wall = 0.0
    steady_planned = 0
    for c, name in enumerate(names):
        adapter = SlurmAdapter(FakeRunner(squeue_text(c, n, t0)), cluster=name, user=USER,
                               settings=START_SETTINGS, capabilities=capabilities(name))
        rec = Reconciler(store, adapter, metrics=Metrics(cluster=name),
                         clusters=Clusters(names, name))
        c0, w0 = time.process_time(), time.perf_counter()
        report = asyncio.run(rec.tick())
        settle_cpu += time.process_time() - c0
        settle_wall += time.perf_counter() - w0
        check(report, n, name)
        for _ in range(2):
            again = asyncio.run(rec.tick())
            check(again, n, name)
        steady_planned += again.planned
    store.dispose()
    return {"t0": t0, "populate_s": populate_s, "settle_cpu": settle_cpu,
            "settle_wall": settle_wall, "steady_planned": steady_planned}


def check(report: TickReport, n: int, name: str) -> None:
    assert report.tracked == n and report.slurm_ok and not report.errors, (name, report)
    assert not report.actions, (name, report.actions)


# ---------------------------------------------------------------- one replica (its own process)


def make_config(names: Sequence[str], args: argparse.Namespace) -> Config:
    return parse_config({
        "daemon": {"tick_interval_s": args.interval, "lease_ttl_s": args.ttl,
                   "lease_margin_s": args.margin, "metrics_port": args.port},
        "reconcile": {"replan_s": args.replan},
        "clusters": [{"name": name} for name in names]})


def emit(line: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(line) + "\n")
    sys.stdout.flush()


def replica(args: argparse.Namespace) -> int:
    """A daemon with one shard per cluster over fake runners, as ``controller.wiring``
    builds it (a lease per shard guarding its adapter's writes), under its real ``run()``;
    one holder id for all its leases, so the ``leases`` table reads per replica."""
    setup_logging(args.log_level)
    names = cluster_names(args.clusters)
    config = make_config(names, args)
    d = config.daemon
    store = Store(args.db, idle_tx_timeout_s=d.lease_ttl_s / 2)  # as build_store
    metrics = Metrics(cluster=names[0])
    holder = f"bench-r{args.index}:{os.getpid()}"
    durations: list[float] = []  # wall seconds of the ticks since the last line
    planned = [0]
    errors = [0]
    complete: dict[str, int] = {}  # per shard: ticks that deferred nothing
    shards = []
    for c, name in enumerate(names):
        lease = Lease(store, ttl_s=d.lease_ttl_s, margin_s=d.lease_margin_s, holder=holder,
                      name=lease_name(name, default=c == 0))
        adapter = SlurmAdapter(FakeRunner(squeue_text(c, args.jobs, args.t0)), cluster=name,
                               user=USER, settings=START_SETTINGS,
                               capabilities=capabilities(name), write_guard=lease.guard)
        shard = build_shard(config, name, store=store, adapter=adapter,
                            metrics=metrics.for_cluster(name), lease=lease)
        shard.reconciler.tick = timed(shard.reconciler.tick,  # type: ignore[method-assign]
                                      durations, planned, errors, complete, name)
        shards.append(shard)
    daemon = Daemon(config, store=store, metrics=metrics, shards=shards)
    emit({"ready": True, "holder": holder, "pid": os.getpid()})

    async def sample() -> None:
        while not daemon.stop_event.is_set():
            emit({"t": time.time(), "cpu": time.process_time(),
                  "held": [s.name for s in daemon.held()],
                  "ticks": {s.name: s.ticks for s in shards}, "complete": dict(complete),
                  "durations": durations[:], "planned": planned[0], "errors": errors[0],
                  "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024})
            durations.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(daemon.stop_event.wait(), timeout=d.tick_interval_s)

    async def main() -> None:
        sampler = asyncio.create_task(sample())
        await daemon.run(install_signals=True)
        await sampler

    asyncio.run(main())
    store.dispose()
    return 0


def timed(tick: Any, durations: list[float], planned: list[int], errors: list[int],
          complete: dict[str, int], name: str) -> Any:
    async def wrapped() -> TickReport:
        report: TickReport = await tick()
        durations.append(report.duration_s)
        planned[0] += report.planned
        errors[0] += len(report.errors)
        if not report.deferred:  # (a cold first tick cut at its budget defers the rest)
            complete[name] = complete.get(name, 0) + 1
        return report
    return wrapped


# ---------------------------------------------------------------- the driver


@dataclass
class Proc:
    """A replica process and the JSON lines it printed (with the time each arrived)."""

    index: int
    popen: subprocess.Popen[str]
    log: Path
    holder: str = ""
    samples: list[dict[str, Any]] = field(default_factory=list)
    ready: threading.Event = field(default_factory=threading.Event)

    def read(self, out: IO[str]) -> None:
        for line in out:
            try:
                data = json.loads(line)
            except ValueError:
                continue
            if data.get("ready"):
                self.holder = data["holder"]
                self.ready.set()
            else:
                self.samples.append(data)

    def between(self, start: float, end: float) -> list[dict[str, Any]]:
        return [s for s in self.samples if start <= s["t"] <= end]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_replicas(count: int, args: argparse.Namespace, db: str, t0: int,
                   logs: Path) -> list[Proc]:
    procs = []
    for index in range(count):
        log = logs / f"r{count}-{index}.log"
        argv = [sys.executable, __file__, "--step", "replica", "--db", db, "--t0", str(t0),
                "--index", str(index), "--port", str(free_port()),
                "--clusters", str(args.clusters), "--jobs", str(args.jobs),
                "--interval", str(args.interval), "--ttl", str(args.ttl),
                "--margin", str(args.margin), "--replan", str(args.replan),
                "--log-level", args.log_level]
        with log.open("w") as err:
            popen = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, text=True,
                                     env={**os.environ, "PYTHONHASHSEED": "0"})
        proc = Proc(index, popen, log)
        assert popen.stdout is not None
        threading.Thread(target=proc.read, args=(popen.stdout,), daemon=True).start()
        procs.append(proc)
    for proc in procs:
        if not proc.ready.wait(120):
            stop(procs)  # (a replica left running holds leases of a database now dropped)
            sys.exit(f"bench/shards: replica {proc.index} did not start; see {proc.log}")
    return procs


@dataclass(frozen=True)
class View:
    """``replicas`` and ``leases`` as read at one instant."""

    at: float
    replicas: dict[str, tuple[str, ...]]  # live holder -> shards its row lists
    leases: dict[str, tuple[str, int, float]]  # cluster -> (holder, epoch, expires_at)


def read_view(store: Store, names: Sequence[str]) -> View:
    now = time.time()
    replicas = {r.holder: r.shards for r in list_replicas(store)}
    by_lease = {lease_name(name, default=c == 0): name for c, name in enumerate(names)}
    with store.transaction() as tx:
        rows = tx.execute(select(LeaseRow.name, LeaseRow.holder, LeaseRow.epoch,
                                 LeaseRow.expires_at_ms)).all()
    leases = {by_lease[name]: (holder, epoch, expires / 1000.0)
              for name, holder, epoch, expires in rows if name in by_lease}
    return View(now, replicas, leases)


def spread(view: View, procs: Sequence[Proc], names: Sequence[str]) -> bool:
    """Every cluster held once, by a live replica at most its fair share, and the leases
    agree with what the replicas' rows say."""
    holders = {p.holder for p in procs}
    if set(view.replicas) != holders:
        return False
    share = fair_share(len(names), len(procs))
    listed = [name for shards in view.replicas.values() for name in shards]
    if sorted(listed) != sorted(names) or any(len(s) > share for s in view.replicas.values()):
        return False
    for holder, shards in view.replicas.items():
        for name in shards:
            lease = view.leases.get(name)
            if lease is None or lease[0] != holder or lease[2] <= view.at:
                return False
    return True


def fair(view: View, procs: Sequence[Proc], names: Sequence[str]) -> bool:
    """By the leases alone: every cluster held (not expired) by one of ``procs``, none
    of which holds more than its fair share."""
    holders = [view.leases[name][0] for name in names
               if name in view.leases and view.leases[name][2] > view.at]
    share = fair_share(len(names), len(procs))
    alive = {p.holder for p in procs}
    return (len(holders) == len(names) and set(holders) <= alive
            and all(holders.count(h) <= share for h in alive))


def ticks_of(proc: Proc, key: str = "ticks") -> dict[str, int]:
    return dict(proc.samples[-1][key]) if proc.samples else {}


def wait_warm(procs: Sequence[Proc], view: View, timeout: float) -> bool:
    """Every held shard made WARM_TICKS complete ticks (nothing deferred) since ``view``:
    its cold first plan of every job, cut at the tick's budget into several ticks, is
    done (counting ticks alone measured 10 x 100k replicas still planning cold)."""
    holder_of = {name: holder for holder, shards in view.replicas.items() for name in shards}
    by_holder = {p.holder: p for p in procs}
    base = {p.holder: ticks_of(p, "complete") for p in procs}
    deadline = time.time() + timeout
    while time.time() < deadline:
        if all(ticks_of(by_holder[h], "complete").get(name, 0) - base[h].get(name, 0)
               >= WARM_TICKS
               for name, h in holder_of.items()):
            return True
        time.sleep(0.2)
    return False


def takes(before: View, after: View) -> int:
    """Leases taken by another holder between two views (each moves its epoch by one)."""
    return sum(after.leases[name][1] - before.leases.get(name, ("", 0, 0.0))[1]
               for name in after.leases)


def log_events(logs: Sequence[Path], start: float, end: float) -> dict[str, int]:
    """What the replicas' logs say happened in [start, end] (whole seconds): shards stood
    down from (their lease expired or moved under them), shards shed, error lines."""
    counts = {"stood_down": 0, "shed": 0, "errors": 0}
    for log in logs:
        with log.open() as lines:
            for line in lines:
                if not line[:4].isdigit():
                    continue  # a traceback's line
                at = calendar.timegm(time.strptime(line[:20], "%Y-%m-%dT%H:%M:%SZ"))
                if not int(start) <= at <= end:
                    continue
                counts["stood_down"] += '"stood down' in line
                counts["shed"] += 'why="shed' in line
                counts["errors"] += line.split(" ", 2)[1] == "error"
    return counts


def measure(procs: Sequence[Proc], args: argparse.Namespace, store: Store,
            names: Sequence[str]) -> dict[str, Any]:
    """``--window`` intervals of steady ticks: per replica CPU per interval (each pair of
    consecutive samples, scaled to one interval), CPU per shard tick, tick wall times."""
    before = read_view(store, names)
    start = time.time()
    time.sleep(args.window * args.interval + 0.5)
    end = time.time()
    after = read_view(store, names)
    moved = sorted(name for name in names
                   if before.leases.get(name, ("", 0))[:2] != after.leases.get(name, ("", 0))[:2])
    rows = []
    for proc in procs:
        samples = proc.between(start, end)
        if len(samples) < 2:
            stop(procs)
            sys.exit(f"bench/shards: too few samples from replica {proc.index}; see {proc.log}")
        per_interval = [(b["cpu"] - a["cpu"]) * args.interval / (b["t"] - a["t"])
                        for a, b in itertools.pairwise(samples)]
        first, last = samples[0], samples[-1]
        wall = last["t"] - first["t"]
        cpu = last["cpu"] - first["cpu"]
        ticks = sum(last["ticks"][n] - first["ticks"][n] for n in names)
        durations = [d for s in samples[1:] for d in s["durations"]]
        rows.append({"index": proc.index, "held": len(last["held"]),
                     "cpu_per_interval": cpu * args.interval / wall,
                     "cpu_interval_max": max(per_interval),
                     "cpu": cpu,
                     "shard_ticks": ticks, "intervals": wall / args.interval,
                     "tick_wall_median": statistics.median(durations) if durations else 0.0,
                     "tick_wall_max": max(durations, default=0.0),
                     "planned": last["planned"] - first["planned"],
                     "errors": last["errors"] - first["errors"], "rss_mb": last["rss_mb"]})
    return {"replicas": rows, "moved": moved, "start": start, "before": before}


def move_time(procs: list[Proc], store: Store, names: Sequence[str],
              args: argparse.Namespace) -> dict[str, Any]:
    """SIGKILL the replica holding the most shards; the time until a survivor holds each."""
    view = read_view(store, names)
    victim = max(procs, key=lambda p: (len(view.replicas.get(p.holder, ())), p.index))
    shards = [name for name in names if view.leases[name][0] == victim.holder]
    expires = {name: view.leases[name][2] for name in shards}
    killed = time.time()
    victim.popen.send_signal(signal.SIGKILL)
    victim.popen.wait()
    moved: dict[str, float] = {}
    deadline = killed + 3 * args.ttl + 30
    while len(moved) < len(shards) and time.time() < deadline:
        now = time.time()
        current = read_view(store, names)
        for name in shards:
            holder, _, until = current.leases[name]
            if name not in moved and holder != victim.holder and until > now:
                moved[name] = now - killed
        time.sleep(0.05)
    procs.remove(victim)
    survivors = {p.holder for p in procs}
    final = read_view(store, names)
    to_survivors = all(final.leases[n][0] in survivors for n in shards)
    respread = float("nan")
    while time.time() < deadline + 60:  # and each survivor at most its new fair share
        if fair(final, procs, names):
            respread = final.at - killed
            break
        time.sleep(0.1)
        final = read_view(store, names)
    return {"victim": victim.index, "shards": len(shards), "killed": killed,
            "moved": len(moved), "move_max": max(moved.values(), default=float("nan")),
            "move_min": min(moved.values(), default=float("nan")),
            "expired_after": max(expires.values()) - killed, "respread": respread,
            "takes": takes(view, final), "to_survivors": to_survivors,
            "held": sorted((sum(final.leases[n][0] == h for n in names) for h in survivors),
                           reverse=True)}


def stop(procs: Sequence[Proc]) -> list[int | None]:
    for proc in procs:
        proc.popen.send_signal(signal.SIGTERM)
    codes: list[int | None] = []
    for proc in procs:
        try:
            codes.append(proc.popen.wait(60))
        except subprocess.TimeoutExpired:
            proc.popen.kill()
            codes.append(None)
    return codes


def run_count(count: int, args: argparse.Namespace, db: str, t0: int,
              logs: Path) -> dict[str, Any]:
    names = cluster_names(args.clusters)
    store = Store(db)
    initial = read_view(store, names)
    started = time.time()
    procs = start_replicas(count, args, db, t0, logs)
    logs_of = [p.log for p in procs]
    view = read_view(store, names)
    # replicas started together overshoot (the first counts only itself and takes every
    # shard, then gives the surplus up once its keeper counts the others): a fixed wait
    # stopped 2 replicas of 10 x 100k one shed short of the spread
    deadline = time.time() + 120 + 30 * count + 30 * args.clusters * args.jobs / 100_000
    while not spread(view, procs, names):
        if time.time() > deadline or any(p.popen.poll() is not None for p in procs):
            stop(procs)
            sys.exit(f"bench/shards: {count} replicas never spread the shards: last seen "
                     f"{view.replicas} / leases {view.leases}; logs in {logs}")
        time.sleep(0.2)
        view = read_view(store, names)
    spread_s = view.at - started
    # a replica's first ticks plan every job of its shards cold (15-30 s of CPU per
    # 100k jobs, more on shared cores): a fixed wait stopped the 10 x 100k run of one
    # replica before its shards had ticked
    cold_s = 60 * math.ceil(args.clusters / count) * args.jobs / 100_000
    if not wait_warm(procs, view, 60 + 10 * args.interval + cold_s):
        stop(procs)
        sys.exit(f"bench/shards: {count} replicas: shards did not tick; logs in {logs}")
    result = measure(procs, args, store, names)
    result.update(count=count, spread_s=spread_s,
                  startup=log_events(logs_of, started, result["start"]),
                  startup_takes=takes(initial, result.pop("before")))
    if count > 1:
        move = result["move"] = move_time(procs, store, names, args)
        move.update(log_events(logs_of, move["killed"], time.time()))
    result["exit_codes"] = stop(procs)
    store.dispose()
    return result


# ---------------------------------------------------------------- PostgreSQL


def admin_url() -> str:
    url = os.environ.get("DISPATCH_TEST_PG_URL")
    if url:
        return url
    out = subprocess.run([str(ROOT / "scripts" / "postgres-up")], check=True,
                         capture_output=True, text=True)
    return out.stdout.strip().splitlines()[-1]


def create_database(admin: str) -> str:
    """A fresh database on the server of ``admin`` (as tests/conftest.py makes them)."""
    name = f"dispatch_bench_shards_{os.getpid()}_{int(time.time())}"
    engine = create_engine(admin, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    engine.dispose()
    return admin.rsplit("/", 1)[0] + "/" + name


def drop_database(admin: str, url: str) -> None:
    engine = create_engine(admin, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{url.rsplit("/", 1)[1]}" WITH (FORCE)'))
    engine.dispose()


# ---------------------------------------------------------------- output


def print_results(args: argparse.Namespace, setup_result: dict[str, Any],
                  results: dict[int, dict[str, Any]], counts: Sequence[int]) -> None:
    n = args.clusters * args.jobs
    print(f"{args.clusters} clusters x {args.jobs} jobs = {n} tracked; tick interval "
          f"{args.interval:g} s, lease TTL {args.ttl:g} s, margin {args.margin:g} s, "
          f"replan {args.replan} s; window {args.window} intervals")
    print(f"setup: populate {setup_result['populate_s']:.1f} s, settle (one first tick per "
          f"cluster) {setup_result['settle_cpu']:.1f} CPU s / {setup_result['settle_wall']:.1f}"
          f" s; a third tick per cluster planned {setup_result['steady_planned']} jobs")
    base = statistics.mean(r["cpu_per_interval"] for r in results[1]["replicas"])
    print()
    print(f"{'replicas':>8} {'held':>9} | {'CPU s/interval/replica':>22} {'max 1':>6} "
          f"{'CPU s/':>7} | {'tick wall s':>13} | {'vs 1 replica':>14} {'sum':>6} | "
          f"{'planned':>7} {'moved':>5} {'RSS MB':>6} | {'startup: spread':>15} "
          f"{'takes':>5} {'lost':>4} {'shed':>4}")
    print(f"{'':>8} {'':>9} | {'median':>10} {'max':>11} {'intvl':>6} {'shard tick':>7}"
          f" | {'median':>6} {'max':>6} | {'median':>6} {'max':>7} {'vs 1':>6} | {'':>7} "
          f"{'':>5} {'max':>6} | {'s':>15} {'':>5} {'':>4} {'':>4}")
    for count in counts:
        r = results[count]
        reps = r["replicas"]
        cpu = [x["cpu_per_interval"] for x in reps]
        held = "/".join(str(x["held"]) for x in sorted(reps, key=lambda x: -x["held"]))
        walls = [x["tick_wall_median"] for x in reps]
        per_tick = sum(x["cpu"] for x in reps) / sum(x["shard_ticks"] for x in reps)
        up = r["startup"]
        print(f"{count:>8} {held:>9} | {statistics.median(cpu):>10.3f} {max(cpu):>11.3f} "
              f"{max(x['cpu_interval_max'] for x in reps):>6.3f} {per_tick:>7.4f} | "
              f"{statistics.median(walls):>6.3f} {max(x['tick_wall_max'] for x in reps):>6.3f}"
              f" | {statistics.median(cpu) / base:>5.2f}x {max(cpu) / base:>6.2f}x "
              f"{sum(cpu) / base:>5.2f}x | {sum(x['planned'] for x in reps):>7} "
              f"{len(r['moved']):>5} {max(x['rss_mb'] for x in reps):>6.0f} | "
              f"{r['spread_s']:>15.1f} {r['startup_takes']:>5} {up['stood_down']:>4} "
              f"{up['shed']:>4}")
    moves = [c for c in counts if "move" in results[c]]
    if moves:
        print()
        print(f"{'replicas':>8} {'killed held':>11} | {'moved':>5} {'first s':>7} "
              f"{'all s':>6} {'TTL+interval':>12} | {'lease left':>10} | {'fair again':>10} "
              f"{'held':>7} {'takes':>5} {'lost':>4} {'shed':>4}")
        print(f"{'':>8} {'':>11} | {'':>5} {'':>7} {'':>6} {'s':>12} | {'at kill s':>10} | "
              f"{'s':>10} {'':>7} {'':>5} {'':>4} {'':>4}")
        for count in moves:
            m = results[count]["move"]
            held = "/".join(str(h) for h in m["held"])
            moved = f"{m['moved']}" if m["to_survivors"] else f"{m['moved']}!"
            print(f"{count:>8} {m['shards']:>11} | {moved:>5} {m['move_min']:>7.2f} "
                  f"{m['move_max']:>6.2f} {args.ttl + args.interval:>12g} | "
                  f"{m['expired_after']:>10.2f} | {m['respread']:>10.2f} {held:>7} "
                  f"{m['takes']:>5} {m['stood_down']:>4} {m['shed']:>4}")
    print()
    print("CPU s/interval/replica: a replica's process CPU (all threads) per tick interval, in "
          "which each shard it holds ticks once; median and max over the replicas; max 1 "
          "intvl: the costliest single interval of any replica; CPU s/shard tick: all "
          "replicas' CPU / all their shard ticks; tick wall s: one shard tick's wall time; "
          f"vs 1 replica: against 1 replica's CPU s/interval ({base:.3f} s), sum: all "
          "replicas together; planned: jobs planned in the window (steady: few); moved: "
          "leases that changed holder or epoch during the window (steady: none); startup: "
          "from starting the replicas until the shards are spread (every cluster held once, "
          "no replica above ceil(clusters/replicas)); takes: leases taken by a new holder "
          f"until the window (at least {args.clusters}: every lease once); lost: shards a "
          "replica stood down from (its lease expired or moved under it); shed: shards given "
          "up above the fair share")
    if moves:
        print("move: from SIGKILL of the replica holding the most shards until a survivor "
              "holds each of them (lease held, not expired; '!': not all went to survivors); "
              "lease left at kill: when the last of its leases would expire, from the kill; "
              "fair again: from the kill until the leases are spread over the survivors again "
              "(each at most its new fair share); held: shards "
              "per survivor then; takes, lost, shed: from the kill until then")
    codes = {c: results[c]["exit_codes"] for c in counts}
    if any(code != 0 for cs in codes.values() for code in cs):
        print(f"exit codes after SIGTERM (expected 0): {codes}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clusters", type=int, default=None, help="default 10 (3 with --quick)")
    ap.add_argument("--jobs", type=int, default=None,
                    help="jobs per cluster: default 10000 (1000 with --quick)")
    ap.add_argument("--replicas", default=None, help="default 1,2,4 (1,2 with --quick)")
    ap.add_argument("--interval", type=float, default=2.0, help="tick interval, seconds")
    ap.add_argument("--ttl", type=float, default=10.0, help="lease TTL, seconds")
    ap.add_argument("--margin", type=float, default=3.0, help="lease margin, seconds")
    ap.add_argument("--replan", type=int, default=ReconcileConfig().replan_s,
                    help="reconcile.replan_s, seconds (the safety net: every job is planned "
                         "again within replan..2x replan; default the daemon's, %(default)s)")
    ap.add_argument("--window", type=int, default=None,
                    help="intervals measured per replica count (default 10; 4 with --quick)")
    ap.add_argument("--quick", action="store_true", help="3 clusters x 1000 jobs, 1,2 replicas")
    ap.add_argument("--keep-db", action="store_true", help="do not drop the database")
    ap.add_argument("--logs", default=None, help="directory of the replicas' logs "
                                                 "(default: a temporary one, printed)")
    ap.add_argument("--log-level", default="INFO", help="the replicas' log level")
    ap.add_argument("--step", help=argparse.SUPPRESS)
    ap.add_argument("--db", help=argparse.SUPPRESS)
    ap.add_argument("--t0", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--index", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    quick = args.quick
    args.clusters = args.clusters or (3 if quick else 10)
    args.jobs = args.jobs or (1000 if quick else 10000)
    args.window = args.window or (4 if quick else 10)
    if args.step == "replica":
        return replica(args)
    if args.step == "setup":
        print(json.dumps(setup(args.db, args.clusters, args.jobs)))
        return 0
    counts = sorted({int(c) for c in (args.replicas or ("1,2" if quick else "1,2,4"))
                     .split(",")})
    admin = admin_url()
    db = create_database(admin)
    logs = Path(args.logs) if args.logs else Path(
        subprocess.run(["mktemp", "-d", "/tmp/bench-shards.XXXXXX"], check=True,
                       capture_output=True, text=True).stdout.strip())
    logs.mkdir(parents=True, exist_ok=True)
    try:
        out = subprocess.run([sys.executable, __file__, "--step", "setup", "--db", db,
                              "--clusters", str(args.clusters), "--jobs", str(args.jobs)],
                             check=False, capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit(f"bench/shards: setup failed:\n{out.stderr[-3000:]}")
        setup_result = json.loads(out.stdout.strip().splitlines()[-1])
        results = {}
        for count in dict.fromkeys([1, *counts]):
            results[count] = run_count(count, args, db, setup_result["t0"], logs)
            print(f"[{count} replica(s) done: {json.dumps(summary(results[count]))}]",
                  file=sys.stderr, flush=True)
        print_results(args, setup_result, results, counts)
        print(f"replica logs: {logs}")
    finally:
        if not args.keep_db:
            drop_database(admin, db)
    return 0


def summary(result: dict[str, Any]) -> dict[str, Any]:
    return {"spread_s": round(result["spread_s"], 1),
            "cpu": [round(r["cpu_per_interval"], 3) for r in result["replicas"]],
            "held": [r["held"] for r in result["replicas"]], "moved": result["moved"],
            "startup": result["startup"], "startup_takes": result["startup_takes"],
            "move": result.get("move")}


if __name__ == "__main__":
    sys.exit(main())
