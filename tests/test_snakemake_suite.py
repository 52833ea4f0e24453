"""Issue 20: Snakemake's own executor test suite (``TestWorkflowsLocalStorageBase``: its
``simple`` and ``groups`` workflows) passes against the daemon, as the slurm plugin runs
it against Slurm. The daemon runs as a real process on SQLite and every job is a
dispatch job on the host's real Slurm; the suite runs in a pytest of its own as the job
user (``tests/snakemake_suite/suite_dispatch.py``; ``tests/snakemake_support.py`` says
why). The suite asserts nothing itself: a failed job, an output missing after the
latency wait or an executor error fails it. Here every dispatch job must also have
succeeded, each in exactly one Slurm execution."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.daemon_harness import ROOT, sacct_records, wait_for
from tests.snakemake_support import (
    as_job_user,
    dispatch_daemon,
    finish,
    require_jobs_venv,
    shared_sqlite,
    views_by_run,
    workflow_dir,
)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

SUITE = ROOT / "tests" / "snakemake_suite" / "suite_dispatch.py"


def test_snakemake_executor_suite(tmp_path: Path) -> None:
    venv = require_jobs_venv()
    work = workflow_dir("suite")
    url = shared_sqlite()
    with dispatch_daemon(tmp_path, url):
        log = work / "pytest.log"
        proc = as_job_user(
            [str(venv / "bin" / "python"), "-m", "pytest", "-p", "no:cacheprovider",
             "--noconftest", "-c", "/dev/null", "--rootdir", str(work), "-o", "addopts=",
             "--basetemp", str(work / "tmp"), "-q", str(SUITE)],
            cwd=work, log=log,
            env={"DISPATCH_SUITE_DATABASE_URL": url,
                 "DISPATCH_SUITE_POLICY": str(work / "dispatch-policy.json")})
        code = finish(proc, timeout=300)
        output = log.read_text(errors="replace")
        summary = [line for line in output.splitlines() if re.search(r"\d+ (passed|failed)", line)]
        print("\nSnakemake's executor suite:", summary[-1] if summary else output[-3000:])
        assert code == 0, output[-6000:]
        assert "2 passed" in summary[-1]
        runs = views_by_run(url)
    # one run per workflow (simple, groups), every job succeeded
    assert len(runs) == 2, sorted(runs)
    views = [v for vs in runs.values() for v in vs]
    assert all(v["phase"] == "succeeded" and v["attempt"] == 0 for v in views), views
    names = {"dj-" + v["id"] for v in views}
    wait_for(lambda: len(sacct_records(names)) >= len(names), timeout=60,
             what="accounting to show every job")
    records = sacct_records(names)
    assert sorted(r.name for r in records) == sorted(names), records
    assert all(r.state == "COMPLETED" and r.user == "dispatch" for r in records), records
    print(f"{len(views)} dispatch jobs, each executed once in sacct")
