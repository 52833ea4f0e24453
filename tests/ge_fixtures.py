"""The real Grid Engine of the ``gridengine`` lane (``scripts/gridengine-up``): bring it
up, run commands as root or as its users, read its accounting file as root (the witness
of what really ran), wait on conditions, and the cell lock that tests which change the
cell (job numbers, hosts, daemons) hold while they do, restoring it afterwards."""

from __future__ import annotations

import asyncio
import fcntl
import os
import subprocess
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from controller.gridengine.accounting import AccountingRecord, parse_record
from controller.gridengine.adapter import GridEngineAdapter
from controller.model.ids import JobID, new_job_id
from controller.model.obs import ObjectObs, StartRequest
from controller.model.spec import parse_job_document
from controller.runner.local import LocalRunner
from controller.slurm.script import StartSettings

ROOT = Path(__file__).resolve().parent.parent
ENV_FILE = Path("/var/lib/dispatch-gridengine/env")
CELL_LOCK = Path("/tmp/dispatch-gridengine-cell.lock")
USER = "dispatch"
OTHER = "dispatch-other"
T = TypeVar("T")


@dataclass(frozen=True)
class GridEngine:
    host: str
    queue: str
    accounting_file: str
    root: str


def ge_up(*options: str) -> GridEngine:
    """Start (or re-configure to ``options``; none: the defaults) the cell."""
    subprocess.run([str(ROOT / "scripts/gridengine-up"), *options], check=True,
                   stdout=subprocess.DEVNULL)
    env = dict(line.split("=", 1) for line in ENV_FILE.read_text().splitlines()
               if "=" in line)
    return GridEngine(env["HOST"], env["QUEUE"], env["ACCOUNTING_FILE"], env["SGE_ROOT"])


def as_root(*argv: str, check: bool = True, stdin: str | None = None
            ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), check=check, capture_output=True, text=True,
                          input=stdin, env={**os.environ, "TZ": "UTC"})


def as_user(user: str, *argv: str, check: bool = True, stdin: str | None = None
            ) -> subprocess.CompletedProcess[str]:
    return as_root("runuser", "-u", user, "--", *argv, check=check, stdin=stdin)


def accounting(ge: GridEngine, names: set[str]) -> list[AccountingRecord]:
    """Every record (any user) whose job name is one of ``names``."""
    records = []
    for line in Path(ge.accounting_file).read_text(errors="replace").splitlines():
        parts = line.split(":", 6)
        if len(parts) > 5 and parts[4] in names:
            records.append(parse_record(line))
    return records


def ran(record: AccountingRecord) -> bool:
    """The record of an execution that started (a never-started Eqw has start 0)."""
    return record.start > 0 and record.failed not in (26, 27, 28, 1, 2, 3, 4, 5, 6, 7, 8)


def live_numbers(user: str = USER) -> set[int]:
    out = as_root("qstat", "-u", user).stdout.splitlines()[2:]
    return {int(line.split()[0]) for line in out if line.strip()}


def delete_all(user: str = USER) -> None:
    """Delete every job of ``user`` (and wait until qstat lists none)."""
    as_root("qdel", "-f", "-u", user, check=False)
    wait_until(lambda: not live_numbers(user), timeout=60, what=f"no job of {user}")


def wait_until(predicate: Callable[[], bool], *, timeout: float, what: str,
               interval: float = 0.2) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


async def wait_obs(read: Callable[[], Awaitable[T]], done: Callable[[T], bool], *,
                   timeout: float, what: str) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = await read()
        if done(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}: {value}")
        await asyncio.sleep(0.25)


@contextmanager
def cell_lock() -> Iterator[None]:
    """Held by a test that changes the cell; released even when it fails."""
    with CELL_LOCK.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def output_dir() -> str:
    """A fresh output.dir, readable by root (the test) and writable by ``dispatch``."""
    path = f"/tmp/dispatch-ge-test/{uuid.uuid4().hex[:10]}"
    as_root("install", "-d", "-m", "1777", "/tmp/dispatch-ge-test")
    as_user(USER, "mkdir", "-p", path)
    return path


def adapter(ge: GridEngine, out_dir: str, *, user: str = USER,
            stop_confirm_s: float = 30.0) -> GridEngineAdapter:
    return GridEngineAdapter(LocalRunner(run_as=user), cluster="ge",
                             settings=StartSettings(output_dir=out_dir), user=user,
                             accounting_file=ge.accounting_file,
                             stop_confirm_s=stop_confirm_s)


def request(command: list[str], *, job_id: JobID | None = None, submission: int = 1,
            attempt: int = 0, gate: bool = True, exclude: tuple[str, ...] = (),
            **doc: object) -> StartRequest:
    return StartRequest(job_id=job_id or new_job_id(), generation=1, submission=submission,
                        attempt=attempt,
                        spec=parse_job_document({"command": command, "workdir": "/tmp",
                                                 **doc}),
                        gate=gate, extra_exclude=exclude)


async def only(a: GridEngineAdapter, job_id: str) -> ObjectObs | None:
    found = (await a.find_many([job_id]))[job_id]
    assert len(found) <= 1, found
    return found[0] if found else None


# ---------------------------------------------------------------- daemons and faults

EXECD_SPOOL = Path("/var/spool/gridengine/execd")
QMASTER_SPOOL = Path("/var/spool/gridengine/qmaster")


def daemon_pid(name: str) -> int | None:
    """The pid of the running ``sge_qmaster`` or ``sge_execd`` (from its pid file)."""
    files = ([QMASTER_SPOOL / "qmaster.pid"] if name == "sge_qmaster"
             else list(EXECD_SPOOL.glob("*/execd.pid")))
    for path in files:
        try:
            pid = int(path.read_text().split()[0])
            if Path(f"/proc/{pid}/comm").read_text().strip() == name:
                return pid
        except (OSError, ValueError, IndexError):
            continue
    return None


def job_pids(number: int) -> list[int]:
    """The shepherd of job ``number`` and every process that inherited its
    DISPATCH_ATTEMPT (the job's processes), by pid."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ")
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmdline.startswith(f"sge_shepherd-{number} ".encode()) or any(
                e.startswith(b"DISPATCH_ATTEMPT=s") and e.split(b"-")[1] == str(number).encode()
                for e in environ):
            pids.append(int(proc.name))
    return pids


def queue_state(host: str) -> str:
    out = as_root("qstat", "-f", "-xml").stdout
    from controller.gridengine.qstat import parse_list
    for queue in parse_list(out).queues:
        if queue.host == host:
            return queue.state
    return ""
