"""bench/workflows at its smoke size (``--smoke``: the dispatch executor, two workflows of
six jobs, each Snakemake run to its end, then each SIGKILLed half-way and started again)
on the host's real Slurm: the bench runs, and it exits 0 only when no job was wrongly
reported and none ran twice. The comparison with snakemake-executor-plugin-slurm is the
full size, run by hand (bench/workflows/README.md)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.daemon_harness import ROOT
from tests.snakemake_support import require_jobs_venv

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def test_bench_workflows_smoke() -> None:
    require_jobs_venv()
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "workflows" / "run.py"),
                           "--smoke"], capture_output=True, text=True, timeout=600,
                          check=False)
    print("\n" + done.stdout)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "dispatch  killed" in done.stdout
