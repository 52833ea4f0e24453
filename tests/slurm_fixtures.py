"""Fixtures and helpers for the adapter's tests against the REAL local Slurm cluster.

Import with ``from tests.slurm_fixtures import *`` (they are plain pytest fixtures).

* ``cluster_up(...)`` makes the cluster that ``scripts/slurm-up`` manages run with
  exactly the given options (MinJobAge, MaxJobId): it reads the running slurmctld's
  configuration and calls ``slurm-up`` only when a daemon is down or an option differs,
  so a clean machine, a cluster someone else reconfigured and a ready one all work;
* every adapter command runs as the ordinary user ``dispatch`` -- locally through
  ``LocalRunner(run_as="dispatch")``, or over SSH as ``dispatch@127.0.0.1:$SSH_PORT``
  with host-key checking. Root is used only for what an administrator would do
  (``as_root``: node DOWN, ``scontrol requeue``, jobs of ``dispatch-other``);
* ``jobs`` hands out fresh dispatch job ids and cancels whatever is left of them after
  the test; ``wait_obs`` polls an observation until a predicate holds.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from controller.errors import ErrNotFound
from controller.model.ids import JobID, new_job_id
from controller.model.obs import ObjectObs, ObjectRef, StartRequest
from controller.model.spec import parse_job_document
from controller.runner import LocalRunner, Runner, SSHRunner
from controller.slurm.adapter import SlurmAdapter
from controller.slurm.naming import discovery_name
from controller.slurm.script import StartSettings

__all__ = [
    "OUTPUT_DIR", "SLURM_CTL", "SlurmEnv", "Tracker", "adapter", "as_root", "as_user", "cluster_up",
    "jobs", "local_runner", "local_runner_for", "make_adapter", "make_ssh_runner",
    "request_for", "run_in_thread",
    "slurm", "slurm_runner", "squeue_rows", "ssh_runner", "wait_gone_from_squeue", "wait_obs",
    "wait_node_ready",
]

ROOT = Path(__file__).resolve().parent.parent
SLURM_UP = ROOT / "scripts" / "slurm-up"
SLURM_CTL = ROOT / "scripts" / "slurm-ctl"
ENV_FILE = Path("/var/lib/dispatch-slurm/env")
# On the Slurm host (this machine), in the submit user's home.
OUTPUT_DIR = "~/.dispatch/test-output"
WORKDIR = "/tmp"

T = TypeVar("T")


@dataclass(frozen=True)
class SlurmEnv:
    """What ``scripts/slurm-up`` wrote to its env file."""

    version: str
    ssh_port: int
    ssh_key: str
    known_hosts: str
    submit_user: str
    other_user: str
    node: str
    cluster: str
    partition: str
    accounting: bool


def _read_env() -> dict[str, str]:
    env: dict[str, str] = {}
    for line in ENV_FILE.read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep:
            env[key.strip()] = value.strip()
    return env


def _live_options() -> dict[str, str] | None:
    """MinJobAge and MaxJobId of the running slurmctld, or None when it does not answer."""
    try:
        out = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True,
                             timeout=15, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    found: dict[str, str] = {}
    for line in out.stdout.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            found[key.strip()] = value.strip().split()[0] if value.strip() else ""
    return found


def _daemons_up() -> bool:
    for name in ("slurmctld", "slurmd", "slurmdbd", "sshd"):
        status = subprocess.run([str(SLURM_CTL), "status", name],
                                capture_output=True, check=False)
        if status.returncode != 0:
            return False
    return True


DEFAULT_MAX_JOB_ID = "67043328"


def cluster_up(*, min_job_age: int | None = None, max_job_id: int | None = None) -> SlurmEnv:
    """Make the cluster run with these options (None: Slurm's/slurm-up's defaults)."""
    want_age = str(300 if min_job_age is None else min_job_age)
    want_max = DEFAULT_MAX_JOB_ID if max_job_id is None else str(max_job_id)
    live = _live_options() if ENV_FILE.exists() else None
    if (live is None or live.get("MinJobAge") != want_age or live.get("MaxJobId") != want_max
            or not _daemons_up()):
        args = [str(SLURM_UP)]
        if min_job_age is not None:
            args += ["--min-job-age", str(min_job_age)]
        if max_job_id is not None:
            args += ["--max-job-id", str(max_job_id)]
        subprocess.run(args, check=True, stdout=subprocess.DEVNULL, timeout=600)
    wait_node_ready()
    env = _read_env()
    return SlurmEnv(
        version=env["SLURM_VERSION"], ssh_port=int(env["SSH_PORT"]), ssh_key=env["SSH_KEY"],
        known_hosts=env["SSH_KNOWN_HOSTS"], submit_user=env["SUBMIT_USER"],
        other_user=env["OTHER_USER"], node=env["NODE"], cluster=env["CLUSTER"],
        partition=env["PARTITION"], accounting=env.get("ACCOUNTING", "on") == "on")


def wait_node_ready(timeout: float = 60) -> None:
    """Wait until the node takes jobs, resuming it if a test left it down."""
    deadline = time.monotonic() + timeout
    resumed = 0.0
    state = ""
    while time.monotonic() < deadline:
        out = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True,
                             check=False, timeout=15)
        state = out.stdout.strip().splitlines()[0] if out.stdout.strip() else ""
        if state.rstrip("*") in ("idle", "mixed", "allocated", "completing"):
            return
        if state.startswith(("down", "drain", "fail")) and time.monotonic() - resumed > 3:
            node = _read_env()["NODE"]
            as_root("scontrol", "update", f"NodeName={node}", "State=RESUME", check=False)
            resumed = time.monotonic()
        time.sleep(0.3)
    raise AssertionError(f"node not ready after {timeout}s: {state!r}")


def as_root(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """An administrator's command (we are root)."""
    return subprocess.run(list(argv), capture_output=True, text=True, check=check, timeout=60,
                          env={**os.environ, "TZ": "UTC"})


def as_user(user: str, *argv: str, check: bool = True,
            stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """A command of an ordinary user (``runuser``), with TZ=UTC."""
    return subprocess.run(["runuser", "-u", user, "--", "env", "TZ=UTC", *argv],
                          capture_output=True, text=True, check=check, timeout=60,
                          input=stdin)


def squeue_rows(user: str, name: str) -> list[str]:
    """``id|name|state`` of every job of ``user`` with this name (any state)."""
    out = as_user(user, "squeue", "-h", "--me", "--states=all", f"--name={name}",
                  "-o", "%i|%j|%T")
    return [line for line in out.stdout.splitlines() if line.split("|")[1:2] == [name]]


def run_in_thread(factory: Callable[[], Awaitable[T]]) -> T:
    """Run a coroutine on its own event loop in a thread (for module-scoped fixtures)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = asyncio.run(_await(factory))
        except BaseException as exc:  # re-raised in the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


async def _await(factory: Callable[[], Awaitable[T]]) -> T:
    return await factory()


# ---------------------------------------------------------------- requests


def request_for(job_id: JobID, command: list[str], *, submission: int = 1, attempt: int = 0,
                gate: bool = False, requeue: bool = False, time_limit_s: int | None = None,
                nodes: int | None = None, extra: dict[str, Any] | None = None) -> StartRequest:
    doc: dict[str, Any] = {"command": command, "workdir": WORKDIR}
    resources: dict[str, int] = {}
    if time_limit_s is not None:
        resources["time_limit_s"] = time_limit_s
    if nodes is not None:
        resources["nodes"] = nodes
    if resources:
        doc["resources"] = resources
    if requeue:
        doc["requeue"] = True
    doc.update(extra or {})
    return StartRequest(job_id=job_id, generation=1, submission=submission, attempt=attempt,
                        spec=parse_job_document(doc), gate=gate)


class Tracker:
    """Fresh dispatch job ids; whatever of them is still in the queue is cancelled after."""

    def __init__(self, user: str) -> None:
        self.user = user
        self.names: list[str] = []

    def new(self) -> JobID:
        job_id = new_job_id()
        self.names.append(discovery_name(job_id))
        return job_id

    def track(self, name: str) -> None:
        self.names.append(name)

    def cancel_all(self) -> None:
        if not self.names:
            return
        wanted = set(self.names)
        out = as_root("squeue", "-h", "-a", "--states=PENDING,RUNNING,SUSPENDED,COMPLETING",
                      "-o", "%i|%j", check=False)
        ids = [line.split("|")[0] for line in out.stdout.splitlines()
               if line.split("|", 1)[1:] and line.split("|", 1)[1] in wanted]
        if ids:
            as_root("scancel", *ids, check=False)


async def wait_obs(read: Callable[[], Awaitable[ObjectObs | None]],
                   until: Callable[[ObjectObs], bool], *, timeout: float = 30,
                   what: str = "condition", interval: float = 0.5) -> ObjectObs:
    """Poll ``read`` until ``until(obs)``; fail with the last observation."""
    deadline = time.monotonic() + timeout
    last: ObjectObs | None = None
    while True:
        try:
            last = await read()
        except ErrNotFound:
            last = None
        if last is not None and until(last):
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached in {timeout}s; last: {last}")
        await asyncio.sleep(interval)


async def wait_gone_from_squeue(ref: ObjectRef, *, timeout: float = 90) -> None:
    """Until slurmctld forgets the job (MinJobAge and its purge pass)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = await asyncio.to_thread(as_root, "squeue", "-h", "-j", str(ref.id),
                                      "--states=all", "-o", "%j", check=False)
        if out.returncode != 0 or out.stdout.strip() != ref.uid:
            return
        await asyncio.sleep(1)
    raise AssertionError(f"job {ref.id} still in squeue after {timeout}s")


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def slurm() -> SlurmEnv:
    """The cluster up, whatever options it runs with now."""
    if not ENV_FILE.exists() or _live_options() is None or not _daemons_up():
        return cluster_up()
    env = _read_env()
    wait_node_ready()
    return SlurmEnv(
        version=env["SLURM_VERSION"], ssh_port=int(env["SSH_PORT"]), ssh_key=env["SSH_KEY"],
        known_hosts=env["SSH_KNOWN_HOSTS"], submit_user=env["SUBMIT_USER"],
        other_user=env["OTHER_USER"], node=env["NODE"], cluster=env["CLUSTER"],
        partition=env["PARTITION"], accounting=env.get("ACCOUNTING", "on") == "on")


def local_runner_for(env: SlurmEnv, **kwargs: Any) -> LocalRunner:
    return LocalRunner(run_as=env.submit_user, default_timeout=60, **kwargs)


def make_ssh_runner(env: SlurmEnv, **kwargs: Any) -> SSHRunner:
    kwargs.setdefault("known_hosts", env.known_hosts)
    return SSHRunner("127.0.0.1", port=env.ssh_port, username=env.submit_user,
                     client_keys=[env.ssh_key], default_timeout=60, **kwargs)


def make_adapter(env: SlurmEnv, runner: Runner, **kwargs: Any) -> SlurmAdapter:
    kwargs.setdefault("command_timeout", 60)
    return SlurmAdapter(runner, cluster=env.cluster, settings=StartSettings(
        output_dir=OUTPUT_DIR), user=env.submit_user, **kwargs)


@pytest.fixture
def local_runner(slurm: SlurmEnv) -> LocalRunner:
    return local_runner_for(slurm)


@pytest.fixture
async def ssh_runner(slurm: SlurmEnv) -> AsyncIterator[SSHRunner]:
    runner = make_ssh_runner(slurm)
    yield runner
    await runner.close()


@pytest.fixture(params=["local", "ssh"])
async def slurm_runner(request: pytest.FixtureRequest, slurm: SlurmEnv) -> AsyncIterator[Runner]:
    runner: Runner = (local_runner_for(slurm) if request.param == "local"
                      else make_ssh_runner(slurm))
    yield runner
    await runner.close()


@pytest.fixture
def adapter(slurm: SlurmEnv, slurm_runner: Runner) -> SlurmAdapter:
    return make_adapter(slurm, slurm_runner)


@pytest.fixture
def jobs(slurm: SlurmEnv) -> Iterator[Tracker]:
    tracker = Tracker(slurm.submit_user)
    yield tracker
    tracker.cancel_all()
