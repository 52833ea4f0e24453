"""End to end: the daemon as a real process, real Slurm 22.05 (user ``dispatch``), real
SQLite and PostgreSQL. What really ran is read back from sacct as root."""

from __future__ import annotations

import json
import random
import subprocess
import time
from pathlib import Path

import pytest
from sqlalchemy import text

from controller.client import Client
from controller.store.db import Store
from tests.daemon_harness import (
    cancel_all,
    daemon,
    metric_key,
    ran,
    sacct_records,
    scrape,
    slurm_env,
    squeue_names,
    wait_for,
)
from tests.fault_support import emit

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

TERMINAL = {"succeeded", "failed", "cancelled", "rejected"}


@pytest.fixture(scope="module")
def cluster() -> dict[str, str]:
    env = slurm_env()
    cancel_all()
    return env


def _doc(command: list[str], **extra: object) -> dict[str, object]:
    return {"command": command, "workdir": "/tmp", **extra}


def _sh(script: str) -> list[str]:
    return ["/bin/sh", "-c", script]


def _phases(client: Client, ids: list[str]) -> dict[str, dict[str, object]]:
    return {v["id"]: v for v in client.list_jobs() if v["id"] in set(ids)}


def _wait_terminal(client: Client, ids: list[str], timeout: float) -> dict[str, dict[str, object]]:
    wait_for(lambda: all(v["phase"] in TERMINAL for v in _phases(client, ids).values()),
             timeout=timeout, interval=1, what=f"{len(ids)} jobs to finish")
    return _phases(client, ids)


def _node_state(node: str) -> str:
    return subprocess.run(["sinfo", "-h", "-n", node, "-o", "%T"], capture_output=True,
                          text=True, check=True).stdout.strip()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path}/e2e.db"
    Store(url).migrate()
    return url


def test_fifty_jobs_through_the_daemon(cluster: dict[str, str], tmp_path: Path,
                                       sqlite_url: str) -> None:
    """Successes, non-zero exits, retry by exit code, a node-lost job resubmitted by policy,
    a held-then-released job and a stopped job: final phases, causes and sacct history."""
    node = cluster["NODE"]
    client = Client(sqlite_url)
    ids: dict[str, list[str]] = {"ok": [], "exit3": [], "retry": []}
    for i in range(40):
        ids["ok"].append(client.submit(_doc(_sh(f"echo job {i}; sleep {i % 3}"),
                                            labels={"wf": "fifty"})))
    for _ in range(5):
        ids["exit3"].append(client.submit(_doc(_sh("echo failing >&2; exit 3"))))
    for _ in range(2):
        ids["retry"].append(client.submit(
            _doc(_sh('[ "$DISPATCH_SUBMISSION" -ge 2 ] || exit 3')),
            policy={"retry_exit_codes": [3], "backoff": {"initial_s": 1}}))
    lost = client.submit(_doc(_sh('[ "$DISPATCH_SUBMISSION" -ge 2 ] || sleep 300')),
                         policy={"causes": {"node-lost": {"exclude_node": False}},
                                 "backoff": {"initial_s": 1}})
    held = client.submit(_doc(["true"]), held=True)
    stopped = client.submit(_doc(["sleep", "300"]))
    everything = ids["ok"] + ids["exit3"] + ids["retry"] + [lost, held, stopped]
    assert len(everything) == 50
    with daemon(tmp_path, sqlite_url) as d:
        quick = ids["ok"] + ids["exit3"] + ids["retry"]
        _wait_terminal(client, quick, timeout=240)
        wait_for(lambda: client.get(stopped)["phase"] == "running", timeout=60,
                 what="the job to stop to run")
        client.cancel(stopped)
        wait_for(lambda: client.get(stopped)["phase"] == "cancelled", timeout=60,
                 what="the stopped job to be cancelled")
        wait_for(lambda: client.get(lost)["phase"] == "running", timeout=60,
                 what="the node-lost job to run")
        assert client.get(held)["phase"] == "held"
        assert client.get(held)["object_state"] == "gated"
        try:
            subprocess.run(["scontrol", "update", f"NodeName={node}", "State=DOWN",
                            "Reason=dispatch-e2e"], check=True)
            wait_for(lambda: client.get(lost)["attempt"] == 1, timeout=60,
                     what="the node-lost job to be resubmitted")
        finally:
            subprocess.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"],
                           check=True)
        client.release(held)
        final = _wait_terminal(client, everything, timeout=180)
        metrics = d.metrics()
    assert all(final[i]["phase"] == "succeeded" for i in ids["ok"])
    for i in ids["exit3"]:
        assert (final[i]["phase"], final[i]["cause"], final[i]["exit_code"]) == (
            "failed", "non-zero-exit", 3)
    for i in ids["retry"]:
        assert (final[i]["phase"], final[i]["attempt"]) == ("succeeded", 1)
    assert (final[lost]["phase"], final[lost]["attempt"]) == ("succeeded", 1)
    assert final[held]["phase"] == "succeeded"
    assert (final[stopped]["phase"], final[stopped]["cause"]) == ("cancelled", "cancelled")

    names = {"dj-" + i: i for i in everything}
    allowed = dict.fromkeys(everything, 1) | dict.fromkeys(ids["retry"], 2) | {lost: 2}

    def history() -> dict[str, list[str]]:
        by_job: dict[str, list[str]] = {}
        for rec in sacct_records(set(names)):
            assert rec.user == "dispatch"
            by_job.setdefault(names[rec.name], []).append(rec.state)
        return by_job

    # records reach slurmdbd a few seconds after the event: wait for the last ones
    wait_for(lambda: sum(map(len, history().values())) >= sum(allowed.values()),
             timeout=60, what="accounting to catch up")
    by_job = history()
    for job_id, states in by_job.items():
        assert len(states) == allowed[job_id], (job_id, states)
    assert sorted(by_job[lost]) == ["COMPLETED", "NODE_FAIL"]
    assert metrics[metric_key("dispatch_resubmissions_total", cause="node-lost")] >= 1
    assert metrics[metric_key("dispatch_resubmissions_total", cause="non-zero-exit")] == 2
    assert _node_state(node) in ("idle", "mixed", "allocated")


def test_crash_safety_sigkill_while_submitting(cluster: dict[str, str], tmp_path: Path,
                                               sqlite_url: str) -> None:
    """SIGKILL the daemon at random moments (>= 10 times) while 100 jobs are submitted:
    after restart every job completes once; none ran twice, none is lost. A killed
    leader keeps its lease until it expires, and an intent whose sbatch never ran waits
    the adopt window: both are short here (10 s, 20 s) so the test does not spend three
    minutes waiting for the default window (safety never depends on either)."""
    rng = random.Random(20261130)
    client = Client(sqlite_url)
    ids = [client.submit(_doc(_sh(f"sleep {rng.choice([0, 1, 2])}")))
           for _ in range(100)]
    with daemon(tmp_path, sqlite_url, adopt_window_s=20, extra="lease_ttl_s = 10") as d:
        kills = 0
        started = time.monotonic()
        while kills < 12 or time.monotonic() - started < 10:
            time.sleep(rng.uniform(0.3, 2.5))
            d.kill()
            kills += 1
            d.start()
        final = _wait_terminal(client, ids, timeout=300)
    assert d.kills >= 10
    assert {v["phase"] for v in final.values()} == {"succeeded"}
    records = sacct_records({"dj-" + i for i in ids})
    executions: dict[str, int] = {}
    for rec in records:
        if ran(rec):
            executions[rec.name] = executions.get(rec.name, 0) + 1
    duplicates = {n: c for n, c in executions.items() if c > 1}
    lost = [i for i in ids if executions.get("dj-" + i, 0) == 0]
    emit(f"\ncrash-safety: kills={d.kills} jobs=100 slurm_records={len(records)} "
          f"executed={sum(executions.values())} duplicates={len(duplicates)} lost={len(lost)}")
    assert duplicates == {} and lost == []
    assert not [r for r in squeue_names() if r[1] in {"dj-" + i for i in ids}
                and r[2] in ("PENDING", "RUNNING")]


def test_two_daemons_on_postgresql_one_leader(cluster: dict[str, str], tmp_path: Path,
                                              pg_url: str) -> None:
    Store(pg_url).migrate()
    client = Client(pg_url)
    ttl = "lease_ttl_s = 10"  # the standby takes over within 10 s, not the default 30
    with daemon(tmp_path, pg_url, extra=ttl) as first:
        wait_for(lambda: first.metrics().get(metric_key("dispatch_leader")) == 1.0, timeout=30,
                 what="first daemon to lead")
        with daemon(tmp_path, pg_url, extra=ttl) as second:
            wait_for(lambda: metric_key("dispatch_leader") in second.metrics(), timeout=30,
                     what="the standby serving its metrics")
            assert second.metrics()[metric_key("dispatch_leader")] == 0.0
            ids = [client.submit(_doc(["true"])) for _ in range(5)]
            _wait_terminal(client, ids, timeout=60)
            assert second.metrics()[metric_key("dispatch_submissions_total")] == 0.0
            assert first.metrics()[metric_key("dispatch_submissions_total")] == 5.0
            first.kill()
            wait_for(lambda: second.metrics().get(metric_key("dispatch_leader")) == 1.0, timeout=60,
                     what="standby to take over")
            more = [client.submit(_doc(["true"])) for _ in range(5)]
            final = _wait_terminal(client, more, timeout=60)
            assert {v["phase"] for v in final.values()} == {"succeeded"}
            assert second.metrics()[metric_key("dispatch_submissions_total")] == 5.0


def test_notify_wakes_the_loop_on_postgresql(cluster: dict[str, str], tmp_path: Path,
                                             pg_url: str) -> None:
    """With a long tick interval, an insert is still picked up at once (LISTEN/NOTIFY)."""
    Store(pg_url).migrate()
    client = Client(pg_url)
    # a tick of 60 s needs a lease longer than the tick plus its margin
    with daemon(tmp_path, pg_url, tick_s=60, extra="lease_ttl_s = 120") as d:
        wait_for(lambda: d.metrics().get(metric_key("dispatch_leader")) == 1.0, timeout=30,
                 what="leader")
        # its first tick done: the insert below comes inside the 60 s interval
        wait_for(lambda: d.metrics().get(metric_key("dispatch_ticks_total", result="ok"),
                                         0) >= 1, timeout=30, what="the leader's first tick")
        started = time.monotonic()
        jid = client.submit(_doc(["true"]))
        wait_for(lambda: client.get(jid)["slurm_job_id"] is not None, timeout=20,
                 what="the insert to wake the daemon")
        assert time.monotonic() - started < 20


def test_bad_sql_row_is_rejected_and_others_run(cluster: dict[str, str], tmp_path: Path,
                                                sqlite_url: str) -> None:
    client = Client(sqlite_url)
    good = client.submit(_doc(["true"]))
    store = Store(sqlite_url)
    with store.engine.begin() as conn:
        conn.execute(text("INSERT INTO jobs (id, spec) VALUES (:id, :spec)"),
                     {"id": "01JZ8Q2N5V00000000000000ZZ",
                      "spec": json.dumps({"command": ["true"], "workdir": "tmp"})})
    with daemon(tmp_path, sqlite_url):
        final = _wait_terminal(client, [good, "01JZ8Q2N5V00000000000000ZZ"], timeout=60)
    bad = final["01JZ8Q2N5V00000000000000ZZ"]
    assert bad["phase"] == "rejected" and "workdir" in bad["cause_detail"]
    assert final[good]["phase"] == "succeeded"


def test_sigterm_finishes_and_never_cancels(cluster: dict[str, str], tmp_path: Path,
                                            sqlite_url: str) -> None:
    client = Client(sqlite_url)
    jid = client.submit(_doc(["sleep", "15"]))
    with daemon(tmp_path, sqlite_url) as d:
        wait_for(lambda: client.get(jid)["phase"] == "running", timeout=60, what="running")
        assert d.terminate() == 0
        slurm_id = client.get(jid)["slurm_job_id"]
        assert any(i == slurm_id and state == "RUNNING" for i, _, state in squeue_names())
        d.start()
        final = _wait_terminal(client, [jid], timeout=90)
    assert final[jid]["phase"] == "succeeded" and final[jid]["attempt"] == 0
    metrics_port_closed = True
    try:
        scrape(d.port)
        metrics_port_closed = False
    except OSError:
        pass
    assert metrics_port_closed


def test_expected_outputs_checked_after_success(cluster: dict[str, str], tmp_path: Path,
                                                sqlite_url: str) -> None:
    """A completed job whose expected output is missing ends missing-output, is retried
    once by the default policy, then fails; one that writes it succeeds."""
    out = Path("/tmp/dispatch-e2e-outputs")
    out.mkdir(mode=0o1777, exist_ok=True)
    out.chmod(0o1777)
    client = Client(sqlite_url)
    good_path = out / f"good-{tmp_path.name}.txt"
    good = client.submit(_doc(_sh(f"echo done > {good_path}")),
                         policy={"expected_outputs": [str(good_path)],
                                 "backoff": {"initial_s": 1}})
    bad = client.submit(_doc(["true"]),
                        policy={"expected_outputs": [str(out / "never-written.txt")],
                                "backoff": {"initial_s": 1}})
    with daemon(tmp_path, sqlite_url):
        final = _wait_terminal(client, [good, bad], timeout=90)
    assert final[good]["phase"] == "succeeded"
    assert (final[bad]["phase"], final[bad]["cause"], final[bad]["attempt"]) == (
        "failed", "missing-output", 1)
    # records reach slurmdbd seconds after the event
    wait_for(lambda: len(sacct_records({"dj-" + bad})) >= 2, timeout=60,
             what="accounting to record both submissions")
    records = sacct_records({"dj-" + bad})
    assert len(records) == 2 and all(r.state == "COMPLETED" for r in records)
