"""One daemon, two kinds: a Slurm cluster (the host's 22.05) and a Grid Engine cluster
in one configuration, 20 jobs each, each job naming its cluster. Every job ends on its
own scheduler with exactly one execution there (sacct for Slurm, the accounting file for
Grid Engine) and none on the other. Uses the host's Slurm cluster: it holds the host
lane's lock (tests/conftest.py, ``BOTH_KINDS``)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from controller.client import Client
from controller.store.db import Store
from tests.daemon_harness import (
    DaemonProcess,
    free_port,
    metric_key,
    ran,
    sacct_records,
    slurm_env,
    wait_for,
)
from tests.fault_support import emit
from tests.ge_fixtures import USER, GridEngine, accounting, delete_all, ge_up
from tests.ge_fixtures import ran as ge_ran

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
TERMINAL = {"succeeded", "failed", "cancelled", "rejected"}


@pytest.fixture(scope="module")
def both() -> GridEngine:
    slurm_env()
    ge = ge_up()
    delete_all(USER)
    return ge


def test_one_daemon_drives_slurm_and_grid_engine(both: GridEngine, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/mixed.db"
    Store(url).migrate()
    port = free_port()
    subprocess.run(["install", "-d", "-m", "1777", "/tmp/dispatch-mixed"], check=True)
    config = tmp_path / "mixed.toml"
    config.write_text(f"""
[transport]
kind = "local"
run_as = "{USER}"
[output]
dir = "/tmp/dispatch-mixed/{port}"
[database]
url = "{url}"
[daemon]
tick_interval_s = 1
metrics_port = {port}
[slurm]
rate_per_s = 200
[gridengine]
unheard_grace_s = 10

[[clusters]]
name = "lab"

[[clusters]]
name = "ge"
kind = "gridengine"
""")
    client = Client(url)
    ids = {name: [client.submit({"command": ["/bin/sh", "-c", f"echo {name} {i}"],
                                 "workdir": "/tmp", "cluster": name}) for i in range(20)]
           for name in ("lab", "ge")}
    everything = ids["lab"] + ids["ge"]
    d = DaemonProcess(config, port, tmp_path / "daemon")
    d.start()
    try:
        wait_for(lambda: all(metric_key("dispatch_leader", cluster=c) in d.metrics()
                             for c in ("lab", "ge")), timeout=60, what="both shards")
        wait_for(lambda: all(v["phase"] in TERMINAL for v in client.list_jobs()
                             if v["id"] in set(everything)),
                 timeout=240, interval=1, what="40 jobs to finish")
    finally:
        if d.alive():
            d.terminate(timeout=30)
    views = {v["id"]: v for v in client.list_jobs()}
    assert {views[i]["phase"] for i in everything} == {"succeeded"}
    slurm_runs: dict[str, int] = {}
    for rec in sacct_records({"dj-" + i for i in everything}):
        if ran(rec):
            slurm_runs[rec.name[3:]] = slurm_runs.get(rec.name[3:], 0) + 1
    ge_runs: dict[str, int] = {}
    for record in accounting(both, {"dj-" + i for i in everything}):
        if ge_ran(record):
            ge_runs[record.name[3:]] = ge_runs.get(record.name[3:], 0) + 1
    emit(f"\nmixed: slurm jobs 20 executions {sum(slurm_runs.values())}, gridengine jobs 20 "
         f"executions {sum(ge_runs.values())}")
    assert {i: slurm_runs.get(i, 0) for i in ids["lab"]} == dict.fromkeys(ids["lab"], 1)
    assert {i: ge_runs.get(i, 0) for i in ids["ge"]} == dict.fromkeys(ids["ge"], 1)
    assert not set(slurm_runs) & set(ids["ge"]) and not set(ge_runs) & set(ids["lab"])
    assert all(views[i]["cluster"] == "lab" for i in ids["lab"])
    assert all(views[i]["cluster"] == "ge" for i in ids["ge"])
