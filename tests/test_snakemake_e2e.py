"""Issue 20: ``snakemake --executor dispatch`` end to end -- Snakemake as a real process of
the job user, the daemon as a real process on PostgreSQL, the host's real Slurm, sacct
(read as root) saying what really ran:

* a failing rule: Snakemake's error names the cause and the exit code, and the job's
  stderr file;
* ``--retries 1`` on a job that exits 1 once: Snakemake submits it twice, the daemon
  never resubmits it, and sacct shows exactly two executions;
* the node set DOWN under a running job: the daemon resubmits it once (node-lost),
  Snakemake never does, the workflow succeeds;
* Ctrl-C: every job of the interrupted run is cancelled in Slurm, another run's jobs run
  on;
* SIGKILL and a restart: the restarted Snakemake re-adopts the jobs it had submitted
  (running and finished) and submits only the rest; every job executed once in sacct.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import create_pg_database, drop_pg_database
from tests.daemon_harness import sacct_records, squeue_names
from tests.slurm_fixtures import wait_node_ready
from tests.snakemake_support import (
    dispatch_daemon,
    finish,
    run_snakemake,
    start_snakemake,
    views_by_run,
    wait_for,
    workflow_dir,
)

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.postgres]

NODE = "vm"
LIVE = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED"})


@pytest.fixture(scope="module")
def database_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    wait_node_ready()  # a run killed mid-test may have left the node down
    url = create_pg_database()
    try:
        with dispatch_daemon(tmp_path_factory.mktemp("snakemake-e2e"), url):
            yield url
    finally:
        drop_pg_database(url)


def run_views(url: str, workdir: Path) -> list[dict[str, Any]]:
    """The dispatch jobs of the workflow in ``workdir`` (by the run label the executor
    printed at its start), by id."""
    text = (workdir / "snakemake.log").read_text(errors="replace")
    return sorted((v for run, views in views_by_run(url).items()
                   if f"snakemake/run={run}" in text for v in views),
                  key=lambda v: v["id"])


def executions(views: list[dict[str, Any]]) -> dict[str, list[str]]:
    """sacct's records (states) per dispatch job id."""
    names = {"dj-" + v["id"]: v["id"] for v in views}
    out: dict[str, list[str]] = {v["id"]: [] for v in views}
    for rec in sacct_records(set(names)):
        out[names[rec.name]].append(rec.state)
    return out


def settled_executions(views: list[dict[str, Any]], expected: int) -> dict[str, list[str]]:
    """``executions`` once accounting holds at least ``expected`` records."""
    wait_for(lambda: sum(map(len, executions(views).values())) >= expected, timeout=60,
             what="accounting to catch up")
    return executions(views)


FAILING = """
rule all:
    input: "ok.txt", "bad.txt"

rule ok:
    output: "ok.txt"
    shell: "echo ok > {output}"

rule bad:
    output: "bad.txt"
    log: "bad.log"
    shell: "echo the tool says no >&2; exit 3"
"""


def test_failing_rule_reports_cause_and_exit_code(database_url: str) -> None:
    work = workflow_dir("failing", FAILING)
    code, output = run_snakemake(work, database_url, timeout=180)
    assert code != 0, output
    views = run_views(database_url, work)
    bad = [v for v in views if v["labels"]["snakemake/rule"] == "bad"]
    assert len(bad) == 1 and bad[0]["phase"] == "failed", views
    assert (bad[0]["cause"], bad[0]["exit_code"], bad[0]["attempt"]) == ("non-zero-exit", 1, 0)
    error = output[output.index("Error in rule bad"):]
    print("\nSnakemake's report of the failed rule:\n" + error[:1200])
    assert f"dispatch job {bad[0]['id']} failed: cause non-zero-exit" in error
    assert "exit code 1" in error and f"Slurm job {bad[0]['slurm_job_id']}" in error
    # the job's stderr file is named in the report (its content too: it holds the
    # inner Snakemake's "exit status 3")
    stderr = next(w.rstrip(",") for w in error.split()
                  if w.rstrip(",").endswith(f"{bad[0]['id']}.err.s1-{bad[0]['slurm_job_id']}-r0"))
    text = Path(stderr).read_text(errors="replace")
    assert "the tool says no" in text and "non-zero exit status 3" in text, text
    assert executions(views) and settled_executions(views, len(views))


RETRY_ONCE = """
rule all:
    input: "once.txt"

rule once:
    output: "once.txt"
    shell: "if [ ! -e attempted ]; then touch attempted; exit 1; fi; echo ok > {output}"
"""


def test_retries_run_the_job_exactly_twice(database_url: str) -> None:
    work = workflow_dir("retries", RETRY_ONCE)
    code, output = run_snakemake(work, database_url, "--retries", "1", timeout=180)
    assert code == 0, output
    views = run_views(database_url, work)
    assert [(v["labels"]["snakemake/attempt"], v["phase"], v["attempt"]) for v in views] == [
        ("1", "failed", 0), ("2", "succeeded", 0)], views
    ran = settled_executions(views, 2)
    print(f"\n--retries 1: sacct {ran}")
    assert sorted(s for states in ran.values() for s in states) == ["COMPLETED", "FAILED"]


SLOW = """
rule all:
    input: "slow.txt"

rule slow:
    output: "slow.txt"
    shell: "sleep 8; echo done > {output}"
"""


@pytest.fixture
def node_restored() -> Iterator[str]:
    try:
        yield NODE
    finally:
        subprocess.run(["scontrol", "update", f"NodeName={NODE}", "State=RESUME"],
                       check=False, capture_output=True)
        wait_node_ready()


def test_node_down_resubmitted_by_the_daemon_alone(database_url: str,
                                                   node_restored: str) -> None:
    work = workflow_dir("node-down", SLOW)
    proc = start_snakemake(work, database_url)
    try:
        wait_for(lambda: [v["phase"] for v in run_views(database_url, work)] == ["running"],
                 timeout=60, what="the job to run")
        subprocess.run(["scontrol", "update", f"NodeName={node_restored}", "State=DOWN",
                        "Reason=dispatch-snakemake-e2e"], check=True)
        wait_for(lambda: run_views(database_url, work)[0]["attempt"] == 1, timeout=60,
                 what="the daemon to resubmit the job")
        subprocess.run(["scontrol", "update", f"NodeName={node_restored}", "State=RESUME"],
                       check=True)
        code = finish(proc, timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    output = (work / "snakemake.log").read_text(errors="replace")
    assert code == 0, output
    views = run_views(database_url, work)
    assert [(v["phase"], v["attempt"], v["labels"]["snakemake/attempt"]) for v in views] == [
        ("succeeded", 1, "1")], views
    ran = settled_executions(views, 2)
    print(f"\nnode DOWN under the job: sacct {ran}")
    assert sorted(s for states in ran.values() for s in states) == ["COMPLETED", "NODE_FAIL"]


LONG = """
rule all:
    input: "a.txt", "b.txt"

rule long:
    output: "{name}.txt"
    shell: "sleep 300; touch {output}"
"""


def test_ctrl_c_cancels_every_job_of_the_run_and_no_other(database_url: str) -> None:
    first, second = workflow_dir("ctrl-c", LONG), workflow_dir("ctrl-c-other", LONG)
    procs = {w: start_snakemake(w, database_url) for w in (first, second)}
    try:
        for work in (first, second):
            wait_for(lambda w=work: [v["phase"] for v in run_views(database_url, w)] ==
                     ["running", "running"], timeout=90, what="both jobs of a run to run")
        mine = run_views(database_url, first)
        others = run_views(database_url, second)
        os.killpg(procs[first].pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        finish(procs[first], timeout=60)
        wait_for(lambda: {v["phase"] for v in run_views(database_url, first)} == {"cancelled"},
                 timeout=60, what="the interrupted run's jobs to be cancelled")
        live = {name for _, name, state in squeue_names() if state in LIVE}
        assert not {"dj-" + v["id"] for v in mine} & live
        assert {"dj-" + v["id"] for v in others} <= live
        assert [v["phase"] for v in run_views(database_url, second)] == ["running", "running"]
        ran = settled_executions(mine, 2)
        print(f"\nCtrl-C: the run's jobs in sacct {ran}; the other run's still running")
        assert all(states == ["CANCELLED"] for states in ran.values()), ran
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGINT)
        for proc in procs.values():
            finish(proc, timeout=60)
    wait_for(lambda: {v["phase"] for v in run_views(database_url, second)} == {"cancelled"},
             timeout=60, what="the other run's jobs to be cancelled by its own Ctrl-C")


FAN_IN = """
rule all:
    input: "merged.txt"

rule quick:
    output: "quick/{i}.txt"
    shell: "echo {wildcards.i} > {output}"

rule slow:
    output: "slow/{i}.txt"
    shell: "sleep 10; echo {wildcards.i} > {output}"

rule merge:
    input: expand("quick/{i}.txt", i=range(4)), expand("slow/{i}.txt", i=range(2))
    output: "merged.txt"
    shell: "cat {input} > {output}"
"""


def test_sigkill_and_restart_adopts_instead_of_resubmitting(database_url: str) -> None:
    work = workflow_dir("resume", FAN_IN)
    proc = start_snakemake(work, database_url)
    try:
        def progress() -> bool:
            phases = [v["phase"] for v in run_views(database_url, work)]
            return phases.count("succeeded") >= 4 and phases.count("running") == 2
        wait_for(progress, timeout=90, what="the quick jobs done, the slow ones running")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    before = {v["id"] for v in run_views(database_url, work)}
    assert len(before) == 6
    code, output = run_snakemake(work, database_url, "--unlock", timeout=60)
    assert code == 0, output
    code, output = run_snakemake(work, database_url, timeout=180)
    assert code == 0, output
    views = run_views(database_url, work)
    assert (work / "merged.txt").exists()
    rules = sorted(v["labels"]["snakemake/rule"] for v in views)
    assert rules == ["merge", "quick", "quick", "quick", "quick", "slow", "slow"], views
    assert before < {v["id"] for v in views}
    assert all(v["phase"] == "succeeded" and v["attempt"] == 0 for v in views), views
    assert output.count("Resuming dispatch job") >= 2, output
    ran = settled_executions(views, len(views))
    print(f"\nSIGKILL and restart: {output.count('Resuming dispatch job')} jobs re-adopted, "
          f"{len(views)} dispatch jobs, sacct records per job: "
          f"{sorted(len(s) for s in ran.values())}")
    assert all(states == ["COMPLETED"] for states in ran.values()), ran
