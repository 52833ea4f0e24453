"""Issue 9: a job that Slurm requeued, then finished and left squeue while the daemon was
down, is matched in sacct and ends with its real outcome -- on the REAL cluster, with the
daemon as a real process.

The job (``"requeue": true``) waits to be requeued on its first run and exits 0 a few
seconds into its second one. Root requeues it (``scontrol requeue``: restart count 1 and
a NEW submit time, so the daemon's recorded ref no longer matches the live object's
submit time); the daemon is stopped (SIGTERM) while the second run runs; the cluster runs
with ``MinJobAge=10`` for this module, so the ended job leaves squeue soon; once squeue
has forgotten it and sacct shows it COMPLETED, the daemon starts again. It must find the
job in accounting (following the requeue chain from its ref's first submit time) and
finish it ``succeeded`` from sacct -- never unknown, lost, failed or resubmitted -- even
with a short unknown grace.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from controller.client import Client
from controller.store.db import Store
from tests.fault_support import (
    cancel_user_jobs,
    emit,
    executions,
    fault_daemon,
    in_squeue,
    metric_key,
    slurm_up,
    squeue_state,
    views,
    wait_for,
    wait_terminal,
    wrong_writes,
)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

MIN_JOB_AGE = 10
UNKNOWN_GRACE_S = 5  # short: the old code's "unknown, then failed" shows within seconds

# run 0 waits to be requeued; run 1 (SLURM_RESTART_COUNT=1) works a few seconds, exits 0
COMMAND = ["/bin/sh", "-c",
           'if [ "${SLURM_RESTART_COUNT:-0}" -ge 1 ]; then sleep 6; exit 0; fi; sleep 300']


@pytest.fixture(scope="module")
def short_min_job_age() -> Iterator[dict[str, str]]:
    env = slurm_up("--min-job-age", str(MIN_JOB_AGE))
    cancel_user_jobs()
    try:
        yield env
    finally:
        cancel_user_jobs()
        slurm_up()  # slurm-up's defaults again (MinJobAge=300)


def _restart_count(slurm_id: int) -> int | None:
    out = subprocess.run(["squeue", "-h", "-j", str(slurm_id), "-O", "RestartCnt"],
                         capture_output=True, text=True, check=False, timeout=30)
    word = out.stdout.strip()
    return int(word) if out.returncode == 0 and word.isdigit() else None


def _sacct_states(slurm_id: int, name: str) -> list[str]:
    """Every accounting record of ``slurm_id`` named ``name`` (``-D``: the requeued one
    too; ids are reused on this cluster), oldest first."""
    out = subprocess.run(["sacct", "-a", "-X", "-D", "-P", "-n", "-j", str(slurm_id),
                          "-o", "JobName%64,State"], capture_output=True, text=True,
                         check=True, timeout=30).stdout
    rows = [line.split("|", 1) for line in out.splitlines() if "|" in line]
    return [state.split()[0] for job_name, state in rows if job_name == name and state]


def _history(url: str, job_id: str) -> tuple[list[str], list[tuple[int, str, str | None]]]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            events = [str(r[0]) + ": " + str(r[1]) for r in conn.execute(text(
                "SELECT kind, message FROM events WHERE job_id = :j ORDER BY id"), {"j": job_id})]
            subs = [(int(r[0]), str(r[1]), r[2]) for r in conn.execute(text(
                "SELECT submission, status, cause FROM submissions WHERE job_id = :j "
                "ORDER BY submission"), {"j": job_id})]
    finally:
        engine.dispose()
    return events, subs


def test_requeued_job_finished_while_daemon_down(short_min_job_age: dict[str, str],
                                                 tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path}/requeue.db"
    Store(url).migrate()
    client = Client(url)
    job = client.submit({"command": COMMAND, "workdir": "/tmp", "requeue": True,
                         "labels": {"e2e": "requeue-down"}})
    t0 = time.time()
    with fault_daemon(tmp_path, url, unknown_grace_s=UNKNOWN_GRACE_S) as d:
        wait_for(lambda: views(client, [job])[job]["phase"] == "running", timeout=60,
                 what="the job to run")
        slurm_id = int(views(client, [job])[job]["slurm_job_id"])
        subprocess.run(["scontrol", "requeue", str(slurm_id)], check=True, timeout=30)
        wait_for(lambda: _restart_count(slurm_id) == 1
                 and (squeue_state(slurm_id) or ("",))[0] == "PENDING",
                 timeout=30, interval=0.3, what="Slurm to requeue the job (restart count 1)")
        # a requeued job is eligible only 121 s later: let it start now
        subprocess.run(["scontrol", "update", f"JobId={slurm_id}", "StartTime=now"],
                       check=True, timeout=30)
        wait_for(lambda: (squeue_state(slurm_id) or ("",))[0] == "RUNNING", timeout=60,
                 interval=0.3, what="the job's second run to start")
        wait_for(lambda: views(client, [job])[job]["phase"] == "running", timeout=10,
                 interval=0.2, what="the daemon to see the second run")
        d.terminate(timeout=60)  # SIGTERM while the second run runs
        records = d.records()
    down_at = time.time()
    wait_for(lambda: not in_squeue(slurm_id), timeout=MIN_JOB_AGE + 120, interval=1,
             what="the ended job to leave squeue (MinJobAge)")
    wait_for(lambda: _sacct_states(slurm_id, "dj-" + job)[-1:] == ["COMPLETED"], timeout=60,
             interval=1, what="sacct to show the job COMPLETED")
    gone_s = time.time() - down_at
    assert views(client, [job])[job]["phase"] == "running"  # as the daemon left it

    with fault_daemon(tmp_path, url, unknown_grace_s=UNKNOWN_GRACE_S) as d2:
        final = wait_terminal(client, [job], timeout=60)[job]
        # a few more ticks: a wrong ending (lost, resubmitted) would show now
        ok = metric_key("dispatch_ticks_total", result="ok")
        ticks = d2.metric(ok, 0)
        wait_for(lambda: d2.metric(ok, 0) >= ticks + 3, timeout=30, what="three more ticks")
        final = views(client, [job])[job]
        records += d2.records()
    events, subs = _history(url, job)
    sacct = _sacct_states(slurm_id, "dj-" + job)
    recs = executions([job])[job]
    wrong, why_wrong = wrong_writes(records, url)
    emit(f"\nrequeued job {slurm_id} (restart count 1) ended while the daemon was down: "
         f"left squeue {gone_s:.0f}s after the stop; daemon says {final['phase']}/"
         f"{final['cause']} {final['cause_detail']!r}; sacct {sacct}; submissions {subs}; "
         f"{time.time() - t0:.0f}s in all\n  events: {events}", capsys)

    assert (final["phase"], final["cause"]) == ("succeeded", "completed"), (final, events)
    assert final["slurm_job_id"] == slurm_id and final["attempt"] == 0
    assert [s for s, status, _ in subs] == [1] and subs[0][1] == "ended", subs
    kinds = [e.split(":", 1)[0] for e in events]
    assert not {"Lost", "Unknown", "Failed", "Resubmitting"} & set(kinds), events
    assert kinds.count("Submitting") == 1, events
    # Slurm's own requeue: two records of the one Slurm job, nothing submitted again
    assert sacct == ["REQUEUED", "COMPLETED"], sacct
    assert {r.job_id for r in recs} == {slurm_id} and all(r.user == "dispatch" for r in recs)
    assert wrong == 0, why_wrong
