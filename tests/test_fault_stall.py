"""Fault 8: the leader stalls (SIGSTOP) while jobs flow, and wakes up (SIGCONT) after a
standby took its lease.

Two recorded daemons (real processes) share one database: PostgreSQL, and one SQLite
file. 50 jobs flow: some are written before the stall, the rest while the leader is
stopped. The standby must take over within the lease TTL plus a tick or two; after SIGCONT
the old leader must write nothing more: no Slurm write (every command it runs is
recorded), no submission under its epoch, and its log must say it stood down. sacct must
show every job executed exactly once.

PostgreSQL runs the shipped lease (TTL 30 s) and a 60 s stall; the SQLite row a shorter
lease and stall to keep CI fast (``DISPATCH_FAULT_STALL_*`` change them).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.client import Client
from controller.store.db import Store
from tests.fault_support import (
    FaultRow,
    fault_daemon,
    http_status,
    metric_key,
    query,
    record_row,
    recorded_executions,
    restore_cluster,
    slurm_up,
    tally,
    wait_for,
    wait_terminal,
    wrong_writes,
)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

JOBS = 50
SETTINGS = {  # backend -> (lease TTL, stall), seconds
    "postgresql": (int(os.environ.get("DISPATCH_FAULT_STALL_PG_TTL_S", "30")),
                   int(os.environ.get("DISPATCH_FAULT_STALL_PG_S", "60"))),
    "sqlite": (int(os.environ.get("DISPATCH_FAULT_STALL_SQLITE_TTL_S", "10")),
               int(os.environ.get("DISPATCH_FAULT_STALL_SQLITE_S", "25"))),
}


@pytest.fixture(scope="module")
def cluster() -> Iterator[dict[str, str]]:
    restore_cluster()
    env = slurm_up()
    yield env
    restore_cluster()


@pytest.fixture(params=["postgresql", "sqlite"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "postgresql":
        url = request.getfixturevalue("pg_url")
        yield url
    else:
        yield f"sqlite:///{tmp_path / 'shared.db'}"


def _doc(i: int) -> dict[str, object]:
    return {"name": f"stall-{i}", "command": ["sh", "-c", "sleep 1"], "workdir": "/tmp",
            "resources": {"time_limit_s": 120}}


def _lease(url: str) -> tuple[str, int]:
    rows = query(url, "SELECT holder, epoch FROM leases")
    assert rows, "no lease row"
    return str(rows[0][0]), int(rows[0][1])


def _ready(port: int) -> tuple[int, str]:
    code, body = http_status(port, "/readyz")
    return code, body.strip()


def _submissions_since(url: str, epoch: int, since: float) -> int:
    return int(query(url, "SELECT count(*) FROM submissions WHERE epoch = :e "
                          "AND created_at >= :t", {"e": epoch, "t": int(since)})[0][0] or 0)


def test_stalled_leader_stands_down_without_writing(cluster: dict[str, str], tmp_path: Path,
                                                    database: str,
                                                    ) -> None:
    backend = "postgresql" if database.startswith("postgresql") else "sqlite"
    ttl, stall = SETTINGS[backend]
    Store(database).migrate()
    client = Client(database)
    extra = f"lease_ttl_s = {ttl}\nlease_margin_s = {max(2, ttl // 6)}"
    leader = metric_key("dispatch_leader")
    submissions = metric_key("dispatch_submissions_total")
    ticks_ok = metric_key("dispatch_ticks_total", result="ok")
    with fault_daemon(tmp_path, database, extra=extra) as first:
        wait_for(lambda: first.metric(leader) == 1.0, timeout=60,
                 what="the first daemon to lead")
        with fault_daemon(tmp_path, database, extra=extra) as second:
            wait_for(lambda: "standby" in http_status(second.port, "/readyz")[1], timeout=30,
                     what="the second daemon to stand by")
            ids = [client.submit(_doc(i)) for i in range(JOBS // 2)]
            if backend == "postgresql":
                # stop it in the middle of its burst of submissions: it may hold the lease
                # row's lock, which the server takes back (idle_in_transaction timeout)
                wait_for(lambda: first.metric(submissions, 0) >= 5,
                         timeout=60, what="the leader to submit some jobs")
            else:
                # SQLite: a process stopped inside a write transaction keeps the whole file
                # locked until it resumes (no server can take the lock back): stop it
                # right after a tick, when it holds no transaction (README, SQLite)
                wait_for(lambda: first.metric(submissions, 0) >= JOBS // 2,
                         timeout=120, what="the leader to submit the first jobs")
                ticks = first.metric(ticks_ok, 0)
                wait_for(lambda: first.metric(ticks_ok, 0) > ticks,
                         timeout=30, interval=0.05, what="a tick to end")
            old_epoch = _lease(database)[1]
            assert first.proc is not None
            stopped_at = time.time()
            first.proc.send_signal(signal.SIGSTOP)
            try:
                ids += [client.submit(_doc(i)) for i in range(JOBS // 2, JOBS)]
                wait_for(lambda: second.metric(leader) == 1.0, timeout=ttl + 30,
                         interval=0.25, what="the standby to take over")
                takeover_s = time.time() - stopped_at
                wait_for(lambda: _ready(second.port) == (
                    200, f"ok; leader holder={_lease(database)[0]} epoch={old_epoch + 1}"),
                    timeout=60, what="the new leader to be ready under the next epoch")
                wait_for(lambda: time.time() - stopped_at >= stall, timeout=stall + 5,
                         interval=0.5, what="the end of the stall")
            finally:
                first.proc.send_signal(signal.SIGCONT)
            resumed_at = time.time()
            wait_for(lambda: "stood down" in first.log_text(), timeout=60,
                     what="the old leader to stand down")
            final = wait_terminal(client, ids, timeout=240)
            wait_for(lambda: first.metric(leader) == 0.0, timeout=30,
                     what="the old leader's metrics to show it stands by")
            # a whole tick of the new leader after the old one woke: all it would do is done
            ticks = second.metric(ticks_ok, 0)
            wait_for(lambda: second.metric(ticks_ok, 0) > ticks + 1,
                     timeout=30, what="two more ticks of the new leader")
            old_after = [e for e in first.records() if e["t"] >= resumed_at
                         and e.get("phase") == "begin"]
            records = recorded_executions(ids, final)
    t = tally(dict.fromkeys(ids, "succeeded"), final, records)
    entries = first.records() + second.records()
    wrong, details = wrong_writes(entries, database)
    stale_writes = [e for e in old_after if e.get("write") or e.get("kind") == "script"]
    stale_intents = _submissions_since(database, old_epoch, resumed_at)
    row = FaultRow(f"8 leader SIGSTOP {stall}s ({backend}, lease {ttl}s)", len(ids),
                   len(t.lost), t.duplicate_executions, wrong + len(stale_writes) + stale_intents,
                   takeover_s, notes=f"standby led after {takeover_s:.1f}s; old leader after "
                                     f"SIGCONT: {len(old_after)} commands, {len(stale_writes)} "
                                     f"writes, {stale_intents} intents")
    record_row(row)
    assert stale_writes == [] and stale_intents == 0, stale_writes
    assert "stood down" in first.log_text()
    assert "preflight" in first.log_text() and "preflight" in second.log_text()
    assert t.lost == [] and t.duplicates == {}, (t.lost, t.duplicates)
    assert wrong == 0, details
    assert takeover_s <= ttl + 10, takeover_s
