"""End-to-end harness: the daemon as a real process (``dispatchctl run``) against the real
local Slurm (as the ordinary user ``dispatch``) and a real database; sacct read as root
to check what really ran."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SLURM_ENV_FILE = Path("/var/lib/dispatch-slurm/env")
DISPATCHCTL = str(Path(sys.executable).parent / "dispatchctl")
CLUSTER = "lab"  # the [cluster] name of the daemons' configs here and in fault_support


def metric_key(name: str, cluster: str = CLUSTER, **labels: str) -> str:
    """The key ``scrape`` gives a sample of a per-cluster family, its labels (``cluster``
    and ``labels``) sorted by name as prometheus_client prints them:
    ``metric_key("dispatch_ticks_total", result="ok")`` is
    ``dispatch_ticks_total{cluster="lab",result="ok"}``, and ``cause`` comes before
    ``cluster``."""
    inner = ",".join(f'{k}="{v}"' for k, v in sorted({"cluster": cluster, **labels}.items()))
    return f"{name}{{{inner}}}"


def slurm_env(*options: str) -> dict[str, str]:
    """Start (or reconfigure) the cluster with ``options`` and return its env file."""
    subprocess.run([str(ROOT / "scripts/slurm-up"), *options], check=True,
                   stdout=subprocess.DEVNULL)
    env: dict[str, str] = {}
    for line in SLURM_ENV_FILE.read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep:
            env[key.strip()] = value.strip()
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_config(path: Path, *, database_url: str, port: int, tick_s: float = 1.0,
                 unknown_grace_s: int = 120, adopt_window_s: int = 180,
                 extra: str = "") -> Path:
    out_dir = "/tmp/dispatch-e2e-output"
    path.write_text(f"""
[cluster]
name = "{CLUSTER}"
[transport]
kind = "local"
run_as = "dispatch"
command_timeout_s = 30
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
unknown_grace_s = {unknown_grace_s}
adopt_window_s = {adopt_window_s}
[slurm]
rate_per_s = 200
""")
    return path


@dataclass
class DaemonProcess:
    config: Path
    port: int
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    kills: int = 0
    logs: list[Path] = field(default_factory=list)

    def start(self) -> None:
        self.starts += 1
        log = self.log.with_suffix(f".{self.starts}.log")
        self.logs.append(log)
        handle = log.open("wb")
        self.proc = subprocess.Popen([DISPATCHCTL, "run", "--config", str(self.config)],
                                     stdout=handle, stderr=subprocess.STDOUT, cwd=str(ROOT))
        handle.close()

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)
        self.kills += 1

    def terminate(self, timeout: float = 60) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout)

    def metrics(self) -> dict[str, float]:
        return scrape(self.port)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_text(self) -> str:
        return "".join(p.read_text(errors="replace") for p in self.logs if p.exists())


def scrape(port: int) -> dict[str, float]:
    """Parse a /metrics page into {'name{labels}': value}."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def wait_for(predicate: Callable[[], bool], *, timeout: float, interval: float = 0.5,
             what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except (OSError, ValueError):
            pass
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@contextmanager
def daemon(tmp: Path, database_url: str, **kw: Any) -> Iterator[DaemonProcess]:
    port = free_port()
    cfg = write_config(tmp / f"config-{port}.toml", database_url=database_url, port=port, **kw)
    d = DaemonProcess(cfg, port, tmp / f"daemon-{port}")
    d.start()
    try:
        wait_for(lambda: metric_key("dispatch_leader") in d.metrics(), timeout=30,
                 what="daemon metrics endpoint")
        yield d
    finally:
        if d.alive():
            try:
                d.terminate(timeout=30)
            except subprocess.TimeoutExpired:
                d.kill()


# ---------------------------------------------------------------- what really ran


@dataclass(frozen=True)
class SacctRecord:
    job_id: int
    name: str
    user: str
    state: str
    comment: str
    start: str
    exit_code: str
    nodes: str = ""  # NodeList: "None assigned" for a job that never ran


def sacct_records(names: set[str], *, since: str = "now-2hours") -> list[SacctRecord]:
    """Every accounting record (all users, duplicates of reused ids too) with one of ``names``."""
    out = subprocess.run(
        ["sacct", "-a", "-X", "-D", "-P", "-n", "-S", since,
         "-o", "JobIDRaw,JobName%64,User,State,Comment%200,Start,ExitCode,NodeList%200"],
        check=True, capture_output=True, text=True, env={**os.environ, "TZ": "UTC"}).stdout
    recs = []
    for line in out.splitlines():
        parts = line.split("|")
        if len(parts) < 8 or parts[1] not in names:
            continue
        recs.append(SacctRecord(int(parts[0]), parts[1], parts[2], parts[3].split()[0],
                                parts[4], parts[5], parts[6], parts[7]))
    return recs


def ran(rec: SacctRecord) -> bool:
    """Did this Slurm job ever start running (a held duplicate cancelled never did)? On
    22.05 a job cancelled while pending gets its end time as Start, but no node."""
    return rec.start not in ("Unknown", "None", "") and not never_ran(rec.nodes)


def never_ran(nodes: str) -> bool:
    """sacct's NodeList of a job that never ran."""
    return nodes.strip() in ("", "None assigned")


def squeue_names(user: str = "dispatch") -> list[tuple[int, str, str]]:
    out = subprocess.run(["squeue", "-h", "-u", user, "--states=all", "-o", "%i|%j|%T"],
                         check=True, capture_output=True, text=True).stdout
    rows = []
    for line in out.splitlines():
        i, n, t = line.split("|")
        rows.append((int(i), n, t))
    return rows


def cancel_all(user: str = "dispatch") -> None:
    subprocess.run(["scancel", "-u", user], check=False)


def jobs_json(client_url: str) -> list[dict[str, Any]]:
    out = subprocess.run([DISPATCHCTL, "get", "-o", "json"], check=True, capture_output=True,
                         text=True, env={**os.environ, "DISPATCH_DATABASE_URL": client_url})
    items: list[dict[str, Any]] = json.loads(out.stdout)["items"]
    return items
