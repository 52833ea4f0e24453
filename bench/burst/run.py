#!/usr/bin/env python3
"""bench/burst: a burst of job rows written in ONE transaction, submitted by the daemon to
the real Slurm cluster, against raw ``sbatch`` loops measured in the same run (issue 13).

Run as root from the repository, holding the cluster lock (the bench owns the cluster
while it runs: it cancels every job of the submit user ``dispatch`` between phases)::

    flock /tmp/dispatch-cluster.lock .venv/bin/python bench/burst/run.py \
        [--jobs 1000] [--runs 1] [--quick] [--singles 20] [--set KEY=VALUE ...]

Each run has two modes, each with three phases (the cluster is drained between phases):

  held     rows with desired ``held``: the daemon submits them gated and leaves them
           so; the baselines run ``sbatch --hold``
  running  rows with desired ``run`` and the command ``true``: the daemon submits them
           gated and releases them; the baselines run a plain ``sbatch`` (no hold)

  daemon   a fresh PostgreSQL database (scripts/postgres-up) and a fresh daemon
           (``python -m controller.cli run``, the configuration's defaults but for
           ``--set``); N rows committed in one transaction; when half of them have an
           sbatch, ONE more row (the mid-burst row); in held mode then ``--singles`` rows
           one by one, each after the daemon has settled the previous one
  raw      a shell loop of N ``sbatch`` as ``dispatch`` (the baseline of the targets)
  raw-8    the same N split over 8 loops running at once
  gated    running mode only: a shell loop of N ``sbatch --hold``, then ``scontrol
           release`` of their ids, 64 per command (as the daemon joins them): the least a
           client that gates and then releases every job (the exactly-once rule) costs

Sources (each the most exact one available):
- sbatch and release instants: slurmctld's own log (``_slurm_rpc_submit_batch_job`` and
  ``_slurm_rpc_update_job: complete`` lines, millisecond stamps; the log's time zone is
  calibrated with one probe job). Without a readable log: the instant the bench saw the
  ref in the ``submissions`` table (polled every 20-100 ms; said in the output);
- jobs/s: N / (last burst row's sbatch -- running mode: its release -- minus the commit
  instant); raw: N / the loop's wall time;
- Slurm commands per job: ``dispatch_slurm_commands_total`` (all labels) scraped before
  the commit and after the first daemon tick that ends once the burst and the mid-burst
  row are through, over N + 1 (a Start batch is one ``sh`` command however many sbatch it
  runs);
- slurmctld RPCs per job: the ``count`` of user ``dispatch`` in ``sdiag``'s "Remote
  Procedure Call statistics by user", before and after (the same window; sdiag runs as
  root, so it counts under root);
- longest tick: the daemon's own ``"tick" ... seconds=`` log lines in that window (the
  ``dispatch_tick_duration_seconds`` bucket bound is printed beside it);
- the lease TTL: ``daemon.lease_ttl_s`` of the configuration the daemon ran with.

The bench prints figures, ratios against the baselines of the same run and each target
as met / NOT MET; it asserts nothing (exit 0 unless the bench itself failed). With
``--runs K`` > 1 every figure is printed as min / median / max, and the targets are
judged on the medians. ``--quick`` (smoke use): 100 jobs and 5 single rows unless
``--jobs``/``--singles`` say otherwise.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pwd
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT))

from sqlalchemy import create_engine, select, text  # noqa: E402

from controller.config import Config, parse_config, toml_value  # noqa: E402
from controller.model.ids import JobID, new_job_id  # noqa: E402
from controller.model.spec import JobDocument  # noqa: E402
from controller.store import repo  # noqa: E402
from controller.store.db import Store  # noqa: E402
from controller.store.models import JobStatus, Submission  # noqa: E402

ENV_FILE = Path("/var/lib/dispatch-slurm/env")
RAW_NAME = "dispatch-bench-raw"
PROBE_NAME = "dispatch-bench-probe"
PARALLEL = 8
QUICK_JOBS = 100
QUICK_SINGLES = 5
DOCUMENT = {"command": ["true"], "workdir": "/tmp", "labels": {"bench": "burst"}}
MODES = ("held", "running")
DESIRED = {"held": "held", "running": "run"}

# ---------------------------------------------------------------- Slurm, as root and user


def slurm_env() -> dict[str, str]:
    """The env file of scripts/slurm-up (the cluster is started when it does not answer)."""
    if not ENV_FILE.exists() or subprocess.run(["scontrol", "ping"], capture_output=True,
                                               check=False).returncode != 0:
        subprocess.run([str(ROOT / "scripts" / "slurm-up")], check=True,
                       stdout=subprocess.DEVNULL)
    env = {}
    for line in ENV_FILE.read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep:
            env[key.strip()] = value.strip()
    return env


def as_root(*argv: str, check: bool = True,
            timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, check=check,
                          timeout=timeout, env={**os.environ, "TZ": "UTC"})


def as_user(user: str, *argv: str, check: bool = True,
            timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """A command of the submit user (``runuser``), as tests/slurm_fixtures.py runs them."""
    return subprocess.run(["runuser", "-u", user, "--", "env", "TZ=UTC", *argv],
                          capture_output=True, text=True, check=check, timeout=timeout,
                          cwd="/tmp")


def show_config() -> dict[str, str]:
    config = {}
    for line in as_root("scontrol", "show", "config").stdout.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() and " " not in key.strip():
            config[key.strip()] = value.strip()
    return config


def live_jobs(user: str) -> int:
    """Jobs of ``user`` that are not over (squeue's default states)."""
    out = as_root("squeue", "-h", "-u", user, "-o", "%i")
    return len(out.stdout.split())


def jobs_in_slurmctld() -> int:
    """Every job slurmctld holds, ended ones (MinJobAge) included."""
    return len(as_root("squeue", "-h", "-a", "--states=all", "-o", "%i").stdout.split())


def cancel_all(user: str, timeout: float = 300) -> None:
    """Cancel every job of ``user`` and wait until none is left running or queued."""
    as_user(user, "scancel", "-u", user, check=False)
    deadline = time.monotonic() + timeout
    while live_jobs(user):
        if time.monotonic() > deadline:
            raise RuntimeError(f"jobs of {user} still live {timeout:g} s after scancel")
        time.sleep(0.5)


def wait_for_room(need: int, max_jobs: int, min_job_age: int) -> None:
    """Wait until slurmctld can take ``need`` more jobs under MaxJobCount (ended jobs
    leave its memory MinJobAge seconds after they end)."""
    deadline = time.monotonic() + min_job_age + 120
    said = False
    while (held := jobs_in_slurmctld()) + need > max_jobs * 0.95:
        if time.monotonic() > deadline:
            raise RuntimeError(f"slurmctld still holds {held} jobs (MaxJobCount {max_jobs})")
        if not said:
            progress(f"waiting for slurmctld to purge ended jobs: {held} held, {need} "
                     f"needed, MaxJobCount {max_jobs} (MinJobAge {min_job_age} s)")
            said = True
        time.sleep(5)


def sdiag_counts() -> tuple[dict[str, int], dict[str, int]]:
    """``sdiag``'s RPC counts: (by user, by message type)."""
    by_user: dict[str, int] = {}
    by_type: dict[str, int] = {}
    table: dict[str, int] | None = None
    row = re.compile(r"^\s+(\S+)\s+\(\s*\d+\)\s+count:(\d+)")
    for line in as_root("sdiag").stdout.splitlines():
        if line.startswith("Remote Procedure Call statistics by message type"):
            table = by_type
        elif line.startswith("Remote Procedure Call statistics by user"):
            table = by_user
        elif line and not line[0].isspace():
            table = None
        elif table is not None and (m := row.match(line)):
            table[m.group(1)] = int(m.group(2))
    return by_user, by_type


def delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}


# ---------------------------------------------------------------- slurmctld's own log

_STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?)\]")
_SUBMIT = re.compile(r"_slurm_rpc_submit_batch_job: JobId=(\d+) ")
_UPDATE = re.compile(r"_slurm_rpc_update_job: complete JobId=([0-9,]+) uid=(\d+) ")


class SlurmctldLog:
    """Follows slurmctld's log from a mark: each submitted job id with the instant
    slurmctld accepted it, and the first job update (a release) of the submit user."""

    def __init__(self, path: Path, uid: int) -> None:
        self.path = path
        self.uid = uid
        self.pos = 0
        self.shift = 0.0  # the log's zone: stamp read as UTC minus shift = Unix time
        self.submits: dict[int, float] = {}
        self.updates: dict[int, float] = {}

    def mark(self) -> None:
        """Forget what was read; follow from the end of the log as it is now."""
        self.pos = self.path.stat().st_size
        self.submits.clear()
        self.updates.clear()

    def poll(self) -> None:
        size = self.path.stat().st_size
        if size < self.pos:  # rotated or rewritten (slurm-up): from the start
            self.pos = 0
        if size == self.pos:
            return
        with self.path.open("rb") as handle:
            handle.seek(self.pos)
            data = handle.read(size - self.pos)
        cut = data.rfind(b"\n") + 1  # whole lines only
        self.pos += cut
        for line in data[:cut].decode("utf-8", "replace").splitlines():
            stamp = _STAMP.match(line)
            if stamp is None:
                continue
            if m := _SUBMIT.search(line):
                self.submits.setdefault(int(m.group(1)), self._when(stamp.group(1)))
            elif (m := _UPDATE.search(line)) and int(m.group(2)) == self.uid:
                for job_id in m.group(1).split(","):
                    if job_id:
                        self.updates.setdefault(int(job_id), self._when(stamp.group(1)))

    def _when(self, stamp: str) -> float:
        fmt = "%Y-%m-%dT%H:%M:%S.%f" if "." in stamp else "%Y-%m-%dT%H:%M:%S"
        return datetime.strptime(stamp, fmt).replace(tzinfo=UTC).timestamp() - self.shift

    def calibrate(self, user: str) -> bool:
        """Submit one held probe job: does the log name it, and in which time zone?"""
        self.shift = 0.0
        self.mark()
        began = time.time()
        out = as_user(user, "sbatch", "--parsable", "--hold", f"--job-name={PROBE_NAME}",
                      "--output=/dev/null", "--chdir=/tmp", "--wrap", "true")
        ended = time.time()
        job_id = int(out.stdout.strip().split(";")[0])
        try:
            deadline = time.monotonic() + 5
            while job_id not in self.submits and time.monotonic() < deadline:
                time.sleep(0.05)
                self.poll()
        finally:
            as_user(user, "scancel", str(job_id), check=False)
        if job_id not in self.submits:
            return False
        self.shift = round((self.submits[job_id] - (began + ended) / 2) / 900) * 900
        return True


# ---------------------------------------------------------------- the daemon

_TICK = re.compile(r'^\S+ \S+ dispatch\.daemon "tick" .*\bseconds=([0-9.eE+-]+)')
_ACTIONS = re.compile(r"\bactions=(\{[^}]*\})")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> dict[str, float]:
    """A /metrics page as {'name{labels}': value}."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        body = resp.read().decode()
    out: dict[str, float] = {}
    for line in body.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def metric_key(name: str, cluster: str, **labels: str) -> str:
    """The ``scrape`` key of a sample of a per-cluster family, its labels (``cluster`` and
    ``labels``) sorted by name as prometheus_client prints them."""
    inner = ",".join(f'{k}="{v}"' for k, v in sorted({"cluster": cluster, **labels}.items()))
    return f"{name}{{{inner}}}"


def commands_by_label(metrics: dict[str, float], cluster: str) -> dict[str, float]:
    """Each command's ``dispatch_slurm_commands_total`` of ``cluster``."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        m = re.search(r'command="([^"]*)"', key)
        if m and key == metric_key("dispatch_slurm_commands_total", cluster, command=m[1]):
            out[m[1]] = value
    return out


def tick_bucket_bound(after: dict[str, float], before: dict[str, float],
                      cluster: str) -> float | None:
    """The smallest ``le`` of dispatch_tick_duration_seconds (of ``cluster``) holding every
    tick of the window (inf: the top bucket); None when no tick ended in it."""
    name = "dispatch_tick_duration_seconds"
    count_key = metric_key(f"{name}_count", cluster)
    count = after.get(count_key, 0) - before.get(count_key, 0)
    if count <= 0:
        return None
    bounds = []
    for key, value in after.items():
        m = re.search(r'le="([^"]+)"', key)
        if (m and key == metric_key(f"{name}_bucket", cluster, le=m[1])
                and value - before.get(key, 0) >= count):
            bounds.append(float(m[1]))
    return min(bounds) if bounds else None


@dataclass
class Daemon:
    """``python -m controller.cli run`` with its log in a file."""

    config: Path
    port: int
    log: Path
    cluster: str  # the cluster label of its metrics (its config's cluster name)
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("wb") as handle:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "controller.cli", "run", "--config", str(self.config)],
                stdout=handle, stderr=subprocess.STDOUT, cwd=str(ROOT),
                env={k: v for k, v in os.environ.items() if k != "DISPATCH_DATABASE_URL"})

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def metrics(self) -> dict[str, float]:
        return scrape(self.port)

    def offset(self) -> int:
        return self.log.stat().st_size if self.log.exists() else 0

    def tick_lines(self, since: int) -> list[tuple[float, dict[str, int] | None]]:
        """(seconds, actions) of each tick the daemon logged after byte ``since``."""
        with self.log.open("rb") as handle:
            handle.seek(since)
            data = handle.read()
        data = data[:data.rfind(b"\n") + 1]
        out: list[tuple[float, dict[str, int] | None]] = []
        for line in data.decode("utf-8", "replace").splitlines():
            if m := _TICK.match(line):
                actions = _ACTIONS.search(line)
                out.append((float(m.group(1)),
                            json.loads(actions.group(1)) if actions else None))
        return out

    def ticks(self, since: int) -> list[float]:
        """The durations of the ticks the daemon logged after byte ``since``."""
        return [seconds for seconds, _ in self.tick_lines(since)]

    def wait_tick(self, since: int, timeout: float, *, submitted: bool = False) -> None:
        """Until a tick ends (is logged) after byte ``since``; with ``submitted``, a tick
        that submitted something (any tick, if the log does not say)."""
        def logged() -> bool:
            return any(not submitted or actions is None or actions.get("submit")
                       for _, actions in self.tick_lines(since))
        wait_until(logged, timeout, "a daemon tick", self)

    def wait_ready(self, timeout: float = 90) -> None:
        def ready() -> bool:
            try:
                leader = self.metrics().get(metric_key("dispatch_leader", self.cluster)) == 1.0
            except OSError:
                return False
            return leader and bool(self.ticks(0))
        wait_until(ready, timeout, "the daemon leading and ticking", self)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)

    def tail(self, lines: int = 20) -> str:
        if not self.log.exists():
            return ""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def wait_until(predicate: Callable[[], bool], timeout: float, what: str,
               daemon: Daemon | None = None, interval: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if daemon is not None and not daemon.alive():
            raise RuntimeError(f"the daemon exited while waiting for {what}:\n{daemon.tail()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


# ---------------------------------------------------------------- the database


def postgres_url() -> str:
    out = subprocess.run([str(ROOT / "scripts" / "postgres-up")], check=True,
                         capture_output=True, text=True)
    return out.stdout.strip().splitlines()[-1]


@contextmanager
def database(admin_url: str) -> Iterator[str]:
    """A fresh PostgreSQL database of the bench's own (dropped after)."""
    name = "dispatch_bench_burst_" + uuid.uuid4().hex[:12]
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        yield admin_url.rsplit("/", 1)[0] + "/" + name
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def insert_rows(store: Store, ids: Sequence[JobID], desired: str,
                document: JobDocument) -> float:
    """Write the rows in ONE transaction; returns the instant the commit returned."""
    with store.transaction() as tx:
        now = int(time.time())
        for job_id in ids:
            repo.insert_job(tx, job_id=job_id, document=document, desired=desired, now=now)
    return time.time()


def recorded_refs(store: Store) -> dict[str, int]:
    """Job id -> Slurm job id of every submission the daemon recorded a ref for."""
    with store.transaction() as tx:
        rows = tx.execute(select(Submission.job_id, Submission.slurm_job_id)
                          .where(Submission.slurm_job_id.is_not(None))
                          .order_by(Submission.submission)).all()
    return {job_id: int(slurm_id) for job_id, slurm_id in rows if slurm_id is not None}


def released_jobs(store: Store) -> set[str]:
    """Jobs whose current object the daemon has seen out of its gate (no log fallback)."""
    with store.transaction() as tx:
        rows = tx.execute(select(JobStatus.job_id).where(
            JobStatus.object_state.is_not(None),
            JobStatus.object_state.not_in(("gated", "held")))).all()
    return {job_id for (job_id,) in rows}


# ---------------------------------------------------------------- the phases


@dataclass
class Context:
    user: str
    args: argparse.Namespace
    admin_url: str
    log: SlurmctldLog | None
    config: Config  # the daemon's configuration, as parsed (database url aside)
    overrides: dict[str, dict[str, Any]]
    workdir: Path
    max_jobs: int
    min_job_age: int
    queue_at_start: dict[str, int] = field(default_factory=dict)


def progress(message: str) -> None:
    print(f"bench/burst: {message}", file=sys.stderr, flush=True)


def raw_loop(ctx: Context, mode: str, parallel: int) -> dict[str, Any]:
    """N ``sbatch`` as the submit user, in ``parallel`` shell loops at once."""
    jobs = ctx.args.jobs
    hold = "--hold " if mode == "held" else ""
    one = (f"sbatch --parsable {hold}--job-name={RAW_NAME} --output=/dev/null "
           "--chdir=/tmp --wrap true >/dev/null || exit 1")
    shares = [jobs // parallel + (1 if k < jobs % parallel else 0) for k in range(parallel)]
    loops = [f"( i=0; while [ $i -lt {n} ]; do {one}; i=$((i+1)); done ) & pids=\"$pids $!\""
             for n in shares if n]
    script = ("pids=; " + "; ".join(loops)
              + "; rc=0; for p in $pids; do wait $p || rc=1; done; exit $rc")
    return timed_script(ctx, script)


def timed_script(ctx: Context, script: str) -> dict[str, Any]:
    """Run a baseline's shell script as the submit user: its wall time, N / that, and the
    user's slurmctld RPCs per job (sdiag before and after); the cluster drained after."""
    jobs = ctx.args.jobs
    wait_for_room(jobs, ctx.max_jobs, ctx.min_job_age)
    users0, types0 = sdiag_counts()
    began = time.perf_counter()
    as_user(ctx.user, "sh", "-c", script, timeout=ctx.args.timeout)
    took = time.perf_counter() - began
    users1, types1 = sdiag_counts()
    cancel_all(ctx.user)
    rpcs = delta(users1, users0).get(ctx.user, 0)
    return {"seconds": took, "rate": jobs / took, "rpcs": rpcs / jobs,
            "rpc_types": delta(types1, types0)}


def gated_loop(ctx: Context) -> dict[str, Any]:
    """N ``sbatch --hold`` in one shell loop, then ``scontrol release`` of their ids, 64 per
    command: what gate-then-release costs a client that does nothing else."""
    jobs = ctx.args.jobs
    one = (f"id=$(sbatch --parsable --hold --job-name={RAW_NAME} --output=/dev/null "
           "--chdir=/tmp --wrap true) || exit 1; ids=\"$ids ${id%%;*}\"")
    script = (f"ids=; i=0; while [ $i -lt {jobs} ]; do {one}; i=$((i+1)); done; "
              "printf '%s\\n' $ids | xargs -n 64 | tr ' ' ',' | "
              "while read -r list; do scontrol release \"$list\" || exit 1; done")
    return timed_script(ctx, script)


def write_config(ctx: Context, url: str, port: int, output: Path) -> Path:
    doc: dict[str, dict[str, Any]] = {
        "cluster": {"name": ctx.config.cluster.name},
        "transport": {"kind": "local", "run_as": ctx.user},
        "output": {"dir": str(output)},
        "database": {"url": url},
        "daemon": {"metrics_port": port},
    }
    for group, table in ctx.overrides.items():
        doc.setdefault(group, {}).update(table)
    parse_config(doc)  # refused here, naming the key, rather than by the daemon
    lines = []
    for group, table in doc.items():
        lines.append(f"[{group}]")
        lines += [f"{key} = {toml_value(value)}" for key, value in table.items()]
    path = ctx.workdir / f"config-{port}.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def daemon_burst(ctx: Context, mode: str, run: int) -> dict[str, Any]:
    """N rows in one transaction, the mid-burst row, and (held) the single rows."""
    jobs = ctx.args.jobs
    singles = ctx.args.singles if mode == "held" else 0
    desired = DESIRED[mode]
    document = JobDocument.parse(DOCUMENT)
    wait_for_room(jobs + singles + 10, ctx.max_jobs, ctx.min_job_age)
    ctx.queue_at_start[f"{run}.{mode}"] = jobs_in_slurmctld()
    output = ctx.workdir / f"output-{run}-{mode}"
    output.mkdir()
    owner = pwd.getpwnam(ctx.user)
    os.chown(output, owner.pw_uid, owner.pw_gid)
    with database(ctx.admin_url) as url:
        store = Store(url)
        port = free_port()
        daemon = Daemon(write_config(ctx, url, port, output), port,
                        ctx.workdir / f"daemon-{run}-{mode}.log",
                        ctx.config.default_cluster.name)
        try:
            store.migrate()
            daemon.start()
            daemon.wait_ready()
            result = _burst(ctx, mode, store, daemon, desired, document)
            if singles:
                result.update(_singles(ctx, store, daemon, desired, document, singles))
            return result
        finally:
            daemon.stop()
            store.dispose()
            cancel_all(ctx.user)


def _burst(ctx: Context, mode: str, store: Store, daemon: Daemon, desired: str,
           document: JobDocument) -> dict[str, Any]:
    jobs = ctx.args.jobs
    log = ctx.log
    ids = [new_job_id() for _ in range(jobs)]
    mid = new_job_id()
    half = max(1, jobs // 2)
    tick_interval = ctx.config.daemon.tick_interval_s
    time.sleep(1.5)  # the first tick's tail and the first cluster-stats read (at 1 s) are done
    metrics0 = daemon.metrics()
    users0, types0 = sdiag_counts()
    start = daemon.offset()
    if log is not None:
        log.mark()

    began = time.time()
    committed = insert_rows(store, ids, desired, document)
    progress(f"{mode}: {jobs} rows committed in {committed - began:.2f} s")
    mid_commit: float | None = None
    mid_after = 0
    seen: dict[str, float] = {}  # job id -> when the bench first saw its ref (fallback)
    refs: dict[str, int] = {}
    released: set[str] = set()
    polled = 0.0
    deadline = time.monotonic() + ctx.args.timeout
    timed_out = False
    while True:
        if log is not None:
            log.poll()
        now = time.time()
        if now - polled >= 0.1:
            polled = now
            refs = recorded_refs(store)
            for job_id in refs:
                seen.setdefault(job_id, now)
            if log is None and mode == "running":
                released = released_jobs(store)
        submitted = len(log.submits) if log is not None else len(refs)
        if mid_commit is None and submitted >= half:
            mid_after = submitted
            mid_commit = insert_rows(store, [mid], desired, document)
        wanted = [*ids, mid] if mid_commit is not None else ids
        if mid_commit is not None and all(j in refs for j in wanted):
            if log is None:
                done = mode == "held" or all(j in released for j in wanted)
            else:
                done = all(refs[j] in log.submits for j in wanted) and (
                    mode == "held" or all(refs[j] in log.updates for j in wanted))
            if done:
                break
        if not daemon.alive():
            raise RuntimeError(f"the daemon exited during the burst:\n{daemon.tail()}")
        if time.monotonic() > deadline:
            timed_out = True
            break
        time.sleep(0.02)

    # the window ends with the first tick logged after the burst is through
    daemon.wait_tick(daemon.offset(), timeout=2 * tick_interval + ctx.args.timeout)
    metrics1 = daemon.metrics()
    users1, types1 = sdiag_counts()
    ticks = daemon.ticks(start)

    done_at: dict[str, float]
    sbatch_at: dict[str, float]
    if log is not None:
        at = log.updates if mode == "running" else log.submits
        done_at = {j: at[refs[j]] for j in ids if j in refs and refs[j] in at}
        sbatch_at = {j: log.submits[refs[j]] for j in [*ids, mid]
                     if j in refs and refs[j] in log.submits}
        source = "slurmctld log"
    else:
        done_at = {j: seen[j] for j in ids if j in seen}
        sbatch_at = dict(seen)
        source = "database poll"
    through = len(done_at)
    end = max(done_at.values()) if done_at else time.time()
    commands0 = commands_by_label(metrics0, daemon.cluster)
    commands1 = commands_by_label(metrics1, daemon.cluster)
    per_command = {k: (v - commands0.get(k, 0)) / (jobs + 1) for k, v in commands1.items()
                   if v != commands0.get(k, 0)}
    rpcs = delta(users1, users0).get(ctx.user, 0)
    result: dict[str, Any] = {
        "insert_s": committed - began,
        "seconds": end - committed,
        "rate": through / (end - committed) if end > committed else math.inf,
        "through": through, "timed_out": timed_out, "source": source,
        "first_sbatch_s": (min(sbatch_at.values()) - committed) if sbatch_at else None,
        "commands": sum(per_command.values()), "per_command": per_command,
        "rpcs": rpcs / (jobs + 1), "rpc_types": delta(types1, types0),
        "longest_tick": max(ticks) if ticks else None, "ticks": len(ticks),
        "tick_bucket": tick_bucket_bound(metrics1, metrics0, daemon.cluster),
        "mid_after": mid_after,
        "mid_latency": (sbatch_at[mid] - mid_commit
                        if mid_commit is not None and mid in sbatch_at else None),
    }
    progress(f"{mode}: daemon burst {result['rate']:.1f} jobs/s ({through}/{jobs} through "
             f"in {result['seconds']:.1f} s{', TIMED OUT' if timed_out else ''}), "
             f"longest tick {result['longest_tick']} s")
    return result


def _singles(ctx: Context, store: Store, daemon: Daemon, desired: str,
             document: JobDocument, count: int) -> dict[str, Any]:
    """Rows one at a time, each once the daemon has settled the one before."""
    log = ctx.log
    latencies: list[float] = []
    for _ in range(count):
        time.sleep(0.2)
        job_id = new_job_id()
        if log is not None:
            log.mark()
        since = daemon.offset()
        committed = insert_rows(store, [job_id], desired, document)
        deadline = time.monotonic() + 60
        ref: int | None = None
        seen = 0.0
        polled = 0.0
        while True:
            if log is not None:
                log.poll()
            now = time.time()
            if ref is None and (log is None or log.submits) and now - polled >= 0.02:
                polled = now
                ref = recorded_refs(store).get(job_id)
                seen = now
            if ref is not None and (log is None or ref in log.submits):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"single row {job_id} got no sbatch within 60 s")
            time.sleep(0.005 if log is not None else 0.01)
        latencies.append((log.submits[ref] if log is not None else seen) - committed)
        # the tick that submitted it has ended: the daemon is idle again
        daemon.wait_tick(since, timeout=2 * ctx.config.daemon.tick_interval_s + 60,
                         submitted=True)
    ordered = sorted(latencies)
    return {"single_p50": statistics.median(ordered),
            "single_p95": ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)],
            "singles": latencies}


def one_run(ctx: Context, run: int) -> dict[str, dict[str, dict[str, Any]]]:
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for mode in MODES:
        progress(f"run {run}, {mode}: daemon burst of {ctx.args.jobs}")
        daemon = daemon_burst(ctx, mode, run)
        progress(f"run {run}, {mode}: raw sbatch loop")
        raw = raw_loop(ctx, mode, 1)
        progress(f"run {run}, {mode}: {PARALLEL}-way raw loop")
        raw8 = raw_loop(ctx, mode, PARALLEL)
        daemon["vs_raw"] = daemon["rate"] / raw["rate"]
        daemon["vs_raw8"] = daemon["rate"] / raw8["rate"]
        out[mode] = {"daemon": daemon, "raw": raw, "raw8": raw8}
        if mode == "running":
            progress(f"run {run}, {mode}: raw sbatch --hold loop, then joined releases")
            gated = gated_loop(ctx)
            daemon["vs_gated"] = daemon["rate"] / gated["rate"]
            gated["vs_raw"] = gated["rate"] / raw["rate"]
            out[mode]["gated"] = gated
    return out


# ---------------------------------------------------------------- the report


def spread(values: Sequence[float | None], fmt: str) -> str:
    got = [v for v in values if v is not None]
    if not got:
        return "n/a"
    if len(values) == 1:
        return format(got[0], fmt)
    return " / ".join(format(v, fmt) for v in (min(got), statistics.median(got), max(got)))


def median(values: Sequence[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return statistics.median(got) if got else None


def code_state() -> str:
    git = ["git", "-C", str(ROOT)]
    head = subprocess.run([*git, "log", "-1", "--format=%h"], capture_output=True, text=True,
                          check=False)
    if head.returncode != 0:
        return f"{ROOT} (not a git checkout)"
    dirty = subprocess.run([*git, "status", "--porcelain", "--", "controller", "migrations"],
                           capture_output=True, text=True, check=False).stdout.split("\n")
    changed = [line[3:] for line in dirty if line.strip()]
    return head.stdout.strip() + (f" + uncommitted changes in {', '.join(changed)}"
                                  if changed else " (clean)")


def report(ctx: Context, runs: list[dict[str, dict[str, dict[str, Any]]]], env: dict[str, str],
           log_note: str) -> None:
    a = ctx.args
    c = ctx.config
    ttl = c.daemon.lease_ttl_s

    def col(mode: str, phase: str, key: str) -> list[float | None]:
        return [r[mode][phase].get(key) for r in runs]

    print(f"bench/burst: Slurm {env.get('SLURM_VERSION', '?')} (cluster {c.cluster.name}), "
          f"{a.jobs} rows per burst, {len(runs)} run(s)"
          + (" (figures: min / median / max)" if len(runs) > 1 else ""))
    print(f"  code: {code_state()}")
    print(f"  daemon: tick {c.daemon.tick_interval_s:g} s, lease TTL {ttl:g} s, "
          f"rate {c.slurm.rate_per_s:g}/s, action concurrency "
          f"{c.reconcile.action_concurrency}, plan chunk {c.reconcile.plan_chunk}"
          + (f"; --set {' '.join(a.set)}" if a.set else " (defaults)"))
    print(f"  sbatch instants: {log_note}")
    print(f"  jobs held by slurmctld when each daemon burst began: "
          f"{', '.join(f'{k} {v}' for k, v in ctx.queue_at_start.items())}")
    def row(label: str, figure: str, note: str = "") -> None:
        print(f"  {label:<28} {figure:>12}" + (f"   {note}" if note else ""))

    for mode in MODES:
        d = [r[mode]["daemon"] for r in runs]
        print(f"{mode}:")
        row(f"raw sbatch{' --hold' if mode == 'held' else ''} loop",
            spread(col(mode, "raw", "rate"), ".1f"),
            f"jobs/s, {spread(col(mode, 'raw', 'rpcs'), '.2f')} RPCs/job")
        row(f"{PARALLEL}-way raw loop", spread(col(mode, "raw8", "rate"), ".1f"),
            f"jobs/s, {spread(col(mode, 'raw8', 'rpcs'), '.2f')} RPCs/job")
        if mode == "running" and all("gated" in r[mode] for r in runs):
            row("raw --hold loop + releases", spread(col(mode, "gated", "rate"), ".1f"),
                f"jobs/s = {spread(col(mode, 'gated', 'vs_raw'), '.2f')}x the raw loop, "
                f"{spread(col(mode, 'gated', 'rpcs'), '.2f')} RPCs/job (gate, then release)")
        row("daemon burst", spread(col(mode, "daemon", "rate"), ".1f"),
            f"jobs/s = {spread(col(mode, 'daemon', 'vs_raw'), '.2f')}x the raw loop, "
            f"{spread(col(mode, 'daemon', 'vs_raw8'), '.2f')}x the {PARALLEL}-way loop"
            + (f", {spread(col(mode, 'daemon', 'vs_gated'), '.2f')}x the gated loop"
               if mode == "running" and all("gated" in r[mode] for r in runs) else ""))
        for item in d:
            if item["timed_out"]:
                row("  TIMED OUT", f"{a.timeout:g} s", f"{item['through']}/{a.jobs} through")
        row("  rows committed in", spread(col(mode, "daemon", "insert_s"), ".2f"),
            f"s; after the commit: first sbatch "
            f"{spread(col(mode, 'daemon', 'first_sbatch_s'), '.3f')} s, last "
            f"{'release' if mode == 'running' else 'sbatch'} "
            f"{spread(col(mode, 'daemon', 'seconds'), '.1f')} s")
        per: dict[str, float] = {}
        for item in d:
            for k, v in item["per_command"].items():
                per[k] = per.get(k, 0.0) + v / len(d)
        parts = ", ".join(f"{k} {v:.2f}" for k, v in sorted(per.items(), key=lambda kv: -kv[1]))
        row("  Slurm commands/job", spread(col(mode, "daemon", "commands"), ".2f"),
            f"({parts}; 'sh' is one Start batch)")
        types: dict[str, float] = {}
        for item in d:
            for k, v in item["rpc_types"].items():
                types[k] = types.get(k, 0.0) + v / len(d) / (a.jobs + 1)
        top = ", ".join(f"{k} {v:.2f}" for k, v in
                        sorted(types.items(), key=lambda kv: -kv[1]) if v >= 0.05)
        row("  slurmctld RPCs/job", spread(col(mode, "daemon", "rpcs"), ".2f"),
            f"(user {ctx.user}; all users, by type: {top})")
        row("  longest tick", spread(col(mode, "daemon", "longest_tick"), ".2f"),
            f"s (daemon log, {spread([float(i['ticks']) for i in d], '.0f')} ticks; histogram "
            f"bucket <= {spread([i['tick_bucket'] for i in d], 'g')} s)")
        row("  mid-burst row -> sbatch", spread(col(mode, "daemon", "mid_latency"), ".3f"),
            f"s (inserted when {spread([float(i['mid_after']) for i in d], '.0f')} of "
            f"{a.jobs} had an sbatch)")
        if mode == "held" and a.singles:
            p50 = [None if v is None else v * 1000 for v in col(mode, "daemon", "single_p50")]
            p95 = [None if v is None else v * 1000 for v in col(mode, "daemon", "single_p95")]
            row("  single row -> sbatch p50", spread(p50, ".0f"),
                f"ms, p95 {spread(p95, '.0f')} ms ({a.singles} rows one by one)")

    targets: list[tuple[str, float | None, float, bool, str]] = [
        ("held burst >= 0.9x raw loop", median(col("held", "daemon", "vs_raw")), 0.9, True,
         "x"),
        ("running burst >= 0.8x raw loop", median(col("running", "daemon", "vs_raw")), 0.8,
         True, "x"),
    ]
    for mode in MODES:
        targets.append((f"{mode}: Slurm commands/job <= 1.3",
                        median(col(mode, "daemon", "commands")), 1.3, False, ""))
        targets.append((f"{mode}: slurmctld RPCs/job <= 1.5",
                        median(col(mode, "daemon", "rpcs")), 1.5, False, ""))
    ticks = [t for m in MODES if (t := median(col(m, "daemon", "longest_tick"))) is not None]
    targets.append((f"longest tick <= TTL/3 = {ttl / 3:g} s", max(ticks) if ticks else None,
                    ttl / 3, False, " s"))
    for mode in MODES:
        targets.append((f"{mode}: mid-burst row -> sbatch <= 2 s",
                        median(col(mode, "daemon", "mid_latency")), 2.0, False, " s"))
    if a.singles:
        single = median(col("held", "daemon", "single_p50"))
        targets.append(("single row -> sbatch p50 < 100 ms",
                        None if single is None else single * 1000, 100.0, False, " ms"))
    print("targets" + (" (on the medians)" if len(runs) > 1 else "") + ":")
    for name, value, bound, at_least, unit in targets:
        if value is None:
            verdict, shown = "n/a", "n/a"
        else:
            met = value >= bound if at_least else (
                value < bound if name.endswith("< 100 ms") else value <= bound)
            verdict, shown = ("met" if met else "NOT MET"), f"{value:.2f}{unit}"
        print(f"  {name:<40} {shown:>12}   {verdict}")


# ---------------------------------------------------------------- main


def parse_overrides(items: Sequence[str]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for item in items:
        key, sep, value = item.partition("=")
        group, dot, name = key.strip().partition(".")
        if not sep or not dot:
            raise SystemExit(f"bench/burst: --set takes group.key=value, not {item!r}")
        try:
            out.setdefault(group, {})[name] = tomllib.loads(f"v = {value}")["v"]
        except tomllib.TOMLDecodeError:
            out.setdefault(group, {})[name] = value  # a bare string
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=None,
                    help="rows per burst and sbatch per raw loop (default 1000; --quick 100)")
    ap.add_argument("--runs", type=int, default=1,
                    help="whole runs; with more than one, min / median / max (default 1)")
    ap.add_argument("--singles", type=int, default=None,
                    help="single rows after the held burst (default 20; --quick 5)")
    ap.add_argument("--quick", action="store_true", help="smoke use: 100 jobs, 5 singles")
    ap.add_argument("--timeout", type=float, default=None,
                    help="seconds a burst or a raw loop may take (default 120 + 0.5 per job)")
    ap.add_argument("--set", action="append", default=[], metavar="GROUP.KEY=VALUE",
                    help="a daemon setting (TOML value), e.g. slurm.rate_per_s=200")
    ap.add_argument("--database-url", default=None,
                    help="PostgreSQL URL of a role that may create databases (default: the "
                         "last line of scripts/postgres-up)")
    ap.add_argument("--json", type=Path, default=None, help="also write every figure here")
    ap.add_argument("--keep", action="store_true",
                    help="keep the daemons' logs and configurations (printed at the end)")
    args = ap.parse_args()
    args.jobs = args.jobs or (QUICK_JOBS if args.quick else 1000)
    args.singles = args.singles if args.singles is not None else (
        QUICK_SINGLES if args.quick else 20)
    args.timeout = args.timeout or 120 + 0.5 * args.jobs
    if args.jobs < 2 or args.runs < 1 or args.singles < 0:
        ap.error("--jobs must be at least 2, --runs at least 1, --singles at least 0")
    if os.geteuid() != 0:
        ap.error("run as root (commands run as the submit user through runuser; sdiag and "
                 "slurmctld's log are read as root)")

    overrides = parse_overrides(args.set)
    env = slurm_env()
    user = env["SUBMIT_USER"]
    base = {g: dict(t) for g, t in overrides.items()}
    base.setdefault("cluster", {}).setdefault("name", env.get("CLUSTER", "lab"))
    config = parse_config(base)
    if (busy := live_jobs(user)) > 0:
        print(f"bench/burst: user {user} has {busy} live jobs: someone else is using the "
              "cluster (run under flock /tmp/dispatch-cluster.lock)", file=sys.stderr)
        return 2
    slurm_config = show_config()
    max_jobs = int(slurm_config.get("MaxJobCount", "10000").split()[0])
    min_job_age = int(slurm_config.get("MinJobAge", "300 sec").split()[0])
    log: SlurmctldLog | None = None
    log_path = Path(slurm_config.get("SlurmctldLogFile", "/nonexistent"))
    log_note = "the database poll (slurmctld's log names no submissions)"
    if log_path.is_file():
        log = SlurmctldLog(log_path, pwd.getpwnam(user).pw_uid)
        if log.calibrate(user):
            log_note = f"slurmctld's log {log_path} (zone offset {log.shift / 3600:+g} h)"
        else:
            log = None
    admin_url = args.database_url or postgres_url()
    workdir = Path(tempfile.mkdtemp(prefix="dispatch-bench-burst-"))
    workdir.chmod(0o755)  # the submit user writes its jobs' output below
    ctx = Context(user=user, args=args, admin_url=admin_url, log=log, config=config,
                  overrides=overrides, workdir=workdir, max_jobs=max_jobs,
                  min_job_age=min_job_age)
    runs = []
    failed = True
    try:
        for run in range(1, args.runs + 1):
            runs.append(one_run(ctx, run))
        failed = False
    finally:
        cancel_all(user)
        if failed or args.keep:
            progress(f"{'failed: ' if failed else ''}the daemons' logs and configurations "
                     f"are kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    report(ctx, runs, env, log_note)
    if args.json is not None:
        args.json.write_text(json.dumps({"jobs": args.jobs, "code": code_state(),
                                         "runs": runs}, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
