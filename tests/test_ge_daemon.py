"""End to end on Grid Engine: the daemon as a real process (``dispatchctl run``) on a
``kind = "gridengine"`` cluster, jobs written through the CLI, the Python client and
raw SQL, the daemon SIGKILLed again and again while they flow; what really ran is
counted from Grid Engine's accounting file (read as root): 0 duplicates, 0 lost."""

from __future__ import annotations

import json
import random
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from controller.client import Client
from controller.model.ids import new_job_id
from controller.store.db import Store
from tests.daemon_harness import DISPATCHCTL, DaemonProcess, free_port, metric_key, wait_for
from tests.fault_support import emit
from tests.ge_fixtures import USER, GridEngine, accounting, delete_all, ge_up, live_numbers, ran

TERMINAL = {"succeeded", "failed", "cancelled", "rejected"}
CLUSTER = "ge"


@pytest.fixture(scope="module")
def ge() -> GridEngine:
    found = ge_up()
    delete_all(USER)
    return found


@pytest.fixture(autouse=True)
def _clean(ge: GridEngine) -> Iterator[None]:
    yield
    delete_all(USER)


def write_ge_config(path: Path, *, database_url: str, port: int, out_dir: str,
                    tick_s: float = 1.0, extra: str = "", reconcile: str = "") -> Path:
    path.write_text(f"""
[cluster]
name = "{CLUSTER}"
kind = "gridengine"
[transport]
kind = "local"
run_as = "{USER}"
[output]
dir = "{out_dir}"
[database]
url = "{database_url}"
[daemon]
tick_interval_s = {tick_s}
metrics_port = {port}
cluster_stats_interval_s = 5
{extra}
[reconcile]
unknown_grace_s = 60
adopt_window_s = 20
{reconcile}
[slurm]
rate_per_s = 200
[gridengine]
unheard_grace_s = 10
""")
    return path


@contextmanager
def ge_daemon(tmp: Path, database_url: str, **kw: Any) -> Iterator[DaemonProcess]:
    port = free_port()
    out_dir = f"/tmp/dispatch-ge-e2e/{port}"
    subprocess.run(["install", "-d", "-m", "1777", "/tmp/dispatch-ge-e2e"], check=True)
    cfg = write_ge_config(tmp / f"config-{port}.toml", database_url=database_url, port=port,
                          out_dir=out_dir, **kw)
    d = DaemonProcess(cfg, port, tmp / f"daemon-{port}")
    d.start()
    try:
        wait_for(lambda: metric_key("dispatch_leader", cluster=CLUSTER) in d.metrics(),
                 timeout=30, what="daemon metrics endpoint")
        yield d
    finally:
        if d.alive():
            try:
                d.terminate(timeout=30)
            except subprocess.TimeoutExpired:
                d.kill()


def _doc(command: list[str], **extra: object) -> dict[str, object]:
    return {"command": command, "workdir": "/tmp", **extra}


def _sh(script: str) -> list[str]:
    return ["/bin/sh", "-c", script]


def _phases(client: Client, ids: list[str]) -> dict[str, dict[str, Any]]:
    return {v["id"]: v for v in client.list_jobs() if v["id"] in set(ids)}


def _executions(ge: GridEngine, ids: list[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for rec in accounting(ge, {"dj-" + i for i in ids}):
        if rec.owner == USER and ran(rec):
            counts[rec.name[3:]] = counts.get(rec.name[3:], 0) + 1
    return counts


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path}/ge.db"
    Store(url).migrate()
    return url


def test_thirty_jobs_with_the_daemon_killed_ten_times(ge: GridEngine, tmp_path: Path,
                                                      sqlite_url: str) -> None:
    """Succeed, fail with an exit code, retried by policy, held and released, cancelled
    while running; written through the CLI, the Python client and raw SQL; SIGKILL of
    the daemon at random moments (>= 10 times): every job's executions, counted from
    the accounting file, are exactly as expected."""
    rng = random.Random(20261205)
    client = Client(sqlite_url)
    ids: dict[str, list[str]] = {"ok": [], "exit3": [], "retry": [], "held": [],
                                 "cancel": [], "sql": []}
    for i in range(8):
        ids["ok"].append(client.submit(_doc(_sh(f"echo job {i}; sleep {i % 3}"))))
    for i in range(4):  # through the CLI
        path = tmp_path / f"cli-{i}.json"
        path.write_text(json.dumps(_doc(_sh(f"sleep {i % 2}"))))
        out = subprocess.run([DISPATCHCTL, "submit", str(path)], check=True,
                             capture_output=True, text=True,
                             env={"DISPATCH_DATABASE_URL": sqlite_url, "PATH": "/usr/bin:/bin"})
        ids["ok"].append(out.stdout.strip())
    for _ in range(4):
        ids["exit3"].append(client.submit(_doc(_sh("echo failing >&2; exit 3"))))
    # fails on its first execution, whatever its submission number (a daemon killed
    # between committing an intent and its qsub abandons that intent after the adopt
    # window: the first execution may be submission 2)
    markers = Path(f"/tmp/dispatch-ge-e2e/markers-{uuid.uuid4().hex[:12]}")
    subprocess.run(["install", "-d", "-m", "1777", str(markers.parent), str(markers)],
                   check=True)
    for i in range(4):
        ids["retry"].append(client.submit(
            _doc(_sh(f'[ -e {markers}/{i} ] || {{ touch {markers}/{i}; exit 3; }}')),
            policy={"retry_exit_codes": [3], "backoff": {"initial_s": 1, "max_s": 2}}))
    for _ in range(3):
        ids["held"].append(client.submit(_doc(["true"]), held=True))
    for _ in range(3):
        ids["cancel"].append(client.submit(_doc(["sleep", "300"])))
    store = Store(sqlite_url)
    with store.engine.begin() as conn:
        for _ in range(4):
            jid = new_job_id()
            conn.execute(text("INSERT INTO jobs (id, spec) VALUES (:id, :spec)"),
                         {"id": jid, "spec": json.dumps(_doc(["true"]))})
            ids["sql"].append(jid)
    everything = [i for group in ids.values() for i in group]
    assert len(everything) == 30
    started = time.monotonic()
    # A killed leader's lease blocks the next daemon until it expires: a short lease
    # (3 s) lets each new daemon act between kills (fencing keeps it safe at any TTL)
    with ge_daemon(tmp_path, sqlite_url,
                   extra="lease_ttl_s = 3\nlease_margin_s = 1") as d:
        released = cancelled = False
        while d.kills < 10 or not (released and cancelled):
            time.sleep(rng.uniform(1.0, 6.0))
            d.kill()
            d.start()
            phases = _phases(client, everything)
            if not released and d.kills >= 3:
                for jid in ids["held"]:
                    client.release(jid)
                released = True
            if not cancelled and all(phases[j]["phase"] == "running" for j in ids["cancel"]):
                for jid in ids["cancel"]:
                    client.cancel(jid)
                cancelled = True
            assert time.monotonic() - started < 240, "jobs did not flow"
        wait_for(lambda: all(v["phase"] in TERMINAL
                             for v in _phases(client, everything).values()),
                 timeout=180, interval=1, what="30 jobs to finish")
    final = _phases(client, everything)
    expected_phase = {"ok": "succeeded", "exit3": "failed", "retry": "succeeded",
                      "held": "succeeded", "cancel": "cancelled", "sql": "succeeded"}
    expected_runs = {"ok": 1, "exit3": 1, "retry": 2, "held": 1, "cancel": 1, "sql": 1}
    executions = _executions(ge, everything)
    wrong = {jid: (group, final[jid]["phase"], executions.get(jid, 0))
             for group, members in ids.items() for jid in members
             if final[jid]["phase"] != expected_phase[group]
             or executions.get(jid, 0) != expected_runs[group]}
    duplicates = sum(1 for group, members in ids.items() for jid in members
                     if executions.get(jid, 0) > expected_runs[group])
    lost = sum(1 for group, members in ids.items() for jid in members
               if executions.get(jid, 0) < expected_runs[group])
    emit(f"\ngridengine e2e: kills={d.kills} jobs=30 executions={sum(executions.values())} "
         f"duplicates={duplicates} lost={lost} seconds={time.monotonic() - started:.0f}")
    assert wrong == {}
    assert live_numbers() == set()  # nothing of ours left in qstat
