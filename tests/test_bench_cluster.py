"""The benchmarks of the real Slurm cluster in their smoke sizes (``tests/test_bench_smoke``
says why): bench/burst (the daemon against raw sbatch loops), bench/submit (Start's
ways of submitting) and bench/workflows (Snakemake's dispatch executor; its smoke size
leaves out the slurm plugin, whose first status read alone waits 40 s). Host lane: they
own the host's cluster while they run (the module holds the host lane's lock, as every
host-lane module does)."""

from __future__ import annotations

from tests.snakemake_support import require_jobs_venv
from tests.test_bench_smoke import run_bench


def test_bench_burst() -> None:
    out = run_bench("bench/burst/run.py", "--jobs", "20", "--singles", "2", timeout=900)
    assert "held" in out and "running" in out, out


def test_bench_submit() -> None:
    out = run_bench("bench/submit", "--smoke", timeout=300)
    for line in ("raw-sbatch", "local-start / raw-sbatch", "ssh-start / ssh-per-job",
                 "cancelled 20 jobs"):
        assert line in out, out


def test_bench_workflows() -> None:
    """Two workflows of six jobs, run to their end, then each SIGKILLed half-way and
    started again: the bench exits 1 if a job was wrongly reported or ran twice."""
    require_jobs_venv()
    out = run_bench("bench/workflows/run.py", "--smoke", timeout=600)
    print("\n" + out)
    assert "dispatch  killed" in out, out
