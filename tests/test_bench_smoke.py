"""Every benchmark under ``bench/`` runs in the test command in a smoke size (seconds), so
a benchmark cannot silently break again (issue 19: bench/failover crashed at 100k, and
bench/tick, failover and shards crashed at their first tick once the ownership marker
landed, unnoticed). The full sizes stay manual; these assert that each one runs to its
end and prints its table, not any figure.

The cluster-free ones run here; the ones of the real Slurm cluster are in
``tests/test_bench_cluster.py``; bench/shards needs PostgreSQL (host lane)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import PG_ADMIN_URL

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"

# every benchmark's entry point -> the test that runs it in a smoke size
SMOKE = {
    "bench/tick": "tests/test_bench_smoke.py::test_bench_tick",
    "bench/failover": "tests/test_bench_smoke.py::test_bench_failover",
    "bench/shards/run.py": "tests/test_bench_smoke.py::test_bench_shards",
    "bench/burst/run.py": "tests/test_bench_cluster.py::test_bench_burst",
    "bench/submit": "tests/test_bench_cluster.py::test_bench_submit",
    "bench/workflows/run.py": "tests/test_bench_cluster.py::test_bench_workflows",
}


def run_bench(*argv: str, timeout: float = 300, env: dict[str, str] | None = None) -> str:
    """Run a benchmark as a user would; its stdout (a failure shows its stderr)."""
    done = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})}, check=False)
    assert done.returncode == 0, f"{argv[0]} exited {done.returncode}:\n{done.stderr[-4000:]}"
    return done.stdout


def entry_points() -> set[str]:
    """The benchmarks: each executable file directly under bench/, and each directory's
    run.py (a directory without one is a benchmark of its own name)."""
    found: set[str] = set()
    for path in BENCH.iterdir():
        if path.name.startswith((".", "_")) or (path.suffix == ".py" and path.is_file()):
            continue
        if path.is_dir():
            run = path / "run.py"
            found.add(str(run.relative_to(ROOT)) if run.exists() else f"bench/{path.name}")
        elif os.access(path, os.X_OK):
            found.add(f"bench/{path.name}")
    return found


def test_every_benchmark_has_a_smoke_run() -> None:
    missing = entry_points() - set(SMOKE)
    assert not missing, f"benchmarks without a smoke run in the test command: {missing}"


def test_bench_tick() -> None:
    out = run_bench("bench/tick", "--sizes", "300", "--naive-sample", "50")
    (row,) = [line for line in out.splitlines() if line.split()[:1] == ["300"]]
    assert row.split()[1] == "1", out  # one Slurm command per steady tick


def test_bench_failover() -> None:
    out = run_bench("bench/failover", "--sizes", "300", "--ttl", "6", "--interval", "1")
    (row,) = [line for line in out.splitlines() if line.split()[:1] == ["300"]]
    warm, cold = row.split("|")  # the warm takeover, then the cold one's columns
    assert warm.split()[-1] == "sbatch", out  # the new leader's first write: the new job
    assert len(cold.split()) == 3, out


def test_bench_shards(pg_url: str) -> None:
    """(``pg_url`` puts it in the host lane, beside PostgreSQL's other users; the bench
    makes a database of its own with the admin URL.)"""
    out = run_bench("bench/shards/run.py", "--clusters", "2", "--jobs", "200",
                    "--replicas", "1,2", "--interval", "1", "--ttl", "4", "--margin", "1",
                    "--window", "3", env={"DISPATCH_TEST_PG_URL": PG_ADMIN_URL}, timeout=600)
    assert "replicas" in out, out


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__])
