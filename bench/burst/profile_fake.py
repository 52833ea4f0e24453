#!/usr/bin/env python3
"""bench/burst/profile_fake: the daemon's own CPU per job in a burst, without Slurm.

The real ``controller.reconcile.tick.Reconciler`` (fenced by a real ``Lease``, as the
daemon runs it) against ``tests.fakeslurm.FakeSlurm``: N job rows committed in one
transaction, then ticks until every row has its Slurm job (held mode: gated and left
so; running mode: released) and no tick asks for another at once (the *burst*), then
ticks until one plans nothing (the *settle*: the observations of the new objects).
Prints CPU ms per job (this process only: the PostgreSQL server's own CPU is not in
it), wall ms per job, the tick's own phase timings, and, with ``--profile``, where the
CPU goes (cProfile, a second pass on a fresh database: the profiler's overhead is kept
out of the figures).

    .venv/bin/python bench/burst/profile_fake.py                     # SQLite, both modes
    export DISPATCH_TEST_PG_URL=$(scripts/postgres-up | tail -n1)
    .venv/bin/python bench/burst/profile_fake.py --db both --profile
    .venv/bin/python bench/burst/profile_fake.py --db both --against HEAD   # before/after

``--against REV`` runs the same measurement on ``git archive REV`` (in a subprocess,
that tree's ``controller`` and ``tests``) first and prints both side by side.
No real Slurm is used; each PostgreSQL database is created with a unique name and
dropped after.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DOC = {"command": ["true"], "workdir": "/tmp"}
NOW = 1_800_000_000
PHASES = ("load", "read", "select", "plan", "store", "apply", "gauges")


def _import_tree(src: Path) -> None:
    """Import ``controller`` and ``tests`` from ``src`` (this checkout by default)."""
    sys.path.insert(0, str(src))


@contextmanager
def _database(kind: str, pg_admin: str | None) -> Iterator[str]:
    """A fresh, empty database URL of ``kind``; removed after."""
    if kind == "sqlite":
        with tempfile.TemporaryDirectory(prefix="dispatch-profile-") as tmp:
            yield f"sqlite:///{tmp}/dispatch.db"
        return
    if not pg_admin:
        raise SystemExit("PostgreSQL: set DISPATCH_TEST_PG_URL (scripts/postgres-up) "
                         "or pass --database-url")
    from sqlalchemy import create_engine, text

    name = "dispatch_profile_" + uuid.uuid4().hex[:12]
    admin = create_engine(pg_admin, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        try:
            yield pg_admin.rsplit("/", 1)[0] + "/" + name
        finally:
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()


def _insert_burst(store: Any, n: int, desired: str) -> None:
    from controller.model.ids import new_job_id
    from controller.store import repo

    ids = sorted(str(new_job_id()) for _ in range(n))
    with store.transaction() as tx:
        for job_id in ids:
            repo.insert_job(tx, job_id=job_id, document=DOC, desired=desired, now=NOW)


def _done(fake: Any, n: int, mode: str) -> bool:
    from controller.model.obs import State

    if len(fake.jobs) < n:
        return False
    want = State.GATED if mode == "held" else State.PENDING
    return all(fj.obs.state is want for fj in fake.jobs.values())


async def _run(url: str, n: int, mode: str, *,
               profiler: cProfile.Profile | None) -> dict[str, Any]:
    from prometheus_client import CollectorRegistry

    from controller.metrics import Metrics
    from controller.reconcile.tick import Reconciler, TickSettings
    from controller.store.db import Store
    from controller.store.lease import Lease
    from tests.fakeslurm import FakeSlurm

    store = Store(url)
    store.migrate()
    clock = [NOW]
    fake = FakeSlurm(clock)
    lease = Lease(store, ttl_s=30.0, margin_s=5.0, clock=lambda: float(clock[0]))
    assert lease.try_acquire()
    rec = Reconciler(store, fake, metrics=Metrics(CollectorRegistry()),
                     clock=lambda: float(clock[0]), settings=TickSettings(), fence=lease,
                     budget_s=lease.ttl_s / 3)
    await rec.tick()  # the daemon leads and has ticked once before the burst
    _insert_burst(store, n, "held" if mode == "held" else "run")

    phases = dict.fromkeys(PHASES, 0.0)
    out: dict[str, Any] = {"ticks": 0, "settle_ticks": 0, "longest_tick_s": 0.0}

    async def ticks(until: Callable[[Any], bool]) -> tuple[float, float, int]:
        cpu0, wall0, count = time.process_time(), time.perf_counter(), 0
        while True:
            if profiler is not None:
                profiler.enable()
            report = await rec.tick()
            if profiler is not None:
                profiler.disable()
            count += 1
            out["longest_tick_s"] = max(out["longest_tick_s"], report.duration_s)
            for key in PHASES:
                phases[key] += report.timings.get(key, 0.0)
            if report.errors:
                raise RuntimeError(f"tick errors: {report.errors[:3]}")
            if until(report) or count > 10_000:
                return time.process_time() - cpu0, time.perf_counter() - wall0, count

    cpu, wall, out["ticks"] = await ticks(
        lambda rep: _done(fake, n, mode) and not rep.replan_soon)
    settle_cpu, settle_wall, out["settle_ticks"] = await ticks(lambda rep: rep.planned == 0)
    assert fake.calls.count("start") == n, "each row submitted once"
    store.dispose()
    out.update(cpu_ms_per_job=cpu * 1000 / n, wall_ms_per_job=wall * 1000 / n,
               settle_cpu_ms_per_job=settle_cpu * 1000 / n,
               settle_wall_ms_per_job=settle_wall * 1000 / n,
               phase_ms_per_job={k: v * 1000 / n for k, v in phases.items()})
    return out


def _measure(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for db in (["sqlite", "postgresql"] if args.db == "both" else [args.db]):
        for mode in (["held", "running"] if args.mode == "both" else [args.mode]):
            runs = []
            for _ in range(args.runs):
                with _database(db, args.database_url) as url:
                    runs.append(asyncio.run(_run(url, args.jobs, mode, profiler=None)))
            best = min(runs, key=lambda r: r["cpu_ms_per_job"])
            best["cpu_ms_per_job_runs"] = [round(r["cpu_ms_per_job"], 3) for r in runs]
            for key in ("cpu_ms_per_job", "wall_ms_per_job", "settle_cpu_ms_per_job",
                        "settle_wall_ms_per_job"):
                best[key + "_median"] = statistics.median(r[key] for r in runs)
            results[f"{db}/{mode}"] = best
            if args.profile:
                profiler = cProfile.Profile()
                with _database(db, args.database_url) as url:
                    asyncio.run(_run(url, args.jobs, mode, profiler=profiler))
                buf = io.StringIO()
                stats = pstats.Stats(profiler, stream=buf).strip_dirs()
                stats.sort_stats("cumulative").print_stats(args.top)
                stats.sort_stats("tottime").print_stats(args.top)
                best["profile"] = buf.getvalue()
    return results


def _print(results: dict[str, Any], base: dict[str, Any] | None, n: int) -> None:
    print(f"\n{n} rows in one transaction; CPU of this process (ms per job) and, in "
          "brackets, wall ms per job: medians of the runs")
    head = f"{'case':<20}" + (f"{'before':>22}" if base else "") + f"{'after':>22}"
    for key in ("burst", "settle"):
        print(f"\n[{key}]\n{head}" + ("      ratio" if base else ""))
        cpu = ("cpu_ms_per_job" if key == "burst" else "settle_cpu_ms_per_job") + "_median"
        wall = ("wall_ms_per_job" if key == "burst" else "settle_wall_ms_per_job") + "_median"
        for case, res in results.items():
            cells = []
            if base and case in base:
                cells.append(f"{base[case][cpu]:>10.3f} [{base[case][wall]:>8.3f}]")
            cells.append(f"{res[cpu]:>10.3f} [{res[wall]:>8.3f}]")
            ratio = (f"    {res[cpu] / base[case][cpu]:>5.2f}x"
                     if base and case in base and base[case][cpu] else "")
            print(f"{case:<20}" + "".join(f"{c:>22}" for c in cells) + ratio)
    print("\n[the run of least CPU: burst+settle ticks, longest tick (s), the tick's phase "
          "timings (TickReport.timings, wall) in ms per job]")
    for case, res in results.items():
        for label, r in ((("before", base[case]),) if base and case in base else ()) + (
                ("after", res),):
            ph = " ".join(f"{k}={v:.3f}" for k, v in r["phase_ms_per_job"].items())
            print(f"{case:<20}{label:<7} ticks={r['ticks']}+{r['settle_ticks']} "
                  f"longest={r['longest_tick_s']:.2f} {ph}")
    for case, res in results.items():
        if "profile" in res:
            print(f"\n===== cProfile {case} (burst and settle ticks) =====")
            print(res["profile"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--db", choices=("sqlite", "postgresql", "both"), default="sqlite")
    parser.add_argument("--mode", choices=("held", "running", "both"), default="both")
    parser.add_argument("--database-url", default=os.environ.get("DISPATCH_TEST_PG_URL"),
                        help="a PostgreSQL role that may create databases")
    parser.add_argument("--profile", action="store_true", help="also print cProfile tops")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--against", metavar="REV",
                        help="measure git REV first (git archive) and print both")
    parser.add_argument("--src", type=Path, default=ROOT, help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    _import_tree(args.src)
    base = None
    if args.against:
        with tempfile.TemporaryDirectory(prefix="dispatch-base-") as tmp:
            archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.against],
                                     check=True, capture_output=True).stdout
            subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
            figures = Path(tmp) / "figures.json"
            argv = [sys.executable, __file__, "--src", tmp, "--json", str(figures),
                    "--jobs", str(args.jobs), "--runs", str(args.runs), "--db", args.db,
                    "--mode", args.mode]
            if args.database_url:
                argv += ["--database-url", args.database_url]
            subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
            base = json.loads(figures.read_text())
    results = _measure(args)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    _print(results, base, args.jobs)


if __name__ == "__main__":
    main()
