"""Shared machinery of the fault suite (``tests/test_fault_*.py``).

* **Figures.** Every fault test records one ``FaultRow`` (fault, jobs in flight, jobs
  lost, duplicate executions, wrong writes, recovery time, notes) with ``record_row``:
  the row is printed at once (past pytest's capture) and kept in ``ROWS`` and in the
  JSON file ``SUMMARY_FILE``; ``tests/test_fault_zz_summary.py`` runs last and prints the
  one summary table and asserts lost = duplicates = wrong writes = 0.
* **Knobs.** ``knob("SLURMCTLD_DOWN_S", 60)`` reads ``DISPATCH_FAULT_SLURMCTLD_DOWN_S``
  from the environment: the README lists them (how to run the suite longer).
* **What really happened.** ``RecordingRunner`` wraps a runner and records every command
  (argv, or a script with the number of ``sbatch`` calls in it); ``tests/fault_daemon.py``
  puts it into the real ``dispatchctl run`` process. ``wrong_writes`` judges every Slurm
  write the daemon made against what the database and sacct say the target was;
  ``executions`` counts, per dispatch job, the sacct records that really started.
* **Faults.** ``slurm_ctl`` stops/starts one cluster daemon, ``kill_ssh_sessions`` kills
  the per-connection children of our sshd, ``pg_ctl`` restarts PostgreSQL;
  ``restore_cluster`` puts everything back as ``scripts/slurm-up`` leaves it.

Definitions used by every row:

* *jobs in flight*: dispatch jobs written and not yet terminal when the fault began;
* *lost*: a job the client wrote (and was told was written) that never executed, or did
  not reach the phase the test expects for it;
* *duplicate executions*: sacct records (``-a -X -D``, as root) of one ``dj-`` name
  beyond the first that actually started (a gated duplicate that was cancelled before it
  ran is an *extra record*, reported in the notes, not a duplicate execution);
* *wrong writes*: Slurm writes (scancel, scontrol update/release/requeue/hold) aimed at a
  job that was not the dispatch job's own recorded object, plus any change to a job of
  another user or a foreign job the test watches;
* *recovery time*: seconds from the end of the fault (service back) until the daemon
  reported a healthy tick again; the notes add the time to full convergence.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text

from controller.runner.base import CommandResult, Runner
from tests.daemon_harness import (
    CLUSTER,
    DaemonProcess,
    SacctRecord,
    free_port,
    metric_key,
    ran,
    sacct_records,
    scrape,
    wait_for,
)

ROOT = Path(__file__).resolve().parent.parent
SLURM_CTL = ROOT / "scripts" / "slurm-ctl"
SLURM_UP = ROOT / "scripts" / "slurm-up"
ENV_FILE = Path("/var/lib/dispatch-slurm/env")
SUMMARY_FILE = Path(os.environ.get("DISPATCH_FAULT_SUMMARY",
                                   "/tmp/dispatch-fault-summary.json"))
OUTPUT_DIR = "/tmp/dispatch-fault-output"
TERMINAL = frozenset({"succeeded", "failed", "cancelled", "rejected"})


def knob(name: str, default: int) -> int:
    """``DISPATCH_FAULT_<name>`` from the environment, else ``default``."""
    raw = os.environ.get(f"DISPATCH_FAULT_{name}", "").strip()
    return int(raw) if raw else default


# ---------------------------------------------------------------- the figures


@dataclass
class FaultRow:
    fault: str
    jobs_in_flight: int
    lost: int
    duplicates: int
    wrong_writes: int
    recovery_s: float | None
    notes: str = ""


ROWS: list[FaultRow] = []
COLUMNS = ("fault", "jobs in flight", "jobs lost", "duplicate executions", "wrong writes",
           "recovery time (s)")


def _row_cells(row: FaultRow) -> list[str]:
    recovery = "-" if row.recovery_s is None else f"{row.recovery_s:.1f}"
    return [row.fault, str(row.jobs_in_flight), str(row.lost), str(row.duplicates),
            str(row.wrong_writes), recovery]


def boxed(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """The fault suite's table layout: the first column left-aligned, the others right."""
    cells = [list(header), *(list(r) for r in rows)]
    widths = [max(len(c[i]) for c in cells) for i in range(len(header))]
    rule = "+-" + "-+-".join("-" * w for w in widths) + "-+"

    def line(values: list[str]) -> str:
        parts = [v.ljust(w) if i == 0 else v.rjust(w)
                 for i, (v, w) in enumerate(zip(values, widths, strict=True))]
        return "| " + " | ".join(parts) + " |"

    return [rule, line(cells[0]), rule, *(line(c) for c in cells[1:]), rule]


def format_table(rows: Sequence[FaultRow], *, notes: bool = True) -> str:
    out = boxed(COLUMNS, [_row_cells(r) for r in rows])
    if notes:
        out += [f"  {r.fault}: {r.notes}" for r in rows if r.notes]
    return "\n".join(out)


def _load_file_rows() -> list[FaultRow]:
    try:
        data = json.loads(SUMMARY_FILE.read_text())
    except (OSError, ValueError):
        return []
    if not isinstance(data, dict) or data.get("session") != os.getpid():
        return []  # another pytest session wrote it
    return [FaultRow(**r) for r in data.get("rows", [])]


def record_row(row: FaultRow, capsys: Any = None) -> None:
    """Keep ``row`` for the summary (memory and ``SUMMARY_FILE``) and print it now."""
    ROWS[:] = [r for r in ROWS if r.fault != row.fault] + [row]
    rows = [r for r in _load_file_rows() if r.fault != row.fault] + [row]
    with contextlib.suppress(OSError):
        SUMMARY_FILE.write_text(json.dumps({"session": os.getpid(),
                                            "rows": [asdict(r) for r in rows]}, indent=1))
    emit("\n" + format_table([row]), capsys)


def emit(message: str, capsys: Any = None) -> None:
    """Print to the real terminal even while pytest captures output."""
    if capsys is not None:
        with capsys.disabled():
            print(message, flush=True)
    else:
        print(message, flush=True)


def session_rows() -> list[FaultRow]:
    by_fault = {r.fault: r for r in _load_file_rows()}
    by_fault.update({r.fault: r for r in ROWS})
    return list(by_fault.values())


# ---------------------------------------------------------------- recording commands

# scontrol subcommands that change a job (everything but show/ping/listpids...).
_SCONTROL_WRITES = frozenset({"update", "release", "requeue", "requeuehold", "hold", "uhold",
                              "suspend", "resume", "top", "notify", "signal"})
_JOB_ID_WORD = re.compile(r"(?:JobId=)?([0-9]+)")


def is_write(argv: Sequence[str]) -> bool:
    name = os.path.basename(argv[0]) if argv else ""
    if name == "scancel":
        return True
    return name == "scontrol" and len(argv) > 1 and argv[1].lower() in _SCONTROL_WRITES


def write_targets(argv: Sequence[str]) -> list[int]:
    """Every Slurm job id a write command names: bare ids, ``JobId=<id>`` and the comma
    lists of a joined write (``scontrol release 7,8,9``, ``scancel --user=u 7 8 9``)."""
    targets: list[int] = []
    for word in argv[1:]:
        parts = word.split(",")
        matches = [_JOB_ID_WORD.fullmatch(part) for part in parts]
        if all(m is not None for m in matches):
            targets.extend(int(m.group(1)) for m in matches if m is not None)
    return targets


def sbatch_count(script: str) -> int:
    """How many ``sbatch`` commands a Start (batch) script runs."""
    return sum(1 for line in script.splitlines() if line.startswith("sbatch "))


class RecordingRunner:
    """A ``Runner`` that forwards to ``inner`` and hands every command to ``sink``: a
    ``begin`` entry before it runs and an ``end`` entry (exit status or error) after."""

    def __init__(self, inner: Runner, sink: Callable[[dict[str, Any]], None]) -> None:
        self.inner = inner
        self.sink = sink
        self._seq = 0

    def _entry(self, **fields: Any) -> dict[str, Any]:
        self._seq += 1
        return {"t": time.time(), "seq": self._seq, **fields}

    async def run(self, argv: Sequence[str], *, stdin: str | None = None,
                  timeout: float | None = None,
                  env: Mapping[str, str] | None = None) -> CommandResult:
        begin = self._entry(phase="begin", kind="run", argv=list(argv), write=is_write(argv))
        self.sink(begin)
        try:
            result = await self.inner.run(argv, stdin=stdin, timeout=timeout, env=env)
        except BaseException as exc:
            self.sink(self._entry(phase="end", kind="run", argv=list(argv),
                                  write=begin["write"], error=f"{type(exc).__name__}: {exc}"))
            raise
        self.sink(self._entry(phase="end", kind="run", argv=list(argv), write=begin["write"],
                              rc=result.returncode, stderr=result.stderr[-300:]))
        return result

    async def run_script(self, script: str, *, timeout: float | None = None) -> CommandResult:
        count = sbatch_count(script)
        self.sink(self._entry(phase="begin", kind="script", sbatch=count, bytes=len(script)))
        try:
            result = await self.inner.run_script(script, timeout=timeout)
        except BaseException as exc:
            self.sink(self._entry(phase="end", kind="script", sbatch=count,
                                  error=f"{type(exc).__name__}: {exc}"))
            raise
        self.sink(self._entry(phase="end", kind="script", sbatch=count, rc=result.returncode))
        return result

    async def close(self) -> None:
        await self.inner.close()


class ListSink:
    """An in-memory sink for ``RecordingRunner`` (in-process tests)."""

    def __init__(self) -> None:
        self.entries: list[dict[str, Any]] = []

    def __call__(self, entry: dict[str, Any]) -> None:
        self.entries.append(entry)

    def writes(self) -> list[list[str]]:
        return [e["argv"] for e in self.entries if e["phase"] == "begin" and e.get("write")]

    def sbatches(self) -> int:
        return sum(e.get("sbatch", 0) for e in self.entries
                   if e["phase"] == "begin" and e["kind"] == "script")


def read_records(path: Path) -> list[dict[str, Any]]:
    """The entries a fault daemon recorded (JSON lines; a torn last line is skipped)."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


# ---------------------------------------------------------------- what really ran


def executions(job_ids: Iterable[str], *, since: str = "now-2hours",
               ) -> dict[str, list[SacctRecord]]:
    """Every sacct record (all users, every record of a reused id) per dispatch job id."""
    names = {"dj-" + j: j for j in job_ids}
    out: dict[str, list[SacctRecord]] = {j: [] for j in names.values()}
    for rec in sacct_records(set(names), since=since):
        out[names[rec.name]].append(rec)
    return out


def recorded_executions(job_ids: Iterable[str], final: Mapping[str, Mapping[str, Any]], *,
                        timeout: float = 90) -> dict[str, list[SacctRecord]]:
    """``executions`` once accounting has caught up: slurmdbd records a job seconds after
    it ended, so a job the daemon saw succeed may not be in sacct yet. Waits until every
    job of ``final`` whose phase is succeeded has a started record (it surely ran)."""
    ids = list(job_ids)
    ended = [j for j in ids if final.get(j, {}).get("phase") == "succeeded"]
    wait_for(lambda: all(any(ran(r) for r in recs)
                         for recs in executions(ended).values()),
             timeout=timeout, interval=1, what="accounting to record every execution")
    return executions(ids)


@dataclass
class Tally:
    lost: list[str] = field(default_factory=list)
    duplicates: dict[str, int] = field(default_factory=dict)
    extra_records: int = 0
    executed: int = 0
    records: int = 0
    other_users: int = 0

    @property
    def duplicate_executions(self) -> int:
        return sum(n - 1 for n in self.duplicates.values())


def tally(expected: Mapping[str, str | set[str]], final: Mapping[str, Mapping[str, Any]],
          records: Mapping[str, list[SacctRecord]], *, user: str = "dispatch") -> Tally:
    """Lost jobs and duplicate executions of ``expected`` (job id -> the phase(s) it must
    end in), from the daemon's final views and sacct."""
    t = Tally()
    for job_id, want in expected.items():
        recs = [r for r in records.get(job_id, []) if r.user == user]
        t.other_users += len(records.get(job_id, [])) - len(recs)
        started = [r for r in recs if ran(r)]
        t.records += len(recs)
        t.executed += len(started)
        t.extra_records += len(recs) - len(started)
        phase = final.get(job_id, {}).get("phase")
        wanted = {want} if isinstance(want, str) else want
        if not started or phase not in wanted:
            t.lost.append(job_id)
        if len(started) > 1:
            t.duplicates[job_id] = len(started)
    return t


def submissions_by_slurm_id(database_url: str) -> dict[int, tuple[str, int, str]]:
    """slurm job id -> (dispatch job id, submission, status) from the daemon's database."""
    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT job_id, submission, status, slurm_job_id "
                                     "FROM submissions WHERE slurm_job_id IS NOT NULL")).all()
    finally:
        engine.dispose()
    return {int(r[3]): (str(r[0]), int(r[1]), str(r[2])) for r in rows}


def submissions_per_job(database_url: str) -> dict[str, int]:
    """How many submissions (sbatch intents) the daemon made for each job."""
    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT job_id, count(*) FROM submissions "
                                     "GROUP BY job_id")).all()
    finally:
        engine.dispose()
    return {str(r[0]): int(r[1]) for r in rows}


def query(database_url: str, sql: str, params: Mapping[str, Any] | None = None,
          ) -> list[Any]:
    """Every row of one SQL query on the daemon's database (a connection of its own)."""
    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            return list(conn.execute(text(sql), dict(params or {})).all())
    finally:
        engine.dispose()


def intents_left(database_url: str) -> int:
    return int(query(database_url,
                     "SELECT count(*) FROM submissions WHERE status = 'intent'")[0][0] or 0)


def event_counts(database_url: str, kinds: Iterable[str]) -> dict[str, int]:
    rows = query(database_url, "SELECT kind, count(*) FROM events GROUP BY kind")
    found = {str(k): int(n) for k, n in rows}
    return {k: found.get(k, 0) for k in kinds}


def write_count(entries: Sequence[dict[str, Any]]) -> int:
    """How many Slurm writes (scancel, scontrol update/release/...) the daemon issued."""
    return sum(1 for e in entries if e.get("phase") == "begin" and e.get("write"))


def wrong_writes(entries: Sequence[dict[str, Any]], database_url: str, *,
                 protected: Iterable[int] = (), user: str = "dispatch",
                 ) -> tuple[int, list[str]]:
    """Judge every Slurm write the daemon made: (count of wrong ones, descriptions).

    A write is right only when its target is a Slurm job the daemon recorded as a
    submission of a dispatch job, sacct shows every record of that id as ``user``'s job
    named ``dj-<that job>``, a ``scancel --name`` names that same job, and a release or
    update does not target a submission the daemon itself judged a duplicate.
    ``protected`` ids (other users' or foreign jobs) must never be written at all.
    """
    writes = [e for e in entries if e.get("phase") == "begin" and e.get("write")]
    if not writes:
        return 0, []
    known = submissions_by_slurm_id(database_url)
    protected_ids = set(protected)
    by_id: dict[int, list[SacctRecord]] = {}
    names = {"dj-" + job for job, _, _ in known.values()}
    for rec in sacct_records(names) if names else []:
        by_id.setdefault(rec.job_id, []).append(rec)
    wrong: list[str] = []
    for entry in writes:
        argv = entry["argv"]
        what = " ".join(shlex.quote(a) for a in argv)
        targets = write_targets(argv)
        if not targets:
            wrong.append(f"no target: {what}")
        for target in targets:
            wrong.extend(_judge_target(target, argv, what, known, by_id, protected_ids, user))
    return len(wrong), wrong


def _judge_target(target: int, argv: Sequence[str], what: str,
                  known: Mapping[int, tuple[str, Any, str]],
                  by_id: Mapping[int, list[SacctRecord]], protected_ids: set[int],
                  user: str) -> list[str]:
    """What is wrong with one job a write named ([]: nothing)."""
    if target in protected_ids:
        return [f"protected job {target}: {what}"]
    owner = known.get(target)
    if owner is None:
        return [f"job {target} is no recorded submission: {what}"]
    job_id, _, status = owner
    if any(r.user != user or r.name != "dj-" + job_id for r in by_id.get(target, [])):
        return [f"job {target} is not only {user}'s dj-{job_id}: {what}"]
    named = [a.split("=", 1)[1] for a in argv if a.startswith("--name=")]
    if named and named != ["dj-" + job_id]:
        return [f"scancel names another job than {target}'s: {what}"]
    if os.path.basename(argv[0]) == "scontrol" and status == "duplicate":
        return [f"released/updated duplicate {target}: {what}"]
    return []


# ---------------------------------------------------------------- the cluster


def slurm_env() -> dict[str, str]:
    env: dict[str, str] = {}
    for line in ENV_FILE.read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep:
            env[key.strip()] = value.strip()
    return env


def slurm_ctl(action: str, daemon: str) -> None:
    subprocess.run([str(SLURM_CTL), action, daemon], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, timeout=120)


def slurm_up(*options: str) -> dict[str, str]:
    subprocess.run([str(SLURM_UP), *options], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, timeout=600)
    return slurm_env()


def cancel_user_jobs(user: str = "dispatch") -> None:
    subprocess.run(["scancel", "-u", user], check=False, capture_output=True, timeout=60)


def restore_cluster() -> None:
    """Every daemon running, default slurm-up options, the node resumed, no dispatch jobs."""
    for name in ("munged", "slurmdbd", "slurmctld", "slurmd", "sshd"):
        subprocess.run([str(SLURM_CTL), "start", name], check=False, capture_output=True,
                       timeout=120)
    slurm_up()
    cancel_user_jobs()


def squeue_state(job_id: int) -> tuple[str, str] | None:
    """(state, start time) of a job in slurmctld's memory, as root; None when gone."""
    out = subprocess.run(["squeue", "-h", "-j", str(job_id), "--states=all", "-o", "%T|%S"],
                         capture_output=True, text=True, check=False, timeout=60,
                         env={**os.environ, "TZ": "UTC"})
    line = out.stdout.strip()
    if out.returncode != 0 or not line:
        return None
    state, _, start = line.partition("|")
    return state, start


def in_squeue(job_id: int) -> bool:
    return squeue_state(job_id) is not None


def sshd_pid() -> int:
    return int((Path("/var/lib/dispatch-slurm/run/sshd.pid")).read_text().split()[0])


def sshd_session_pids() -> list[int]:
    """The per-connection processes of our sshd: its children, and any session of the test
    users (``sshd: dispatch@notty`` ...) left behind when the listener itself stopped."""
    pids: set[int] = set()
    with contextlib.suppress(OSError, ValueError, IndexError):
        out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(sshd_pid())],
                             capture_output=True, text=True, check=False)
        pids.update(int(p) for p in out.stdout.split())
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ")
            if cmdline.startswith(b"sshd: dispatch"):
                pids.add(int(proc.name))
    return sorted(pids)


def kill_ssh_sessions() -> int:
    """SIGKILL every connection's sshd process: every open SSH connection drops."""
    killed = 0
    for pid in sshd_session_pids():
        try:
            os.kill(pid, signal.SIGKILL)
            killed += 1
        except ProcessLookupError:
            pass
    return killed


# ---------------------------------------------------------------- PostgreSQL


def pg_version() -> str:
    out = subprocess.run(["pg_lsclusters", "-h"], capture_output=True, text=True, check=True)
    for line in out.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[1] == "main":
            return parts[0]
    raise AssertionError("no PostgreSQL cluster 'main'")


def pg_ready() -> bool:
    return subprocess.run(["pg_isready", "-q", "-h", "127.0.0.1", "-p", "5432"],
                          check=False).returncode == 0


def pg_ctl(action: str) -> None:
    """``pg_ctlcluster <ver> main <action>`` (start, stop -m fast, restart -m fast)."""
    argv = ["pg_ctlcluster", "--skip-systemctl-redirect", pg_version(), "main", action]
    if action in ("stop", "restart"):
        argv += ["-m", "fast"]
    subprocess.run(argv, check=True, capture_output=True, timeout=120)
    if action != "stop":
        wait_for(pg_ready, timeout=60, interval=0.2, what="PostgreSQL to accept connections")


def psql_admin(sql: str) -> str:
    out = subprocess.run(["runuser", "-u", "postgres", "--", "psql", "-v", "ON_ERROR_STOP=1",
                          "-qtA", "-c", sql], capture_output=True, text=True, check=True,
                         timeout=60)
    return out.stdout


@contextmanager
def pg_role_database(password: str) -> Iterator[str]:
    """A login role with ``password`` owning a fresh database; yields its URL."""
    suffix = os.urandom(4).hex()
    role = f"dispatch_fault_{suffix}"
    psql_admin(f"CREATE ROLE {role} LOGIN PASSWORD '{password}'")
    psql_admin(f"CREATE DATABASE {role} OWNER {role}")
    try:
        yield f"postgresql+psycopg://{role}:{password}@127.0.0.1:5432/{role}"
    finally:
        psql_admin(f"DROP DATABASE IF EXISTS {role} WITH (FORCE)")
        psql_admin(f"DROP ROLE IF EXISTS {role}")


# ---------------------------------------------------------------- the daemon


def config_text(*, database_url: str, port: int, transport: str = "local",
                env: Mapping[str, str] | None = None, tick_s: float = 1.0,
                unknown_grace_s: int = 600, command_timeout_s: int = 30,
                adopt_window_s: int | None = None, extra: str = "") -> str:
    """A daemon's configuration; ``extra`` holds more ``[daemon]`` lines. The adopt window
    is ``DISPATCH_FAULT_ADOPT_WINDOW_S`` [30] unless given (the product's default is
    180 s): shorter keeps CI fast, and safety does not depend on it (a late Slurm job of an
    abandoned intent is gated and cancelled as a duplicate, never released)."""
    if adopt_window_s is None:
        adopt_window_s = int(knob("ADOPT_WINDOW_S", 30))
    if transport == "ssh":
        assert env is not None
        transport_table = f"""kind = "ssh"
host = "127.0.0.1"
port = {env['SSH_PORT']}
user = "{env['SUBMIT_USER']}"
key_file = "{env['SSH_KEY']}"
known_hosts = "{env['SSH_KNOWN_HOSTS']}"
"""
    else:
        transport_table = 'kind = "local"\nrun_as = "dispatch"\n'
    return f"""
[cluster]
name = "{CLUSTER}"
[transport]
{transport_table}command_timeout_s = {command_timeout_s}
[output]
dir = "{OUTPUT_DIR}"
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
"""


@dataclass
class FaultDaemon(DaemonProcess):
    """``dispatchctl run`` as a real process, through ``tests/fault_daemon.py``: every
    command it runs is recorded in ``record``."""

    record: Path = Path("/dev/null")
    extra_env: dict[str, str] = field(default_factory=dict)

    def start(self) -> None:
        self.starts += 1
        log = self.log.with_suffix(f".{self.starts}.log")
        self.logs.append(log)
        env = dict(os.environ)
        env.pop("DISPATCH_DATABASE_URL", None)  # only what the test passes
        env["DISPATCH_FAULT_RECORD"] = str(self.record)
        env.update(self.extra_env)
        with log.open("wb") as handle:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.fault_daemon", "run", "--config",
                 str(self.config)], stdout=handle, stderr=subprocess.STDOUT, cwd=str(ROOT),
                env=env)

    def records(self) -> list[dict[str, Any]]:
        return read_records(self.record)

    def metric(self, key: str, default: float = float("nan")) -> float:
        try:
            return self.metrics().get(key, default)
        except OSError:
            return default


@contextmanager
def fault_daemon(tmp: Path, database_url: str, *, transport: str = "local",
                 env: Mapping[str, str] | None = None, extra_env: Mapping[str, str] | None = None,
                 config_url: str | None = None, **kw: Any) -> Iterator[FaultDaemon]:
    """Start a recorded daemon on ``database_url`` and wait for its metrics endpoint.

    ``config_url`` (default ``database_url``) goes into the config file; pass a different
    one and ``DISPATCH_DATABASE_URL`` in ``extra_env`` to test the override."""
    port = free_port()
    cfg = tmp / f"fault-config-{port}.toml"
    cfg.write_text(config_text(database_url=config_url or database_url, port=port,
                               transport=transport, env=env, **kw))
    d = FaultDaemon(cfg, port, tmp / f"fault-daemon-{port}", record=tmp / f"record-{port}.jsonl",
                    extra_env=dict(extra_env or {}))
    d.start()
    try:
        wait_for(lambda: "dispatch_ticks_total" in "".join(d.metrics()), timeout=60,
                 what="daemon metrics endpoint")
        yield d
    except BaseException:
        tail = "\n".join(d.log_text().splitlines()[-40:])
        print(f"--- last lines of the daemon's log ({d.log}):\n{tail}", file=sys.stderr)
        raise
    finally:
        if d.alive():
            try:
                d.terminate(timeout=60)
            except subprocess.TimeoutExpired:
                d.kill()


def wait_healthy_tick(d: FaultDaemon, after: float, *, timeout: float) -> float:
    """Seconds from ``after`` (time.time()) until the daemon completed a tick that reached
    Slurm, started after ``after``."""
    def done() -> bool:
        m = d.metrics()
        tick = m.get(metric_key("dispatch_last_successful_tick_timestamp_seconds"), 0.0)
        return tick > after and m.get(metric_key("dispatch_slurm_up")) == 1.0
    wait_for(done, timeout=timeout, interval=0.25, what="a healthy tick after the fault")
    return time.time() - after


def http_status(port: int, path: str) -> tuple[int, str]:
    import urllib.error
    import urllib.request
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def metrics_text(port: int) -> str:
    import urllib.request
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return resp.read().decode()


def views(client: Any, ids: Iterable[str]) -> dict[str, dict[str, Any]]:
    wanted = set(ids)
    return {v["id"]: v for v in client.list_jobs() if v["id"] in wanted}


def wait_terminal(client: Any, ids: Sequence[str], *, timeout: float,
                  ) -> dict[str, dict[str, Any]]:
    wait_for(lambda: all(v["phase"] in TERMINAL for v in views(client, ids).values())
             and len(views(client, ids)) == len(ids),
             timeout=timeout, interval=1, what=f"{len(ids)} jobs to finish")
    return views(client, ids)


def status_snapshot(database_url: str) -> dict[str, tuple[Any, ...]]:
    """Every job_status row, whole, for 'nothing changed' comparisons."""
    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT * FROM job_status ORDER BY job_id")).all()
    finally:
        engine.dispose()
    return {str(r[0]): tuple(r) for r in rows}


__all__ = [
    "CLUSTER", "ENV_FILE", "OUTPUT_DIR", "ROWS", "SUMMARY_FILE", "TERMINAL", "FaultDaemon",
    "FaultRow", "ListSink", "RecordingRunner", "Tally", "cancel_user_jobs", "config_text",
    "emit", "event_counts", "executions", "fault_daemon", "format_table", "http_status",
    "in_squeue", "intents_left", "is_write", "kill_ssh_sessions", "knob", "metric_key",
    "metrics_text", "pg_ctl", "pg_ready", "pg_role_database", "pg_version",
    "psql_admin", "query", "read_records", "record_row", "restore_cluster",
    "sbatch_count", "scrape", "session_rows", "slurm_ctl", "slurm_env", "slurm_up",
    "squeue_state", "sshd_session_pids", "status_snapshot", "submissions_by_slurm_id",
    "submissions_per_job",
    "tally", "views", "wait_for", "wait_healthy_tick", "wait_terminal", "write_count",
    "write_targets", "wrong_writes",
]
