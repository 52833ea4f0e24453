"""``snakemake --executor dispatch`` refuses, before any job is written, what it cannot do:
no database named, a database without the schema, a resource it does not know (naming
the rule and the key; submitted without it when ``--dispatch-ignore-resources`` says so),
a policy that would resubmit application failures. Snakemake as a real process; no
daemon and no cluster are needed (nothing reaches Slurm)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from controller.client import Client

SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")
# a short status interval: Snakemake's shutdown waits out the status loop's sleep
ARGS = ["--executor", "dispatch", "--jobs", "1", "--seconds-between-status-checks", "1"]
SNAKEFILE = """
rule all:
    input: "x.txt"

rule make_x:
    output: "x.txt"
    resources: scratch_gb=5
    shell: "touch {output}"
"""


def snakemake(workdir: Path, *args: str, env: dict[str, str] | None = None,
              ) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if "DATABASE_URL" not in k}
    return subprocess.run([SNAKEMAKE, *ARGS, *args],
                          cwd=workdir, capture_output=True, text=True, timeout=120,
                          env={**clean, **(env or {})}, check=False)


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "Snakefile").write_text(SNAKEFILE)
    return tmp_path


@pytest.fixture
def database(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'dispatch.db'}"
    client = Client(url)
    client.migrate()
    client.close()
    return url


def rows(url: str) -> list[dict[str, object]]:
    client = Client(url)
    try:
        return client.list_jobs()
    finally:
        client.close()


def test_no_database(workdir: Path) -> None:
    done = snakemake(workdir)
    assert done.returncode != 0
    assert "--dispatch-database-url or $DISPATCH_DATABASE_URL" in done.stdout + done.stderr


def test_database_without_schema(workdir: Path, tmp_path: Path) -> None:
    done = snakemake(workdir, env={"DISPATCH_DATABASE_URL": f"sqlite:///{tmp_path / 'e.db'}"})
    assert done.returncode != 0
    assert "dispatchctl migrate" in done.stdout + done.stderr


def test_unknown_resource_names_rule_and_key(workdir: Path, database: str) -> None:
    done = snakemake(workdir, "--dispatch-database-url", database)
    assert done.returncode != 0
    assert ("rule make_x: resource 'scratch_gb' is not supported by the dispatch executor"
            in done.stdout + done.stderr), done.stdout + done.stderr
    assert rows(database) == []


def test_ignored_resource_is_submitted_without_and_ctrl_c_stops_it(workdir: Path,
                                                                   database: str) -> None:
    """No daemon runs: the job is written and stays pending until Ctrl-C (SIGINT) stops
    it. (SIGTERM is Snakemake's graceful stop: it waits for running jobs to end.)"""
    proc = subprocess.Popen([SNAKEMAKE, *ARGS, "--dispatch-database-url", database,
                             "--dispatch-ignore-resources", "scratch_gb"], cwd=workdir,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while not rows(database) and time.monotonic() < deadline:
            assert proc.poll() is None
            time.sleep(0.25)
        (job,) = rows(database)
        assert (job["labels"]["snakemake/rule"], job["phase"]) == ("make_x", "pending")
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0
    assert "dispatch: cancelled the jobs of run" in output, output
    (job,) = rows(database)
    assert job["desired"] == "stopped"


def test_policy_resubmitting_application_failures_is_refused(workdir: Path,
                                                             database: str) -> None:
    policy = workdir / "policy.json"
    policy.write_text(json.dumps({"causes": {"non-zero-exit": {"budget": 2}}}))
    done = snakemake(workdir, "--dispatch-database-url", database, "--dispatch-policy",
                     str(policy), "--dispatch-ignore-resources", "scratch_gb")
    assert done.returncode != 0
    assert "causes.non-zero-exit resubmits an application failure" in done.stdout + done.stderr
    assert rows(database) == []
