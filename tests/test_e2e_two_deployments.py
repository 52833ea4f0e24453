"""Issue 18 on the REAL cluster: two deployments of the product share one Slurm user.

Two daemons (real processes, ``tests/fault_daemon.py``: every command they run is
recorded) on two databases -- deployment A on PostgreSQL, deployment B on SQLite -- both
submit as the same Slurm user (``dispatch``, the local transport's ``run_as``), to the
host's Slurm 22.05. Each database holds 20 jobs: quick successes, a failing job (exit 3),
a job submitted held and released with ``dispatchctl release``, a running job cancelled
with ``dispatchctl cancel``, and long jobs that run until the test lets them end (they
wait for a flag file, so the test waits on conditions, never on a clock). A's requeue
job is one of its long ones, with ``"requeue": true``.

Then B's daemon is killed (SIGKILL) while B's long jobs run, and B is started again on an
EMPTY database (a fresh SQLite file, migrated with ``dispatchctl migrate``; call it B2,
and the abandoned one B1) with four jobs of its own. While the new daemon ticks, root
requeues A's requeue job (``scontrol requeue``, then ``StartTime=now``: a requeued job is
eligible only 121 s later). Then the long jobs are let go.

Every job must end as its own database asked -- succeeded, failed (exit 3) or cancelled;
B1's jobs that were running when its daemon died must still complete (B1 asked them to
run, and no daemon may write them now) -- with exactly the executions expected in sacct
(one started record per job; two for the requeued one), and no daemon may write a job of
another database. Cross-database writes are counted three ways, per database of the
target job:

* *recorded*: write commands (scancel, scontrol update/release/requeue/hold) in a
  daemon's record that name a Slurm job of another database (B2's daemon writing a B1
  job counts: B2's database never had it);
* *slurmctld log*: the write RPCs the daemons' uid made on a job (``_slurm_rpc_kill_job``,
  ``_slurm_rpc_update_job``, requeues) beyond the writes its own database's daemon
  recorded for it -- only the lines written during the test, with slurmctld at ``debug``
  meanwhile (at ``info`` a successful requeue is not logged);
* *sacct*: jobs whose last record is ``CANCELLED by <the daemons' uid>`` though their own
  database never asked to cancel them.

A recorded write to a ``dj-`` job of no database of the test (a deployment outside the
test on the same user) is a cross write too (row "other"). A job *ran* when sacct gives it
a NodeList: a job cancelled pending has a Start (its end) in sacct 22.05.

The per-database table (jobs, lost, duplicate executions, cross-database writes) is
printed as the fault suite prints its rows. With the fix, the new daemon counts the live
``dj-`` jobs whose ULID its database never had in ``dispatch_unowned_jobs{cluster}``
(``UNOWNED``); the test samples that gauge of both live daemons once the cluster is quiet.

The test changes the shared cluster (its jobs, slurmctld's debug level): it holds the host
lane's lock (``tests/conftest.py``; taken here when pytest runs without ``--lane``) and
restores both afterwards, even on failure (the submit user's jobs are cancelled). On the
code of issue 18 its daemons cancel every live ``dj-`` job of the user, anyone's: never run
it beside another user of the cluster that does not hold the lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pwd
import re
import shutil
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from controller.client import Client
from controller.store.db import Store
from tests.conftest import HOST_LANE_LOCK
from tests.daemon_harness import DISPATCHCTL
from tests.fault_support import (
    TERMINAL,
    FaultDaemon,
    boxed,
    cancel_user_jobs,
    emit,
    fault_daemon,
    metric_key,
    views,
    wait_for,
    write_targets,
)
from tests.slurm_fixtures import SlurmEnv, cluster_up, wait_node_ready

pytestmark = [pytest.mark.slurm, pytest.mark.postgres, pytest.mark.slow]

# scripts/slurm-ctl: DS_LOG=$DS_BASE/log, SlurmctldLogFile=$DS_LOG/slurmctld.log
SLURMCTLD_LOG = Path("/var/lib/dispatch-slurm/log/slurmctld.log")
UNOWNED = "dispatch_unowned_jobs"  # the fix's gauge (issue 18): live dj- jobs of neighbours
# the sweep's log line: before the fix "cancelled a Slurm job that no record owns", now
# only for jobs of a finished or deleted row of the same database
SWEEP_LINE = "cancelled a Slurm job of a finished or deleted record"
WAIT_S = 90  # any one condition of the choreography
OK_TICKS = metric_key("dispatch_ticks_total", result="ok")
LEADER = metric_key("dispatch_leader")
LIVE_STATES = frozenset({"PENDING", "RUNNING", "SUSPENDED", "COMPLETING", "CONFIGURING",
                         "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SIGNALING",
                         "STAGE_OUT", "STOPPED"})
SACCT_PHASE = {"COMPLETED": "succeeded", "FAILED": "failed", "CANCELLED": "cancelled"}


# ---------------------------------------------------------------- the cluster


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest) -> Iterator[SlurmEnv]:
    """The host's cluster up, no job of its submit user, slurmctld logging at ``debug``;
    afterwards (pass or fail) the submit user's jobs cancelled and the level restored."""
    with contextlib.ExitStack() as stack:
        if request.config.getoption("--lane") is None:
            # with --lane, conftest's _host_lane_lock holds it already (flock is per open
            # file: taking it again here would wait for ever)
            handle = stack.enter_context(HOST_LANE_LOCK.open("a"))
            fcntl.flock(handle, fcntl.LOCK_EX)
            stack.callback(fcntl.flock, handle, fcntl.LOCK_UN)
        env = cluster_up()
        cancel_user_jobs(env.submit_user)
        level = _slurmctld_debug()
        stack.callback(_restore, env, level)
        subprocess.run(["scontrol", "setdebug", "debug"], check=True, capture_output=True,
                       timeout=30)
        yield env


def _slurmctld_debug() -> str:
    out = subprocess.run(["scontrol", "show", "config"], check=True, capture_output=True,
                         text=True, timeout=30).stdout
    for line in out.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() == "SlurmctldDebug":
            return value.strip()
    return "info"


def _restore(env: SlurmEnv, level: str) -> None:
    cancel_user_jobs(env.submit_user)
    subprocess.run(["scontrol", "setdebug", level], check=False, capture_output=True,
                   timeout=30)
    wait_for(lambda: not _live_rows(env.submit_user), timeout=60,
             what=f"{env.submit_user}'s jobs to leave the queue after the test")
    wait_node_ready()


def _squeue(user: str) -> list[tuple[int, str, str, str]]:
    """(id, name, state, reason) of every job of ``user`` slurmctld holds."""
    out = subprocess.run(["squeue", "-h", "-u", user, "--states=all", "-o", "%i|%j|%T|%r"],
                         capture_output=True, text=True, check=False, timeout=30).stdout
    rows = []
    for line in out.splitlines():
        parts = line.split("|")
        if len(parts) == 4 and parts[0].isdigit():
            rows.append((int(parts[0]), parts[1], parts[2], parts[3]))
    return rows


def _live_rows(user: str) -> list[tuple[int, str, str, str]]:
    return [r for r in _squeue(user) if r[2] in LIVE_STATES]


def _restart_count(slurm_id: int) -> int | None:
    out = subprocess.run(["squeue", "-h", "-j", str(slurm_id), "-O", "RestartCnt"],
                         capture_output=True, text=True, check=False, timeout=30)
    word = out.stdout.strip()
    return int(word) if out.returncode == 0 and word.isdigit() else None


@dataclass(frozen=True)
class Rec:
    """One sacct record (``-D``: every record of a requeued job too)."""

    slurm_id: int
    name: str
    state: str  # first word
    by_uid: int | None  # "CANCELLED by <uid>"
    nodes: str
    exit_code: str

    @property
    def started(self) -> bool:
        """It ran. Not ``Start``: sacct sets a job's start to its end when it is cancelled
        pending (tried on 22.05), so a job that never ran shows one; NodeList is set only
        by an allocation."""
        return self.nodes not in ("None assigned", "None", "")


# every state: without -s, sacct -S leaves out the jobs that were never eligible (a gated
# or held job cancelled before its release)
_ALL_STATES = "BF,CA,CD,DL,F,NF,OOM,PD,PR,R,RQ,RS,RV,S,TO"


def _sacct(since: str) -> list[Rec]:
    out = subprocess.run(
        ["sacct", "-a", "-X", "-D", "-P", "-n", "-S", since, "-E", "now", "-s", _ALL_STATES,
         "-o", "JobIDRaw,JobName%64,State,NodeList%200,ExitCode"],
        check=True, capture_output=True, text=True, timeout=60,
        env={**os.environ, "TZ": "UTC"}).stdout
    recs = []
    for line in out.splitlines():
        parts = line.split("|")
        if len(parts) < 5 or not parts[0].isdigit():
            continue
        words = parts[2].split()
        by = int(words[2]) if len(words) == 3 and words[1] == "by" and words[2].isdigit() \
            else None
        recs.append(Rec(int(parts[0]), parts[1], words[0] if words else "", by, parts[3],
                        parts[4]))
    return recs


# slurmctld's lines for a write RPC: (pattern, kind); group 1 the job id, group 2 the uid
_LOG_WRITES = (
    (re.compile(r"_slurm_rpc_kill_job: REQUEST_KILL_JOB JobId=(\d+)\S* uid (\d+)"), "cancel"),
    (re.compile(r"_slurm_rpc_update_job: complete JobId=(\d+)\S* uid=(\d+)"), "update"),
    (re.compile(r"_slurm_rpc_update_job: JobId=(\d+)\S* uid=(\d+): "), "update refused"),
    # no uid in these two (the second only at debug): attributed by elimination
    (re.compile(r"_slurm_rpc_requeue: Requeue of JobId=(\d+)\S* returned an error()"),
     "requeue refused"),
    (re.compile(r"_job_requeue_op: JobId=(\d+)()"), "requeue"),
)


@dataclass(frozen=True)
class LogWrite:
    slurm_id: int
    uid: int | None
    kind: str
    line: str


def _log_writes(offset: int) -> list[LogWrite]:
    """The write RPCs slurmctld logged since byte ``offset`` of its log."""
    with SLURMCTLD_LOG.open("rb") as handle:
        if handle.seek(0, os.SEEK_END) < offset:
            offset = 0  # the log was replaced meanwhile: all of it is ours
        handle.seek(offset)
        text = handle.read().decode(errors="replace")
    found = []
    for line in text.splitlines():
        for pattern, kind in _LOG_WRITES:
            m = pattern.search(line)
            if m:
                found.append(LogWrite(int(m.group(1)), int(m.group(2)) if m.group(2) else None,
                                      kind, line))
                break
    return found


# ---------------------------------------------------------------- the deployments


@dataclass
class Database:
    """One database of a deployment and what its client asked of its jobs."""

    name: str  # "A", "B1", "B2"
    backend: str
    url: str
    expected: dict[str, str] = field(default_factory=dict)  # job id -> ending asked
    kind: dict[str, str] = field(default_factory=dict)  # job id -> ok|fail|held|cancel|long
    daemon: FaultDaemon | None = None
    final: dict[str, dict[str, Any]] = field(default_factory=dict)
    _client: Client | None = None

    @property
    def client(self) -> Client:
        if self._client is None:
            self._client = Client(self.url)
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.store.dispose()
            self._client = None

    def of(self, kind: str) -> list[str]:
        return [j for j, k in self.kind.items() if k == kind]

    def views(self) -> dict[str, dict[str, Any]]:
        return views(self.client, self.kind)

    def submit(self, kind: str, command: list[str], **kw: Any) -> str:
        doc: dict[str, Any] = {"command": command, "workdir": "/tmp",
                               "labels": {"e2e": "two-deployments", "db": self.name},
                               "resources": {"time_limit_s": 300}}
        held = kind == "held"
        doc.update(kw)
        job_id = self.client.submit(doc, held=held)
        self.kind[job_id] = kind
        self.expected[job_id] = {"fail": "failed", "cancel": "cancelled"}.get(kind,
                                                                             "succeeded")
        return job_id

    def ctl(self, *args: str) -> str:
        """``dispatchctl ARGS`` on this database (as an operator would run it)."""
        out = subprocess.run([DISPATCHCTL, *args], check=False, capture_output=True,
                             text=True, timeout=60,
                             env={**os.environ, "DISPATCH_DATABASE_URL": self.url})
        assert out.returncode == 0, f"dispatchctl {' '.join(args)} ({self.name}): {out.stderr}"
        return out.stdout


def _long(flag: Path) -> list[str]:
    """Runs until ``flag`` exists (at most 120 s: exit 4 then, a failure the test sees)."""
    return ["/bin/sh", "-c", f"i=0; while [ ! -e {flag} ]; do i=$((i+1)); "
                             f"[ $i -le 600 ] || exit 4; sleep 0.2; done"]


def _submit_twenty(db: Database, flag: Path, quick: int, *, requeue: bool) -> None:
    """``quick`` successes, one failure, one cancelled, one held, the rest long: 20.
    Long ones go last (the node has 8 CPUs: quick ones first)."""
    for i in range(quick):
        db.submit("ok", ["/bin/sh", "-c", f"echo {db.name} {i}; sleep 1"])
    db.submit("fail", ["/bin/sh", "-c", "echo failing >&2; exit 3"])
    db.submit("cancel", ["sleep", "300"])
    db.submit("held", ["/bin/sh", "-c", "sleep 1"])
    longs = 20 - quick - 3
    for i in range(longs):
        if requeue and i == longs - 1:
            db.submit("requeue", _long(flag), requeue=True)
        else:
            db.submit("long", _long(flag))
    assert len(db.kind) == 20


def _explain(dbs: Sequence[Database], user: str) -> str:
    """What the cluster and the databases know now, for a failure message."""
    lines = ["--- squeue (" + user + "): " + ", ".join(
        f"{i} {n} {s}{' (' + r + ')' if r and r != 'None' else ''}"
        for i, n, s, r in _squeue(user))]
    for db in dbs:
        try:
            vs = db.views()
        except Exception as exc:  # explaining a failure, not testing
            lines.append(f"--- {db.name}: {exc}")
            continue
        phases = Counter(v["phase"] for v in vs.values())
        open_ = [f"{j[-6:]}:{db.kind[j]}:{v['phase']}/{v['object_state']}/{v['slurm_job_id']}"
                 for j, v in vs.items() if v["phase"] not in TERMINAL]
        sweeps = db.daemon.log_text().count(SWEEP_LINE) if db.daemon else 0
        lines.append(f"--- {db.name} ({db.backend}): {dict(phases)}; open: {open_}; "
                     f"daemon log '{SWEEP_LINE}' x{sweeps}")
    return "\n".join(lines)


def _wait(predicate: Callable[[], bool], *, what: str, dbs: Sequence[Database], user: str,
          timeout: float = WAIT_S) -> None:
    try:
        wait_for(predicate, timeout=timeout, interval=0.3, what=what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{_explain(dbs, user)}") from None


def _phase(db: Database, job_id: str) -> str:
    return str(db.views()[job_id]["phase"])


def _leads(db: Database) -> Callable[[], bool]:
    d = db.daemon
    assert d is not None
    return lambda: d.metric(LEADER) == 1.0


def _in_phase(db: Database, job: str, phases: frozenset[str]) -> Callable[[], bool]:
    return lambda: _phase(db, job) in phases


def _held_in_slurm(db: Database, job: str) -> Callable[[], bool]:
    """The held job is held (gated) in Slurm, or over already."""
    def check() -> bool:
        view = db.views()[job]
        return view["object_state"] in ("gated", "held") or view["phase"] in TERMINAL
    return check


def _all_ended(db: Database) -> Callable[[], bool]:
    return lambda: all(v["phase"] in TERMINAL for v in db.views().values())


def _more_ok_ticks(d: FaultDaemon, n: int) -> Callable[[], bool]:
    base = d.metric(OK_TICKS, 0)
    return lambda: d.metric(OK_TICKS, 0) >= base + n


# ---------------------------------------------------------------- the figures


@dataclass
class Row:
    """One database's figures; None: not judged for it (printed "-")."""

    database: str
    jobs: int | None
    lost: int | None
    duplicates: int | None
    recorded: int
    logged: int | None
    cancelled_by_neighbour: int | None


def _cell(value: int | None) -> str:
    return "-" if value is None else str(value)


def _sum(values: Sequence[int | None]) -> int:
    return sum(v for v in values if v is not None)


COLUMNS = ("database", "jobs", "jobs lost", "duplicate executions",
           "cross writes (recorded)", "cross writes (slurmctld log)",
           "cancelled by a neighbour (sacct)")


def format_rows(rows: Sequence[Row]) -> str:
    """The fault suite's table layout (``tests.fault_support.boxed``), these columns."""
    return "\n".join(boxed(COLUMNS, [[r.database, *map(_cell, (
        r.jobs, r.lost, r.duplicates, r.recorded, r.logged, r.cancelled_by_neighbour))]
        for r in rows]))


@dataclass
class Judged:
    rows: list[Row]
    notes: list[str]


def judge(dbs: Sequence[Database], recs: Sequence[Rec], log: Sequence[LogWrite], *,
          daemon_uid: int, requeued: set[int], b1_killed_open: set[str],
          writers: Mapping[str, FaultDaemon]) -> Judged:
    """Lost jobs, duplicate executions and cross-database writes, per database."""
    owner_of_job = {j: db.name for db in dbs for j in db.kind}
    by_name: dict[str, list[Rec]] = {}
    owner_of_id: dict[int, str] = {}
    for r in recs:
        job = r.name.removeprefix("dj-")
        if job in owner_of_job:
            by_name.setdefault(job, []).append(r)
            owner_of_id[r.slurm_id] = owner_of_job[job]
    notes: list[str] = []
    # every write a daemon recorded: (daemon's database, target id, argv)
    recorded: list[tuple[str, int, str]] = []
    for name, d in writers.items():
        for e in d.records():
            if e.get("phase") == "begin" and e.get("write"):
                recorded.extend((name, t, " ".join(e["argv"])) for t in write_targets(e["argv"]))
    own_writes = Counter(t for writer, t, _ in recorded if owner_of_id.get(t) == writer)
    cross_recorded = Counter(owner_of_id.get(t, "?") for writer, t, _ in recorded
                             if owner_of_id.get(t) != writer)
    examples = [f"{writer} daemon: {argv} -> {owner_of_id.get(t, '?')}'s job {t}"
                for writer, t, argv in recorded if owner_of_id.get(t) != writer][:4]
    # slurmctld: the daemons' writes per job (a requeue has no uid: root's own are known)
    admin_requeues = Counter(requeued)
    per_job: Counter[int] = Counter()
    for w in log:
        if w.uid == daemon_uid:
            per_job[w.slurm_id] += 1
        elif w.uid is None and w.kind.startswith("requeue"):
            if admin_requeues[w.slurm_id] > 0:
                admin_requeues[w.slurm_id] -= 1
            else:
                per_job[w.slurm_id] += 1
    cross_logged: Counter[str] = Counter()
    for slurm_id, n in per_job.items():
        extra = n - own_writes.get(slurm_id, 0)
        if extra > 0:
            cross_logged[owner_of_id.get(slurm_id, "?")] += extra
    rows = []
    for db in dbs:
        lost: list[str] = []
        dup = 0
        neighbour_cancels = 0
        for job, want in db.expected.items():
            mine = by_name.get(job, [])
            started = [r for r in mine if r.started]
            last = mine[-1] if mine else None
            if db.name == "B1" and job in b1_killed_open:
                # its daemon is gone: Slurm's ending is the job's ending
                got = SACCT_PHASE.get(last.state, last.state.lower()) if last else "never ran"
            else:
                got = str(db.final.get(job, {}).get("phase"))
            if got == "failed" and db.kind[job] == "fail" and last is not None \
                    and last.exit_code != "3:0":
                got = f"failed ({last.exit_code})"
            runs = 2 if last is not None and last.slurm_id in requeued else 1
            if got != want or not started:
                lost.append(f"{job[-6:]}:{db.kind[job]} {want}->{got}"
                            f"{'' if started else ' (never started)'}")
            dup += max(0, len(started) - runs)
            if last is not None and last.state == "CANCELLED" and want != "cancelled" \
                    and last.by_uid == daemon_uid:
                neighbour_cancels += 1
        rows.append(Row(f"{db.name} ({db.backend})", len(db.expected), len(lost), dup,
                        cross_recorded.get(db.name, 0), cross_logged.get(db.name, 0),
                        neighbour_cancels))
        if lost:
            notes.append(f"{db.name}: not as asked: {', '.join(lost[:8])}"
                         f"{' ...' if len(lost) > 8 else ''}")
    # dj- jobs of no database of the test: another deployment's on the same user. Every
    # recorded write to one is a cross write; their own daemon's writes are in the log
    # too, so the log does not tell (not judged)
    strays = {t for writer, t, _ in recorded if t not in owner_of_id}
    if strays:
        rows.append(Row("other (no database of the test)", len(strays), None, None,
                        cross_recorded.get("?", 0), None, None))
        listed = ", ".join(map(str, sorted(strays)[:12])) + (" ..." if len(strays) > 12 else "")
        notes.append(f"written by the test's daemons, of no database of the test: Slurm jobs "
                     f"{listed}")
    notes += [f"e.g. {x}" for x in examples]
    notes.append("daemon log '" + SWEEP_LINE + "': " + ", ".join(
        f"{name} x{d.log_text().count(SWEEP_LINE)}" for name, d in writers.items()))
    return Judged(rows, notes)


# ---------------------------------------------------------------- the test


def test_two_deployments_on_one_slurm_user_never_write_each_others_jobs(
        cluster: SlurmEnv, tmp_path: Path, pg_url: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    began = time.monotonic()
    since = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(time.time() - 5))
    user = cluster.submit_user
    daemon_uid = pwd.getpwnam(user).pw_uid
    flag_dir = Path(tempfile.mkdtemp(prefix="dispatch-twodep-", dir="/tmp"))
    flag_dir.chmod(0o755)
    flag = flag_dir / "go"
    a = Database("A", "postgresql", pg_url)
    b1 = Database("B1", "sqlite", f"sqlite:///{tmp_path / 'b1.db'}")
    b2 = Database("B2", "sqlite, fresh", f"sqlite:///{tmp_path / 'b2.db'}")
    dbs = (a, b1, b2)
    for db in (a, b1):
        store = Store(db.url)
        store.migrate()
        store.dispose()
    # long ones: A 3 (one its requeue job), B 2; with the two cancelled sleeps that is 7
    # of the node's 8 CPUs, one left for the others
    _submit_twenty(a, flag, 14, requeue=True)
    _submit_twenty(b1, flag, 15, requeue=False)
    log_offset = SLURMCTLD_LOG.stat().st_size
    requeued: set[int] = set()
    b1_open: set[str] = set()
    unowned: dict[str, tuple[float | None, int, int]] = {}
    try:
        with contextlib.ExitStack() as stack:
            a.daemon = stack.enter_context(fault_daemon(tmp_path, a.url))
            b1.daemon = stack.enter_context(fault_daemon(tmp_path, b1.url))
            for db in (a, b1):
                _wait(_leads(db), what=f"{db.name}'s daemon to lead", dbs=dbs, user=user)

            # the cancel: each deployment cancels its running sleep (dispatchctl cancel)
            for db in (a, b1):
                (job,) = db.of("cancel")
                _wait(_in_phase(db, job, TERMINAL | {"running"}),
                      what=f"{db.name}'s job {job} to run (to cancel it)", dbs=dbs, user=user)
                if _phase(db, job) == "running":
                    db.ctl("cancel", job)
            # the held job: released (dispatchctl release) once it is held in Slurm
            for db in (a, b1):
                (job,) = db.of("held")
                _wait(_held_in_slurm(db, job),
                      what=f"{db.name}'s held job {job} to be held in Slurm", dbs=dbs,
                      user=user)
                if _phase(db, job) not in TERMINAL:
                    db.ctl("release", job)

            # B1 settled before its daemon dies: every job ended or running (nothing
            # gated or pending that only B1's daemon could release or submit)
            def b1_settled() -> bool:
                vs = b1.views()
                return all(v["phase"] in TERMINAL or (
                    v["phase"] == "running" and v["object_state"] == "running")
                    for v in vs.values())

            _wait(b1_settled, what="B1's jobs to end or run (before its daemon dies)",
                  dbs=dbs, user=user)
            b1.daemon.kill()
            b1.final = b1.views()
            b1_open = {j for j, v in b1.final.items() if v["phase"] not in TERMINAL}

            # B again, on an EMPTY database (dispatchctl migrate), with jobs of its own
            b2.ctl("migrate")
            for i in range(4):
                b2.submit("ok", ["/bin/sh", "-c", f"echo B2 {i}; sleep 1"])
            b2.daemon = stack.enter_context(fault_daemon(tmp_path, b2.url))
            d2 = b2.daemon
            _wait(_leads(b2), what="B2's daemon to lead", dbs=dbs, user=user)
            _wait(_all_ended(b2), what="B2's jobs to end", dbs=dbs, user=user)
            _wait(_more_ok_ticks(d2, 3), what="three more ticks of B2's daemon", dbs=dbs,
                  user=user)

            # the cluster is quiet (the long jobs wait for the flag): the fix's gauge of
            # each live daemon counts the live dj- jobs its database never had
            for db in (a, b2):
                unowned[db.name] = _unowned_sample(db, dbs, user)

            # root requeues A's requeue job while B2's daemon runs
            (rq,) = a.of("requeue")
            view = a.views()[rq]
            if view["phase"] == "running" and view["slurm_job_id"]:
                sid = int(view["slurm_job_id"])
                subprocess.run(["scontrol", "requeue", str(sid)], check=True, timeout=30,
                               capture_output=True)
                requeued.add(sid)
                _wait(lambda: _restart_count(sid) == 1 and any(
                    i == sid and s == "PENDING" for i, _, s, _ in _squeue(user)),
                    what=f"Slurm to requeue A's job {sid}", dbs=dbs, user=user)
                _wait(_more_ok_ticks(d2, 2), what="B2's daemon to tick over the requeued job",
                      dbs=dbs, user=user)
                subprocess.run(["scontrol", "update", f"JobId={sid}", "StartTime=now"],
                               check=True, timeout=30, capture_output=True)
                _wait(lambda: any(i == sid and s == "RUNNING" for i, _, s, _ in _squeue(user))
                      or _phase(a, rq) in TERMINAL,
                      what=f"A's requeued job {sid} to run again", dbs=dbs, user=user)
                _wait(_in_phase(a, rq, TERMINAL | {"running"}),
                      what="A's daemon to follow its requeued job", dbs=dbs, user=user)
                _wait(_more_ok_ticks(d2, 2), what="B2's daemon to tick over the second run",
                      dbs=dbs, user=user)
            else:
                emit(f"\nA's requeue job is {view['phase']}/{view['object_state']} before "
                     "the requeue: not requeued", capsys)

            # the long jobs end; everything finishes as each database asked
            flag.touch()
            for db in (a, b2):
                _wait(_all_ended(db), what=f"{db.name}'s jobs to end", dbs=dbs, user=user)
            b1_names = {"dj-" + j for j in b1.kind}
            _wait(lambda: not [r for r in _live_rows(user) if r[1] in b1_names],
                  what="B1's jobs to leave Slurm's live states", dbs=dbs, user=user)
            a.final, b2.final = a.views(), b2.views()
            _wait(_ends_recorded(dbs, since, b1_open), what="accounting to record every ending",
                  dbs=dbs, user=user)
            # one more tick of both daemons: a late write would be in their records now
            _wait(_more_ok_ticks(a.daemon, 1), what="one more tick of A's daemon", dbs=dbs,
                  user=user)
            _wait(_more_ok_ticks(d2, 1), what="one more tick of B2's daemon", dbs=dbs,
                  user=user)
    finally:
        shutil.rmtree(flag_dir, ignore_errors=True)
        for db in dbs:
            db.close()
    took = time.monotonic() - began

    assert a.daemon is not None and b1.daemon is not None and b2.daemon is not None
    judged = judge(dbs, _sacct(since), _log_writes(log_offset), daemon_uid=daemon_uid,
                   requeued=requeued, b1_killed_open=b1_open,
                   writers={"A": a.daemon, "B1": b1.daemon, "B2": b2.daemon})
    rows = judged.rows
    total = Row("all", sum(len(db.expected) for db in dbs), _sum([r.lost for r in rows]),
                _sum([r.duplicates for r in rows]), _sum([r.recorded for r in rows]),
                _sum([r.logged for r in rows]),
                _sum([r.cancelled_by_neighbour for r in rows]))
    gauge = "; ".join(f"{name}: {UNOWNED}={'absent' if g is None else f'{g:g}'} "
                      f"(live neighbour jobs {live}, ended ones still in squeue {ended})"
                      for name, (g, live, ended) in unowned.items())
    report = (f"two deployments, one Slurm user ({user}): A on PostgreSQL; B on SQLite, "
              f"SIGKILLed with {len(b1_open)} jobs running and restarted on an empty "
              f"database (B2); A's job {sorted(requeued) or '-'} requeued by root; "
              f"{took:.0f}s\n" + format_rows([*judged.rows, total]) + "\n"
              + "\n".join(f"  {n}" for n in [*judged.notes, gauge]))
    emit("\n" + report, capsys)
    assert (total.lost, total.duplicates, total.recorded, total.logged,
            total.cancelled_by_neighbour) == (0, 0, 0, 0, 0), report
    assert requeued, "A's requeue job was not running when root was to requeue it"
    for name, (g, live, ended) in unowned.items():
        assert g is not None and live <= g <= live + ended, (name, gauge)


def _unowned_sample(db: Database, dbs: Sequence[Database],
                    user: str) -> tuple[float | None, int, int]:
    """(the daemon's UNOWNED gauge, live dj- jobs of the other databases, ended ones of
    theirs still in squeue), once the gauge is within those bounds or after 15 s; the
    gauge is None when the daemon does not export it."""
    assert db.daemon is not None
    d = db.daemon
    key = metric_key(UNOWNED)
    others = {"dj-" + j for o in dbs if o is not db for j in o.kind}
    deadline = time.monotonic() + 15
    while True:
        rows = [r for r in _squeue(user) if r[1] in others]
        live = sum(1 for r in rows if r[2] in LIVE_STATES)
        ended = len(rows) - live
        gauge: float | None = d.metrics().get(key)
        if gauge is None or live <= gauge <= live + ended or time.monotonic() > deadline:
            return gauge, live, ended
        time.sleep(0.5)


def _ends_recorded(dbs: Sequence[Database], since: str,
                   b1_open: set[str]) -> Callable[[], bool]:
    """slurmdbd records an ending seconds after it: every job that a database saw
    succeed (or that B1 left running) has a started record, and no job's last record is
    live any more."""
    def done() -> bool:
        recs = _sacct(since)
        last: dict[str, Rec] = {}
        started: set[str] = set()
        for r in recs:
            job = r.name.removeprefix("dj-")
            last[job] = r
            if r.started:
                started.add(job)
        for db in dbs:
            for job in db.kind:
                ran = db.final.get(job, {}).get("phase") == "succeeded" or job in b1_open
                if ran and job not in started:
                    return False
                if job in last and last[job].state in LIVE_STATES:
                    return False
        return True
    return done
