"""The benchmarks of the real Slurm cluster in their smoke sizes (``tests/test_bench_smoke``
says why): bench/burst (the daemon against raw sbatch loops) and bench/submit (Start's
ways of submitting). Host lane: they own the host's cluster while they run (the module
holds the host lane's lock, as every host-lane module does)."""

from __future__ import annotations

from tests.test_bench_smoke import run_bench


def test_bench_burst() -> None:
    out = run_bench("bench/burst/run.py", "--jobs", "20", "--singles", "2", timeout=900)
    assert "held" in out and "running" in out, out


def test_bench_submit() -> None:
    out = run_bench("bench/submit", "--jobs", "5", "--concurrency", "5", timeout=300)
    assert "raw-sbatch" in out, out
