"""The crash window the journal closes, through a real Snakemake (no daemon, no cluster):
a Snakemake killed after it journaled a job id but before the database write submits
that very id on its next start; one killed after the write (before Snakemake recorded
the id) adopts the written job instead of writing a second one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from controller.client import Client
from controller.model.ids import new_job_id
from snakemake_executor_plugin_dispatch.journal import Journal
from snakemake_executor_plugin_dispatch.mapping import JobFacts, journal_key, run_identity

SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")
SNAKEFILE = """
rule all:
    input: "x.txt"

rule make_x:
    output: "x.txt"
    shell: "touch {output}"
"""
KEY = journal_key(JobFacts(name="make_x", rules=("make_x",), jobid="1", attempt=1, threads=1,
                           resources={}, wildcards={}, outputs=("x.txt",)))


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "Snakefile").write_text(SNAKEFILE)
    return tmp_path


@pytest.fixture
def client(tmp_path: Path) -> Client:
    client = Client(f"sqlite:///{tmp_path / 'dispatch.db'}")
    client.migrate()
    return client


def run_until_written(workdir: Path, client: Client) -> str:
    """Snakemake until its job is in the database, then Ctrl-C; its output."""
    url = client.store.engine.url.render_as_string(hide_password=False)
    clean = {k: v for k, v in os.environ.items() if "DATABASE_URL" not in k}
    proc = subprocess.Popen([SNAKEMAKE, "--executor", "dispatch", "--jobs", "1",
                             "--seconds-between-status-checks", "1",
                             "--dispatch-database-url", url], cwd=workdir, env=clean,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not _submitted(workdir):
            assert proc.poll() is None
            time.sleep(0.25)
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return output


def _submitted(workdir: Path) -> bool:
    """Snakemake recorded an external id (its incomplete marker names one)."""
    marker = workdir / ".snakemake" / "incomplete"
    return marker.exists() and any(marker.iterdir())


def test_journaled_but_never_written_is_submitted_under_its_id(workdir: Path,
                                                               client: Client) -> None:
    journaled = new_job_id()
    Journal(workdir / ".snakemake" / "dispatch" / "journal").intend(KEY, journaled)
    run_until_written(workdir, client)
    assert [v["id"] for v in client.list_jobs()] == [journaled]


def test_written_but_not_recorded_is_adopted(workdir: Path, client: Client) -> None:
    run = run_identity(str(workdir), str(workdir / "Snakefile"))
    written = client.submit({"command": ["true"], "workdir": str(workdir),
                             "labels": {"snakemake/run": run}})
    Journal(workdir / ".snakemake" / "dispatch" / "journal").intend(KEY, written)
    output = run_until_written(workdir, client)
    assert f"Resuming dispatch job {written} (pending) of make_x" in output, output
    assert [v["id"] for v in client.list_jobs()] == [written]


def test_another_runs_job_is_not_adopted(workdir: Path, client: Client) -> None:
    foreign = client.submit({"command": ["true"], "workdir": str(workdir),
                             "labels": {"snakemake/run": "0000000000000000"}})
    Journal(workdir / ".snakemake" / "dispatch" / "journal").intend(KEY, foreign)
    output = run_until_written(workdir, client)
    assert "Resuming" not in output
    ids = sorted(v["id"] for v in client.list_jobs())
    assert len(ids) == 2 and foreign in ids
