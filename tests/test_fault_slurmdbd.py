"""Fault 2: slurmdbd (accounting) stopped while jobs end and leave squeue.

The cluster runs with ``MinJobAge=5`` for this module (``scripts/slurm-up --min-job-age 5``,
restored afterwards), so a finished job leaves slurmctld's memory within seconds and only
sacct -- which needs slurmdbd -- could tell how it ended. The jobs run; the daemon is
stopped (SIGTERM) and slurmdbd with it; the jobs end and leave squeue; the daemon starts
again while accounting is still down. The daemon (a real process,
``unknown_grace_s = 600``) must keep those jobs in their previous phase (running, never
succeeded or failed on missing data) with the ``Observed`` condition ``Unknown`` and
``dispatch_slurm_accounting_up`` 0, resubmit nothing, and let two jobs whose policy says
``unknown_grace_s: 10`` end by that policy (failed, cause unknown -- never resubmitted).
When slurmdbd is back, every other job converges to succeeded, each executed once.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controller.client import Client
from controller.store.db import Store
from tests.fault_support import (
    FaultRow,
    emit,
    event_counts,
    fault_daemon,
    in_squeue,
    intents_left,
    knob,
    metric_key,
    record_row,
    recorded_executions,
    restore_cluster,
    slurm_ctl,
    slurm_up,
    submissions_per_job,
    tally,
    views,
    wait_for,
    wait_terminal,
    write_count,
    wrong_writes,
)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

JOBS = knob("SLURMDBD_JOBS", 4)
GRACE_JOBS = 2
GRACE_S = 10


@pytest.fixture(scope="module")
def cluster() -> Iterator[dict[str, str]]:
    restore_cluster()
    env = slurm_up("--min-job-age", "5")
    yield env
    restore_cluster()  # slurm-up's defaults again, slurmdbd running


def _doc(seconds: int) -> dict[str, object]:
    return {"command": ["/bin/sleep", str(seconds)], "workdir": "/tmp",
            "labels": {"fault": "slurmdbd"}}


def _observed(view: dict[str, Any]) -> tuple[bool, str] | None:
    for cond in view["conditions"]:
        if cond["type"] == "Observed":
            return bool(cond["status"]), str(cond["reason"])
    return None


def test_slurmdbd_down_jobs_stay_unknown(cluster: dict[str, str], tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path}/slurmdbd.db"
    accounting_up = metric_key("dispatch_slurm_accounting_up")
    Store(url).migrate()
    client = Client(url)
    normal = [client.submit(_doc(6)) for _ in range(JOBS)]
    graced = [client.submit(_doc(6), policy={"unknown_grace_s": GRACE_S})
              for _ in range(GRACE_JOBS)]
    ended_early = normal + graced
    with fault_daemon(tmp_path, url, unknown_grace_s=600) as d:
        wait_for(lambda: all(v["phase"] == "running"
                             for v in views(client, ended_early).values()),
                 timeout=90, what="the jobs to run")
        slurm_ids = {i: v["slurm_job_id"] for i, v in views(client, ended_early).items()}

        # The daemon ticks every second and would see each job end in squeue before
        # MinJobAge passes; it is down (restarted at 3 a.m., say) while the jobs end and
        # leave squeue, so only accounting could tell how they ended.
        assert d.terminate(timeout=60) == 0
        stopped_at = time.time()
        slurm_ctl("stop", "slurmdbd")
        written = [client.submit(_doc(1)) for _ in range(2)]  # submitted without accounting
        wait_for(lambda: not any(in_squeue(s) for s in slurm_ids.values()), timeout=120,
                 interval=1, what="the finished jobs to leave squeue (MinJobAge=5)")
        left_queue_s = time.time() - stopped_at
        d.start()
        wait_for(lambda: "dispatch_ticks_total" in "".join(d.metrics()), timeout=60,
                 what="the daemon to come back")

        def unknown_now() -> bool:
            vs = views(client, normal)
            return all(_observed(v) == (False, "Unknown") for v in vs.values())
        wait_for(unknown_now, timeout=60, what="the daemon to mark the jobs unknown")
        wait_for(lambda: all(v["phase"] == "failed" for v in views(client, graced).values()),
                 timeout=GRACE_S + 60, what="the grace policy to end the graced jobs")
        time.sleep(5)  # a few more ticks with accounting down
        during = views(client, normal)
        graced_during = views(client, graced)
        metrics_down = d.metrics()
        submitted_down = submissions_per_job(url)
        outage_s = time.time() - stopped_at

        started_at = time.time()
        slurm_ctl("start", "slurmdbd")
        def accounting_read() -> bool:
            m = d.metrics()
            tick = m.get(metric_key("dispatch_last_successful_tick_timestamp_seconds"), 0)
            return m.get(accounting_up) == 1.0 and tick > started_at
        wait_for(accounting_read, timeout=120, interval=0.5, what="accounting to be read again")
        recovery_s = time.time() - started_at
        final = wait_terminal(client, normal + written, timeout=180)
        converged_s = time.time() - started_at
        final.update(views(client, graced))
        records = d.records()
    ids = normal + graced + written
    expected: dict[str, str | set[str]] = dict.fromkeys(normal + written, "succeeded")
    expected.update(dict.fromkeys(graced, "failed"))
    outcome = tally(expected, final, recorded_executions(ids, final))
    wrong, why_wrong = wrong_writes(records, url)
    events = event_counts(url, ("Resubmitting", "Unknown", "Abandoned", "Duplicate"))
    submitted = submissions_per_job(url)
    record_row(FaultRow(
        fault="2 slurmdbd down", jobs_in_flight=len(ids), lost=len(outcome.lost),
        duplicates=outcome.duplicate_executions, wrong_writes=wrong, recovery_s=recovery_s,
        notes=(f"accounting down {outage_s:.0f}s; {len(normal)} jobs left squeue "
               f"{left_queue_s:.0f}s in and stayed running/Observed=Unknown "
               f"(accounting_up={metrics_down.get(accounting_up):.0f}); "
               f"{len(graced)} with unknown_grace_s={GRACE_S} ended failed/unknown by policy; "
               f"{sum(submitted.values())} submissions for {len(ids)} jobs, "
               f"events {events}; converged {converged_s:.0f}s after slurmdbd returned"
               f"; {write_count(records)} Slurm writes judged, "
               f"{wrong} wrong")),
        capsys)
    emit(f"fault 2 wrong writes: {why_wrong}", capsys)

    assert {v["phase"] for v in during.values()} == {"running"}
    assert all(_observed(v) == (False, "Unknown") for v in during.values())
    assert metrics_down[accounting_up] == 0.0
    assert {(v["phase"], v["cause"]) for v in graced_during.values()} == {("failed", "unknown")}
    assert submitted_down == dict.fromkeys(ids, 1)  # nothing was submitted a second time
    assert submitted == dict.fromkeys(ids, 1)
    assert events["Resubmitting"] == 0
    assert outcome.lost == [] and outcome.duplicates == {} and wrong == 0, (outcome, why_wrong)
    assert intents_left(url) == 0
