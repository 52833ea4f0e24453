"""Fault 1: slurmctld stopped for ``DISPATCH_FAULT_SLURMCTLD_DOWN_S`` (60) seconds while the
daemon (a real ``dispatchctl run`` process, local transport as user ``dispatch``) ticks,
then started again.

Jobs in flight: some run through the whole outage, some end during it (slurmd reports
them once slurmctld is back), and some are written by the client while Slurm is down.
The daemon must keep running (``/healthz``), report Slurm unreachable (metric
``dispatch_slurm_up`` 0 and ticks counted ``slurm-unreachable``, ``/readyz`` 503 once no
tick has succeeded for 30 s, a log line), change no job on missing data (every
``job_status`` row identical through the outage), and converge after the restart: every
job succeeded, each executed exactly once, no Slurm write aimed at anything else.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.client import Client
from controller.store.db import Store
from tests.fault_support import (
    FaultRow,
    emit,
    fault_daemon,
    http_status,
    intents_left,
    knob,
    metric_key,
    record_row,
    recorded_executions,
    restore_cluster,
    slurm_ctl,
    slurm_up,
    status_snapshot,
    tally,
    views,
    wait_for,
    wait_healthy_tick,
    wait_terminal,
    write_count,
    wrong_writes,
)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

DOWN_S = knob("SLURMCTLD_DOWN_S", 60)


@pytest.fixture(scope="module")
def cluster() -> Iterator[dict[str, str]]:
    env = slurm_up()
    restore_cluster()
    yield env
    restore_cluster()


def _doc(seconds: int) -> dict[str, object]:
    return {"command": ["/bin/sleep", str(seconds)], "workdir": "/tmp",
            "labels": {"fault": "slurmctld"}}


def test_slurmctld_down_during_ticks(cluster: dict[str, str], tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path}/slurmctld.db"
    Store(url).migrate()
    client = Client(url)
    through = [client.submit(_doc(DOWN_S + 15)) for _ in range(3)]  # run through the outage
    ending = [client.submit(_doc(8)) for _ in range(3)]  # end while slurmctld is down
    with fault_daemon(tmp_path, url) as d:
        wait_for(lambda: all(v["phase"] == "running"
                             for v in views(client, through + ending).values()),
                 timeout=90, what="the first jobs to run")
        in_flight = len(through) + len(ending)
        phases_before = {i: v["phase"] for i, v in views(client, through + ending).items()}

        stopped_at = time.time()
        slurm_ctl("stop", "slurmctld")
        written = [client.submit(_doc(2)) for _ in range(3)]  # written while Slurm is down
        in_flight += len(written)
        wait_for(lambda: d.metrics().get(metric_key("dispatch_slurm_up")) == 0.0, timeout=DOWN_S,
                 interval=0.5, what="the daemon to report Slurm unreachable")
        unreachable_after = time.time() - stopped_at
        snapshot = status_snapshot(url)
        health: set[int] = set()
        ready: set[tuple[int, str]] = set()
        while time.time() - stopped_at < DOWN_S:
            assert d.alive(), "the daemon died while slurmctld was down"
            health.add(http_status(d.port, "/healthz")[0])
            code, why = http_status(d.port, "/readyz")
            ready.add((code, why.strip()))
            time.sleep(1)
        metrics_down = d.metrics()
        unchanged = status_snapshot(url) == snapshot
        phases_during = {i: v["phase"] for i, v in views(client, through + ending).items()}
        new_status = {i: v["phase"] for i, v in views(client, written).items()}

        started_at = time.time()
        slurm_ctl("start", "slurmctld")
        recovery_s = wait_healthy_tick(d, started_at, timeout=120)
        final = wait_terminal(client, through + ending + written, timeout=DOWN_S + 180)
        converged_s = time.time() - started_at
        log = d.log_text()
        records = d.records()
        alive = d.alive()

    ids = through + ending + written
    outcome = tally(dict.fromkeys(ids, "succeeded"), final,
                    recorded_executions(ids, final))
    wrong, why_wrong = wrong_writes(records, url)
    unreachable_ticks = metrics_down.get(
        metric_key("dispatch_ticks_total", result="slurm-unreachable"), 0)
    record_row(FaultRow(
        fault=f"1 slurmctld down {DOWN_S}s", jobs_in_flight=in_flight, lost=len(outcome.lost),
        duplicates=outcome.duplicate_executions, wrong_writes=wrong, recovery_s=recovery_s,
        notes=(f"reported unreachable {unreachable_after:.0f}s after the stop "
               f"({unreachable_ticks:.0f} unreachable ticks, slurm_up=0, /readyz "
               f"{sorted({c for c, _ in ready})}); job_status unchanged through the outage: "
               f"{unchanged}; converged {converged_s:.0f}s after the restart; "
               f"{outcome.records} Slurm records, {outcome.executed} executions"
               f"; {write_count(records)} Slurm writes judged, "
               f"{wrong} wrong")), capsys)
    emit(f"fault 1 readiness during the outage: {sorted(ready)}; wrong writes: {why_wrong}",
         capsys)

    assert alive and health == {200}
    assert metrics_down[metric_key("dispatch_slurm_up")] == 0.0 and unreachable_ticks >= 1
    assert "slurm live read failed; no job with a status changes this tick" in log
    if DOWN_S >= 45:
        assert any(code == 503 for code, _ in ready), ready
    assert unchanged, "a job's status changed on missing data"
    assert phases_during == phases_before
    assert set(new_status.values()) <= {"pending"}  # written, never acted on while down
    assert outcome.lost == [] and outcome.duplicates == {} and wrong == 0, why_wrong
    assert intents_left(url) == 0
