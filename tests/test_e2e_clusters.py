"""Issue 12 on REAL clusters: one control plane for the host's 22.05 (local) and the
24.11 and 26.05 chroot clusters (SSH), all at once.

* One daemon drives the three: 90 jobs (30 per cluster: successes, failures, and jobs
  that exit 75 once and are retried by policy) each end on their own cluster as
  expected; sacct on each cluster shows exactly the executions expected (one, or two for
  a retried job) and none on another cluster. Meanwhile slurmctld of 26.05 is stopped
  for at least 60 s: the other two clusters' jobs all end while it is down, none of the
  stopped cluster's jobs changes phase, and they all end after it returns.
* Three replicas on PostgreSQL each hold one shard; SIGKILL one: its shard moves within
  the lease TTL plus one tick (and some slack for process scheduling); every job runs
  exactly once.
* A job whose acceptable clusters are [24.11, 26.05], with 24.11's partition drained
  (sbatch refuses it), runs on 26.05; its submission rows show both attempts with their
  clusters.

These tests change the shared clusters (a stopped slurmctld, a drained partition): they
run in their own lane after the others (``tests/conftest.py``), and restore what they
changed.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from controller.client import Client
from controller.store.db import Store
from controller.store.members import list_replicas
from tests.daemon_harness import DaemonProcess, free_port, metric_key, scrape, wait_for
from tests.fault_support import query, views, wait_terminal
from tests.slurm_fixtures import (
    ALL_VERSIONS,
    HOST_VERSION,
    as_root,
    env_file,
    started_runs,
    wait_node_ready,
)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
SLURM_CTL = ROOT / "scripts" / "slurm-ctl"
OUTPUT_DIR = "~/.dispatch/test-output"
NAMES = {"22.05": "c2205", "24.11": "c2411", "26.05": "c2605"}
TERMINAL = {"succeeded", "failed", "cancelled", "rejected"}
RETRY = {"retry_exit_codes": [75]}
STOP_S = 60  # how long the stopped slurmctld stays down, at least


@dataclass(frozen=True)
class Cluster:
    version: str
    name: str
    env: Mapping[str, str]

    @property
    def chroot(self) -> bool:
        return self.version != HOST_VERSION


def _env(version: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in env_file(version).read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out[key.strip()] = value.strip()
    return out


@pytest.fixture(scope="module")
def clusters() -> list[Cluster]:
    """The three clusters, up (scripts/test started them; a missing one fails here)."""
    found = []
    for version in ALL_VERSIONS:
        assert env_file(version).exists(), f"Slurm {version} is not set up (scripts/slurm-up)"
        wait_node_ready(version=version)
        found.append(Cluster(version, NAMES[version], _env(version)))
    return found


def config_text(clusters: list[Cluster], *, url: str, port: int, tick_s: float = 1.0,
                ttl_s: float = 30.0, partition: Mapping[str, str] | None = None) -> str:
    entries = []
    for c in clusters:
        if c.chroot:
            transport = (f'kind = "ssh"\nhost = "127.0.0.1"\nport = {c.env["SSH_PORT"]}\n'
                         f'user = "{c.env["SUBMIT_USER"]}"\nkey_file = "{c.env["SSH_KEY"]}"\n'
                         f'known_hosts = "{c.env["SSH_KNOWN_HOSTS"]}"\n')
        else:
            transport = 'kind = "local"\nrun_as = "dispatch"\n'
        defaults = (f'[clusters.defaults]\npartition = "{partition[c.name]}"\n'
                    if partition and c.name in partition else "")
        entries.append(f'[[clusters]]\nname = "{c.name}"\n[clusters.transport]\n{transport}'
                       f"command_timeout_s = 30\n{defaults}")
    return f"""
[output]
dir = "{OUTPUT_DIR}"
[database]
url = "{url}"
[daemon]
tick_interval_s = {tick_s}
metrics_port = {port}
cluster_stats_interval_s = 5
lease_ttl_s = {ttl_s}
lease_margin_s = 3
[reconcile]
unknown_grace_s = 600
adopt_window_s = 30
[slurm]
rate_per_s = 200
""" + "\n".join(entries)


@pytest.fixture
def start_daemon(tmp_path: Path) -> Iterator[Any]:
    """Start ``dispatchctl run`` processes; each is stopped (or killed) afterwards."""
    started: list[DaemonProcess] = []

    def start(text: str, port: int) -> DaemonProcess:
        cfg = tmp_path / f"config-{port}.toml"
        cfg.write_text(text)
        d = DaemonProcess(cfg, port, tmp_path / f"daemon-{port}")
        d.start()
        started.append(d)
        wait_for(lambda: "dispatch_ticks_total" in "".join(scrape(port)), timeout=60,
                 what="daemon metrics endpoint")
        return d

    yield start
    for d in started:
        if d.alive():
            try:
                d.terminate(timeout=60)
            except subprocess.TimeoutExpired:
                d.kill()
    for d in started:
        tail = "\n".join(d.log_text().splitlines()[-15:])
        print(f"--- {d.log}:\n{tail}")


def executions(cluster: Cluster, names: set[str]) -> dict[str, int]:
    """Per ``dj-`` name: how many of this cluster's sacct records of it ever started."""
    return started_runs(cluster.version, names)


def settled_executions(cluster: Cluster, want: Mapping[str, int], *,
                       timeout: float = 60) -> dict[str, int]:
    """``executions`` once it equals ``want``, or the last read after ``timeout`` s:
    slurmdbd records a job's start seconds after it (a loaded machine: longer), so a
    read right after the jobs ended can miss the last ones."""
    deadline = time.monotonic() + timeout
    while True:
        ran = executions(cluster, set(want))
        if ran == dict(want) or time.monotonic() > deadline:
            return ran
        time.sleep(1)


def slurmctld(cluster: Cluster, action: str) -> None:
    argv = [str(SLURM_CTL)]
    if cluster.chroot:
        argv += ["--version", cluster.version]
    subprocess.run([*argv, action, "slurmctld"], check=True, stdout=subprocess.DEVNULL,
                   timeout=180)


def submit_mix(client: Client, cluster: str, n: int) -> dict[str, str]:
    """``n`` jobs on ``cluster``: two thirds succeed, a sixth fail (exit 3), a sixth exit
    75 on their first submission and are retried. Returns id -> expected outcome."""
    expected: dict[str, str] = {}
    for i in range(n):
        kind = ("ok", "ok", "ok", "ok", "fail", "retry")[i % 6]
        command = {"ok": ["true"], "fail": ["sh", "-c", "exit 3"],
                   "retry": ["sh", "-c", 'test "$DISPATCH_SUBMISSION" -ge 2 || exit 75']}[kind]
        job_id = client.submit({"command": command, "workdir": "/tmp", "cluster": cluster,
                                "labels": {"e2e": "clusters"}},
                               policy=RETRY if kind == "retry" else None)
        expected[job_id] = kind
    return expected


def test_one_daemon_drives_three_clusters_and_a_stopped_slurmctld_stalls_only_its_own(
        clusters: list[Cluster], tmp_path: Path, start_daemon: Any) -> None:
    url = f"sqlite:///{tmp_path}/clusters.db"
    Store(url).migrate()
    client = Client(url)
    by_cluster = {c.name: submit_mix(client, c.name, 30) for c in clusters}
    stopped = clusters[2]  # 26.05
    others = [c for c in clusters if c is not stopped]
    port = free_port()
    start_daemon(config_text(clusters, url=url, port=port), port)
    # some of the stopped cluster's jobs are in its queue before slurmctld goes
    wait_for(lambda: sum(1 for v in views(client, by_cluster[stopped.name]).values()
                         if v["slurm_job_id"]) >= 10, timeout=120,
             what="10 jobs submitted to the cluster about to stop")
    slurmctld(stopped, "stop")
    down_at = time.monotonic()
    try:
        # a tick whose Starts wait on the stopped slurmctld ends at their 30 s command
        # timeout, and the next tick's squeue may take as long: two of them, and more on
        # a machine running the four lanes of scripts/test at once (it took > 60 s there)
        wait_for(lambda: scrape(port).get(metric_key("dispatch_slurm_up", stopped.name)) == 0,
                 timeout=120, what=f"{stopped.name}'s shard to see its slurmctld down")
        frozen = {i: (v["phase"], v["attempt"])
                  for i, v in views(client, by_cluster[stopped.name]).items()}
        rest = [i for c in others for i in by_cluster[c.name]]
        wait_terminal(client, rest, timeout=240)  # flowing on while one cluster is down
        ended_during = time.monotonic() - down_at
        now = {i: (v["phase"], v["attempt"])
               for i, v in views(client, by_cluster[stopped.name]).items()}
        assert now == frozen  # nothing of the stopped cluster's jobs changed
        metrics = scrape(port)
        assert metrics.get(metric_key("dispatch_slurm_up", stopped.name)) == 0
        assert all(metrics.get(metric_key("dispatch_slurm_up", c.name)) == 1 for c in others)
        time.sleep(max(0.0, STOP_S - (time.monotonic() - down_at)))  # down for 60 s at least
    finally:
        slurmctld(stopped, "start")
    print(f"\nother clusters' 60 jobs ended {ended_during:.0f}s into the stop of "
          f"{stopped.name}'s slurmctld")
    final = wait_terminal(client, list(by_cluster[stopped.name]), timeout=300)
    final.update(views(client, [i for c in others for i in by_cluster[c.name]]))
    want_phase = {"ok": "succeeded", "retry": "succeeded", "fail": "failed"}
    want_runs = {"ok": 1, "retry": 2, "fail": 1}
    for c in clusters:
        jobs = by_cluster[c.name]
        wrong = {i: (final[i]["phase"], final[i]["cluster"]) for i, kind in jobs.items()
                 if final[i]["phase"] != want_phase[kind] or final[i]["cluster"] != c.name}
        assert wrong == {}, (c.name, wrong)
        ran = settled_executions(c, {"dj-" + i: want_runs[kind] for i, kind in jobs.items()})
        assert {n: k for n, k in ran.items()
                if k != want_runs[jobs[n.removeprefix("dj-")]]} == {}, c.name
        elsewhere = [o for o in clusters if o is not c]
        for o in elsewhere:  # no job of this cluster ran on another
            assert set(executions(o, {"dj-" + i for i in jobs}).values()) == {0}, (c, o)
    rows = query(url, "SELECT job_id, cluster FROM submissions")
    owner = {i: c for c, jobs in by_cluster.items() for i in jobs}
    assert all(cluster == owner[job] for job, cluster in rows)


def test_three_replicas_share_the_shards_and_a_killed_ones_moves(
        clusters: list[Cluster], tmp_path: Path, pg_url: str, start_daemon: Any) -> None:
    url = pg_url  # (dropped after the daemons stop: fixtures end in reverse order)
    Store(url).migrate()
    client = Client(url)
    ttl, tick = 10.0, 1.0
    jobs = {c.name: [client.submit({"command": ["sleep", "2"], "workdir": "/tmp",
                                    "cluster": c.name}) for _ in range(10)]
            for c in clusters}
    ports = [free_port() for _ in range(3)]
    daemons = [start_daemon(config_text(clusters, url=url, port=p, tick_s=tick,
                                        ttl_s=ttl), p) for p in ports]
    store = Store(url)

    def spread() -> dict[str, tuple[str, ...]]:
        return {r.holder: r.shards for r in list_replicas(store)}

    wait_for(lambda: len(spread()) == 3 and all(len(s) == 1 for s in spread().values()),
             timeout=90, what="each of three replicas to hold one shard")
    holders = {shard: holder for holder, shards in spread().items() for shard in shards}
    assert sorted(holders) == sorted(NAMES.values())
    # the replica holding 24.11's shard dies
    victim_shard = NAMES["24.11"]
    lease = "cluster/" + victim_shard
    (old_holder,) = (h for (h,) in query(url, "SELECT holder FROM leases WHERE name = :n",
                                          {"n": lease}))
    victim = next(d for d, p in zip(daemons, ports, strict=True)
                  if scrape(p).get(metric_key("dispatch_leader", victim_shard)) == 1)
    victim.kill()
    killed_at = time.monotonic()

    def moved() -> bool:
        rows = query(url, "SELECT holder, expires_at_ms FROM leases WHERE name = :n",
                     {"n": lease})
        return bool(rows) and rows[0][0] != old_holder and rows[0][1] > time.time() * 1000

    wait_for(moved, timeout=ttl * 4, interval=0.2, what="the killed replica's shard to move")
    took = time.monotonic() - killed_at
    print(f"\nshard {victim_shard} moved {took:.1f}s after SIGKILL "
          f"(lease TTL {ttl:g}s, tick {tick:g}s)")
    assert took <= ttl + tick + 5, took  # TTL + one tick (+ scheduling slack)
    ids = [i for c in jobs.values() for i in c]
    final = wait_terminal(client, ids, timeout=300)
    assert {v["phase"] for v in final.values()} == {"succeeded"}
    for c in clusters:
        ran = settled_executions(c, {"dj-" + i: 1 for i in jobs[c.name]})
        assert set(ran.values()) == {1}, (c.name, ran)


def test_the_first_acceptable_cluster_refusing_sends_the_job_to_the_next(
        clusters: list[Cluster], tmp_path: Path, start_daemon: Any) -> None:
    first, second = clusters[1], clusters[2]  # 24.11, 26.05
    partition = first.env["PARTITION"]
    as_root("scontrol", "update", f"PartitionName={partition}", "State=DRAIN",
            version=first.version)
    try:
        url = f"sqlite:///{tmp_path}/fallback.db"
        Store(url).migrate()
        client = Client(url)
        job_id = client.submit({"command": ["true"], "workdir": "/tmp",
                                "cluster": [first.name, second.name]})
        port = free_port()
        start_daemon(config_text(clusters, url=url, port=port), port)
        final = wait_terminal(client, [job_id], timeout=120)
    finally:
        as_root("scontrol", "update", f"PartitionName={partition}", "State=UP",
                version=first.version)
    assert final[job_id]["phase"] == "succeeded" and final[job_id]["cluster"] == second.name
    rows = query(url, "SELECT submission, status, cluster FROM submissions "
                      "WHERE job_id = :j ORDER BY submission", {"j": job_id})
    assert [tuple(r) for r in rows] == [(1, "abandoned", first.name),
                                        (2, "ended", second.name)]
    assert settled_executions(second, {"dj-" + job_id: 1}) == {"dj-" + job_id: 1}
    assert executions(first, {"dj-" + job_id}) == {"dj-" + job_id: 0}
    kinds = [k for (k,) in query(url, "SELECT kind FROM events WHERE job_id = :j",
                                 {"j": job_id})]
    assert "Moved" in kinds and "Failed" not in kinds
