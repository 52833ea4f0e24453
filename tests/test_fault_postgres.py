"""Fault 4: PostgreSQL restarted under load.

The daemon (a real process) runs on PostgreSQL as a role with a password; a client thread
keeps writing jobs (each ``Client.submit`` is one transaction; only the ones that returned
are *acknowledged*). PostgreSQL is restarted (``pg_ctlcluster ... restart -m fast``) and
then stopped for a few seconds and started again, ``DISPATCH_FAULT_PG_RESTARTS`` (2) times
in all, while jobs are being written, submitted and reconciled.

The daemon must reconnect (it leads again and ticks), no acknowledged record may be lost,
every job that is in the database runs exactly once, and no half-written submission
survives: no submission row is left an ``intent``, every submitted/ended row names its
Slurm job, and every job's current submission exists. The database password never appears
in the daemon's log or its metrics, not even in the errors of the outage.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from controller.client import Client
from controller.model.ids import new_job_id
from controller.store.db import Store
from tests.fault_support import (
    FaultRow,
    emit,
    fault_daemon,
    intents_left,
    knob,
    metric_key,
    metrics_text,
    pg_ctl,
    pg_ready,
    pg_role_database,
    record_row,
    recorded_executions,
    restore_cluster,
    slurm_up,
    tally,
    wait_for,
    wait_terminal,
    write_count,
    wrong_writes,
)

pytestmark = [pytest.mark.slurm, pytest.mark.postgres, pytest.mark.slow]

SUBMIT_S = knob("PG_SUBMIT_S", 24)
RESTARTS = knob("PG_RESTARTS", 2)
PG_DOWN_S = knob("PG_DOWN_S", 4)


@pytest.fixture(scope="module")
def cluster() -> Iterator[dict[str, str]]:
    restore_cluster()
    env = slurm_up()
    yield env
    if not pg_ready():
        pg_ctl("start")
    restore_cluster()


class Submitter(threading.Thread):
    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.stop_event = threading.Event()
        self.acked: list[str] = []
        self.unknown: list[str] = []  # the commit's outcome was not reported
        self.errors: dict[str, int] = {}

    def run(self) -> None:
        client = Client(self.url)
        try:
            while not self.stop_event.is_set():
                job_id = new_job_id()
                try:
                    client.submit({"command": ["/bin/sleep", "1"], "workdir": "/tmp",
                                   "labels": {"fault": "postgres"}}, job_id=job_id)
                except Exception as exc:  # the database is restarting: outcome unknown
                    self.unknown.append(job_id)
                    name = type(exc).__name__
                    self.errors[name] = self.errors.get(name, 0) + 1
                    time.sleep(0.3)
                    continue
                self.acked.append(job_id)
                time.sleep(0.25)
        finally:
            client.close()

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=60)


def _consistency(url: str) -> list[str]:
    """Half-written state: intents, submitted rows without a Slurm job, dangling currents."""
    engine = create_engine(url)
    problems: list[str] = []
    try:
        with engine.connect() as conn:
            for row in conn.execute(text(
                    "SELECT job_id, submission, status, slurm_job_id FROM submissions")):
                if row.status == "intent":
                    problems.append(f"intent left: {row.job_id} s{row.submission}")
                if row.status in ("submitted", "ended") and row.slurm_job_id is None:
                    problems.append(f"{row.status} without a Slurm job: {row.job_id}")
            for row in conn.execute(text(
                    "SELECT s.job_id, s.current_submission FROM job_status s WHERE "
                    "s.current_submission IS NOT NULL AND NOT EXISTS (SELECT 1 FROM "
                    "submissions b WHERE b.job_id = s.job_id AND "
                    "b.submission = s.current_submission)")):
                problems.append(f"current submission missing: {row.job_id}")
    finally:
        engine.dispose()
    return problems


def _present(url: str, ids: list[str]) -> set[str]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            found = {str(r[0]) for r in conn.execute(text("SELECT id FROM jobs"))}
    finally:
        engine.dispose()
    return found & set(ids)


def test_postgres_restarted_under_load(cluster: dict[str, str], tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    password = "Fault-" + os.urandom(9).hex()
    with pg_role_database(password) as url:
        Store(url).migrate()
        with fault_daemon(tmp_path, url) as d:
            wait_for(lambda: d.metrics().get(metric_key("dispatch_leader")) == 1.0, timeout=30,
                     what="the daemon to lead")
            submitter = Submitter(url)
            submitter.start()
            began = time.time()
            outages: list[float] = []
            try:
                for n in range(RESTARTS):
                    time.sleep(SUBMIT_S / (RESTARTS + 1))
                    t0 = time.time()
                    if n % 2 == 0:
                        pg_ctl("restart")
                    else:
                        pg_ctl("stop")
                        time.sleep(PG_DOWN_S)
                        pg_ctl("start")
                    outages.append(time.time() - t0)
                back_at = time.time()
                time.sleep(max(0.0, SUBMIT_S - (time.time() - began)))
            finally:
                submitter.stop()
                if not pg_ready():
                    pg_ctl("start")
            in_flight = len(submitter.acked) + len(submitter.unknown)

            def leads_and_ticks() -> bool:
                m = d.metrics()
                tick = m.get(metric_key("dispatch_last_successful_tick_timestamp_seconds"), 0.0)
                return m.get(metric_key("dispatch_leader")) == 1.0 and tick > back_at
            wait_for(leads_and_ticks, timeout=120, interval=0.25,
                     what="the daemon to lead and tick again")
            recovery_s = time.time() - back_at
            present = _present(url, submitter.acked + submitter.unknown)
            client = Client(url)
            final = wait_terminal(client, sorted(present), timeout=240)
            converged_s = time.time() - back_at
            client.close()
            log = d.log_text()
            page = metrics_text(d.port)
            records = d.records()
            alive = d.alive()
        lost_records = [j for j in submitter.acked if j not in present]
        unknown_present = [j for j in submitter.unknown if j in present]
        outcome = tally(dict.fromkeys(present, "succeeded"), final,
                        recorded_executions(present, final))
        wrong, why_wrong = wrong_writes(records, url)
        half_written = _consistency(url)
        intents = intents_left(url)
    leaked = password in log or password in page
    tick_failures = log.count('"tick failed"') + log.count('"tick crashed"')
    leadership_lost = log.count("leadership dropped")
    listen_retries = log.count("listen connection failed")
    record_row(FaultRow(
        fault="4 PostgreSQL restarted", jobs_in_flight=in_flight,
        lost=len(lost_records) + len(outcome.lost), duplicates=outcome.duplicate_executions,
        wrong_writes=wrong, recovery_s=recovery_s,
        notes=(f"{RESTARTS} restarts/outages ({', '.join(f'{o:.1f}s' for o in outages)}) "
               f"during {SUBMIT_S}s of writes: {len(submitter.acked)} acknowledged (all "
               f"present), {len(submitter.unknown)} failed writes "
               f"({submitter.errors}), of them {len(unknown_present)} committed anyway; "
               f"daemon: {tick_failures} ticks failed on the database, leadership dropped "
               f"{leadership_lost}x and retaken, LISTEN reconnected {listen_retries}x; "
               f"half-written submissions {len(half_written)}, intents {intents}; "
               f"password in log/metrics: {leaked}; converged {converged_s:.0f}s after "
               "the last restart"
               f"; {write_count(records)} Slurm writes judged, "
               f"{wrong} wrong")), capsys)
    emit(f"fault 4 problems: lost records {lost_records}, half-written {half_written[:5]}, "
         f"wrong writes {why_wrong}", capsys)

    assert alive and "tick crashed" not in log
    assert len(submitter.acked) >= 10
    assert lost_records == [] and outcome.lost == [] and outcome.duplicates == {}
    assert wrong == 0, why_wrong
    assert half_written == [] and intents == 0
    assert not leaked, "the database password appeared in the daemon's log or metrics"
