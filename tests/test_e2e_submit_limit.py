"""Issue 9: a submit limit is back-pressure, not failure, on the REAL cluster.

``sacctmgr modify user dispatch set MaxSubmitJobs=5`` (``scripts/slurm-up`` runs the
cluster with ``AccountingStorageEnforce=associations,limits,qos``, so slurmctld enforces
it: the sixth sbatch is refused with ``AssocMaxSubmitJobLimit``). 30 jobs are written;
the daemon (a real ``dispatchctl run`` process) must keep the refused ones pending and
submit them as room appears: all 30 succeed, none fails, each runs exactly once, and a
thread sampling ``squeue -u dispatch`` a few times a second never sees more than 5 of the
user's jobs. The limit is restored (``MaxSubmitJobs=-1``) whatever happens.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.client import Client
from controller.store.db import Store
from tests.fault_support import (
    cancel_user_jobs,
    emit,
    event_counts,
    executions,
    fault_daemon,
    recorded_executions,
    slurm_up,
    tally,
    views,
    wait_for,
    wait_terminal,
    wrong_writes,
)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

LIMIT = 5
JOBS = 30
USER = "dispatch"


def _assoc_max_submit(user: str) -> str:
    """``MaxSubmitJobs=...`` of ``user``'s association as slurmctld holds it (assoc_mgr):
    "" when unlimited, else the limit."""
    out = subprocess.run(["scontrol", "show", "assoc_mgr", "flags=assoc", f"users={user}"],
                         capture_output=True, text=True, check=True, timeout=30).stdout
    block = out.split(f"UserName={user}(", 1)
    if len(block) < 2:
        return "?"
    for word in block[1].split():
        if word.startswith("MaxSubmitJobs="):
            return word.split("=", 1)[1].split("(", 1)[0]
    return "?"


def _set_max_submit(value: int) -> None:
    subprocess.run(["sacctmgr", "-i", "modify", "user", USER, "set", f"MaxSubmitJobs={value}"],
                   check=True, capture_output=True, text=True, timeout=60)
    want = "" if value < 0 else str(value)
    wait_for(lambda: _assoc_max_submit(USER) == want, timeout=30, interval=0.2,
             what=f"slurmctld to hold MaxSubmitJobs={want or 'unlimited'} for {USER}")


@pytest.fixture
def submit_limit() -> Iterator[int]:
    slurm_up()  # default options; AccountingStorageEnforce=associations,limits,qos
    cancel_user_jobs()
    wait_for(lambda: not _queue(), timeout=60, what=f"{USER}'s queue to empty")
    _set_max_submit(LIMIT)
    try:
        yield LIMIT
    finally:
        _set_max_submit(-1)
        cancel_user_jobs()


def _queue() -> list[tuple[str, str]]:
    """(name, state) of every job of ``USER`` that squeue lists (its default states)."""
    out = subprocess.run(["squeue", "-h", "-u", USER, "-o", "%j|%T"], capture_output=True,
                         text=True, check=True, timeout=30).stdout
    return [tuple(line.split("|", 1)) for line in out.splitlines() if "|" in line]  # type: ignore[misc]


class QueueSampler(threading.Thread):
    """Polls ``squeue -u dispatch`` until stopped; keeps the largest counts seen."""

    def __init__(self, names: set[str]) -> None:
        super().__init__(daemon=True)
        self.names = names
        self.stop = threading.Event()
        self.samples = 0
        self.max_user = 0
        self.max_ours = 0
        self.worst: list[tuple[str, str]] = []

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                queue = _queue()
            except (subprocess.SubprocessError, OSError):
                queue = None
            if queue is not None:
                self.samples += 1
                ours = sum(1 for name, _ in queue if name in self.names)
                if len(queue) > self.max_user:
                    self.max_user, self.worst = len(queue), queue
                self.max_ours = max(self.max_ours, ours)
            self.stop.wait(0.25)


def test_submit_limit_is_back_pressure(submit_limit: int, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path}/limit.db"
    Store(url).migrate()
    client = Client(url)
    # a short backoff keeps the test quick; the planner caps its deferral delay by it
    policy = {"backoff": {"initial_s": 1, "factor": 2, "max_s": 4}}
    t0 = time.time()
    with fault_daemon(tmp_path, url) as d:
        ids: list[str] = []
        sampler = QueueSampler(set())
        sampler.start()
        try:
            for i in range(JOBS):
                ids.append(client.submit({"command": ["/bin/sh", "-c", f"echo {i}; sleep 1"],
                                          "workdir": "/tmp", "labels": {"e2e": "limit"}},
                                         policy=policy))
                sampler.names.add("dj-" + ids[-1])
            final = wait_terminal(client, ids, timeout=240)
        finally:
            sampler.stop.set()
            sampler.join(timeout=10)
        done = [i for i, v in final.items() if v["phase"] == "succeeded"]
        wait_for(lambda: all(executions(done).values()), timeout=60,
                 what="accounting to record every execution")
        records = d.records()
    took = time.time() - t0
    outcome = tally(dict.fromkeys(ids, "succeeded"), final,
                    recorded_executions(ids, final))
    wrong, why_wrong = wrong_writes(records, url)
    events = event_counts(url, ["SubmitDeferred", "Failed", "Resubmitting"])
    phases = sorted({v["phase"] for v in final.values()})
    budgets_spent = [i for i, v in views(client, ids).items() if v["attempt"] != 0]
    emit(f"\nsubmit limit {submit_limit}: {JOBS} jobs in {took:.0f}s, phases {phases}, "
         f"max {sampler.max_user} of {USER}'s jobs in squeue ({sampler.max_ours} ours) over "
         f"{sampler.samples} samples; events {events}; {outcome.executed} executions, "
         f"{outcome.duplicate_executions} duplicates, {wrong} wrong writes", capsys)

    assert phases == ["succeeded"], {i: (v["phase"], v["cause"], v["cause_detail"])
                                     for i, v in final.items() if v["phase"] != "succeeded"}
    assert sampler.samples > 20
    assert events["SubmitDeferred"] > 0, "the limit never refused a submission"
    assert events["Failed"] == 0 and events["Resubmitting"] == 0
    assert budgets_spent == []  # a deferral spends no attempt
    assert outcome.lost == [] and outcome.duplicates == {}
    assert wrong == 0, why_wrong
    assert sampler.max_user <= submit_limit, sampler.worst
