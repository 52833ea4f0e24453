"""A running daemon's /metrics, scraped while it reconciles jobs on the real cluster,
agrees with the database."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from controller.client import Client
from controller.store.db import Store
from tests.daemon_harness import cancel_all, daemon, metric_key, slurm_env, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def test_metrics_agree_with_the_database(tmp_path: Path) -> None:
    env = slurm_env()
    cancel_all()
    url = f"sqlite:///{tmp_path}/m.db"
    Store(url).migrate()
    client = Client(url)
    # 8 CPUs on the test node: 8 of these run, 4 queue
    ids = [client.submit({"command": ["sleep", "25"], "workdir": "/tmp",
                          "resources": {"cpus_per_task": 1}}) for _ in range(12)]
    client.submit({"command": ["true"], "workdir": "/tmp"}, held=True)
    with daemon(tmp_path, url) as d:
        def settled() -> bool:
            phases = [client.get(i)["phase"] for i in ids]
            return phases.count("running") == 8 and phases.count("pending") == 4
        wait_for(settled, timeout=60, what="8 running and 4 queued")
        wait_for(lambda: d.metrics()[metric_key("dispatch_jobs_running")] == 8.0, timeout=15,
                 what="the running gauge")
        m = d.metrics()
        views = client.list_jobs()
        by_phase: dict[str, int] = {}
        for v in views:
            by_phase[v["phase"]] = by_phase.get(v["phase"], 0) + 1
        for phase, count in by_phase.items():
            assert m[metric_key("dispatch_jobs", phase=phase)] == count
        assert m[metric_key("dispatch_jobs_queued")] == 5.0  # 4 pending + 1 held (gated)
        assert m[metric_key("dispatch_job_objects", state="gated")] == 1.0
        assert m[metric_key("dispatch_submissions_total")] == 13.0
        assert m[metric_key("dispatch_slurm_up")] == 1.0 and m[metric_key("dispatch_leader")] == 1.0
        assert m[metric_key("dispatch_slurm_commands_total", command="squeue")] >= 1
        wait_for(lambda: d.metrics()[metric_key("dispatch_cluster_jobs_running")] >= 8, timeout=20,
                 what="cluster-wide gauges")
        # induced node loss: every running job ends NODE_FAIL and is resubmitted by policy
        node = env["NODE"]
        subprocess.run(["scontrol", "update", f"NodeName={node}", "State=DOWN",
                        "Reason=metrics-test"], check=True)
        try:
            wait_for(lambda: d.metrics().get(
                metric_key("dispatch_resubmissions_total", cause="node-lost"), 0) >= 8, timeout=60,
                what="node-lost resubmissions")
        finally:
            subprocess.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"],
                           check=True)
        wait_for(lambda: sum(v["attempt"] for v in client.list_jobs()) >= 8, timeout=30,
                 what="attempts recorded")
        m = d.metrics()
        attempts = sum(v["attempt"] for v in client.list_jobs())
        assert m[metric_key("dispatch_resubmissions_total", cause="node-lost")] == attempts
    cancel_all()
