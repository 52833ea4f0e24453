"""Fault 3: the SSH connection is killed mid-tick and mid-Start.

The daemon (a real process) reaches Slurm over SSH as ``dispatch@127.0.0.1:$SSH_PORT``
(host key checked against the cluster's known_hosts). While jobs are written in waves,
two injectors SIGKILL the per-connection children of our sshd -- every open connection
drops at once:

* *mid-Start*: the moment the daemon's recorder logs the start of a Start batch (the
  sh script that runs the sbatch calls), at once or after 30-150 ms, so the connection
  dies before, during or after sbatch -- the outcome of those Starts is unknown;
* *mid-tick*: every 1.5-3 s, whatever the daemon is doing (squeue, sacct, release);
* halfway through, sshd itself is stopped for ``DISPATCH_FAULT_SSHD_DOWN_S`` (6) seconds,
  so reconnect attempts fail and must back off.

The runner must reconnect with backoff (log: ``ssh connect failed`` ... ``ssh connected``);
an ambiguous Start must be resolved by rediscovery (log: ``start outcome unknown;
rediscovering by name``; events ``Submitted``/``Adopted``), never by a blind second
sbatch: a job with a second Slurm record must have had its first intent abandoned after
the adopt window, and no second record may ever have started. Every job runs once.
"""

from __future__ import annotations

import json
import random
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from controller.client import Client
from controller.store.db import Store
from tests.fault_support import (
    FaultRow,
    emit,
    event_counts,
    executions,
    fault_daemon,
    intents_left,
    kill_ssh_sessions,
    knob,
    metric_key,
    record_row,
    recorded_executions,
    restore_cluster,
    slurm_ctl,
    slurm_up,
    tally,
    wait_for,
    wait_healthy_tick,
    wait_terminal,
    write_count,
    wrong_writes,
)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

JOBS = knob("SSH_JOBS", 16)
KILL_S = knob("SSH_KILL_S", 25)
SSHD_DOWN_S = knob("SSHD_DOWN_S", 6)
WAVE = 4


@pytest.fixture(scope="module")
def cluster() -> Iterator[dict[str, str]]:
    restore_cluster()
    env = slurm_up()
    yield env
    restore_cluster()


class Killer(threading.Thread):
    """Both injectors: kill at each new Start batch (after a random delay), and every
    1.5-3 s regardless."""

    def __init__(self, record: Path, rng: random.Random) -> None:
        super().__init__(daemon=True)
        self.record = record
        self.rng = rng
        self.stop_event = threading.Event()
        self.paused = threading.Event()
        self.mid_start = 0
        self.mid_tick = 0
        self.connections_killed = 0
        self.last_kill = 0.0

    def _kill(self) -> None:
        self.connections_killed += kill_ssh_sessions()
        self.last_kill = time.time()

    def run(self) -> None:
        offset = 0
        next_tick_kill = time.monotonic() + self.rng.uniform(1.5, 3.0)
        while not self.stop_event.is_set():
            starts = 0
            if self.record.exists():
                with self.record.open() as handle:
                    handle.seek(offset)
                    chunk = handle.read()
                    offset += len(chunk.encode())
                for line in chunk.splitlines():
                    try:
                        entry = json.loads(line)
                    except ValueError:
                        continue
                    if entry.get("phase") == "begin" and entry.get("sbatch"):
                        starts += 1
            if self.paused.is_set():
                time.sleep(0.05)
                continue
            if starts:
                # every other time at once (before sbatch can run), else a little later
                # (during or after sbatch, before the read-back)
                time.sleep(0.0 if self.mid_start % 2 == 0 else self.rng.uniform(0.03, 0.15))
                self._kill()
                self.mid_start += 1
            elif time.monotonic() >= next_tick_kill:
                self._kill()
                self.mid_tick += 1
                next_tick_kill = time.monotonic() + self.rng.uniform(1.5, 3.0)
            time.sleep(0.02)

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=30)


def _abandoned_jobs(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT DISTINCT job_id FROM events "
                                     "WHERE kind = 'Abandoned'")).all()
    finally:
        engine.dispose()
    return {str(r[0]) for r in rows}


def test_ssh_connection_killed_mid_tick_and_mid_start(cluster: dict[str, str], tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    url = f"sqlite:///{tmp_path}/ssh.db"
    Store(url).migrate()
    client = Client(url)
    rng = random.Random(20261130)
    ids: list[str] = []
    with fault_daemon(tmp_path, url, transport="ssh", env=cluster) as d:
        wait_for(lambda: d.metrics().get(metric_key("dispatch_slurm_up")) == 1.0, timeout=30,
                 what="the daemon to reach Slurm over SSH")
        killer = Killer(d.record, rng)
        killer.start()
        began = time.time()
        sshd_down = False
        try:
            while time.time() - began < KILL_S:
                if len(ids) < JOBS:
                    for _ in range(min(WAVE, JOBS - len(ids))):
                        ids.append(client.submit({
                            "command": ["/bin/sh", "-c", f"sleep {rng.choice([1, 2, 3])}"],
                            "workdir": "/tmp", "labels": {"fault": "ssh"}}))
                if not sshd_down and time.time() - began > KILL_S / 2:
                    # the host refuses connections for a while: reconnects back off
                    sshd_down = True
                    killer.paused.set()
                    slurm_ctl("stop", "sshd")
                    killer.connections_killed += kill_ssh_sessions()
                    time.sleep(SSHD_DOWN_S)
                    slurm_ctl("start", "sshd")
                    killer.last_kill = time.time()
                    killer.paused.clear()
                time.sleep(rng.uniform(2.0, 4.0))
        finally:
            killer.stop()
            slurm_ctl("start", "sshd")
        fault_end = max(killer.last_kill, began)
        recovery_s = wait_healthy_tick(d, fault_end, timeout=120)
        final = wait_terminal(client, ids, timeout=240)
        converged_s = time.time() - fault_end
        log = d.log_text()
        records = d.records()
    outcome = tally(dict.fromkeys(ids, "succeeded"), final,
                    recorded_executions(ids, final))
    wrong, why_wrong = wrong_writes(records, url)
    events = event_counts(url, ("Submitted", "Adopted", "Abandoned", "Duplicate",
                                "ActionFailed"))
    abandoned = _abandoned_jobs(url)
    recs = executions(ids)
    blind = [j for j in ids if len([r for r in recs[j] if r.user == "dispatch"]) > 1
             and j not in abandoned]
    sbatches = sum(e.get("sbatch", 0) for e in records
                   if e.get("phase") == "begin" and e.get("kind") == "script")
    rediscoveries = log.count("start outcome unknown; rediscovering by name")
    connects = log.count('"ssh connected"')
    connect_failures = log.count('"ssh connect failed"')
    backoffs = [float(m) for m in re.findall(r'retry_in_s=([0-9.]+)', log)]
    record_row(FaultRow(
        fault="3 SSH connection killed", jobs_in_flight=len(ids), lost=len(outcome.lost),
        duplicates=outcome.duplicate_executions, wrong_writes=wrong, recovery_s=recovery_s,
        notes=(f"{killer.mid_start} kills mid-Start + {killer.mid_tick} mid-tick "
               f"({killer.connections_killed} sshd sessions) in {KILL_S}s; {connects} "
               f"reconnects; sshd down {SSHD_DOWN_S}s: {connect_failures} failed connects, "
               f"backoff {', '.join(f'{b:.1f}' for b in backoffs[:8])}s; "
               f"{rediscoveries} ambiguous Starts rediscovered; events {events}; "
               f"{sbatches} sbatch for {len(ids)} jobs, {outcome.records} Slurm records "
               f"({outcome.extra_records} never started); blind second sbatch: {len(blind)}; "
               f"converged {converged_s:.0f}s after the last kill"
               f"; {write_count(records)} Slurm writes judged, "
               f"{wrong} wrong")), capsys)
    emit(f"fault 3 wrong writes: {why_wrong}", capsys)

    assert killer.mid_start >= 1 and killer.mid_tick >= 1
    assert connects >= 2
    assert connect_failures >= 2 and max(backoffs) > min(backoffs)  # it backed off
    assert outcome.lost == [] and outcome.duplicates == {} and wrong == 0, (outcome, why_wrong)
    assert blind == []
    assert intents_left(url) == 0
