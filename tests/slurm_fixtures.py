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

The version matrix: the host cluster is Slurm 22.05; ``scripts/slurm-up --version 24.11``
and ``--version 26.05`` run clusters in chroots next to it (env files
``/var/lib/dispatch-slurm/env-<version>``). ``slurm_version`` names the cluster a test
talks to (22.05 unless the test is parametrised with ``@matrix``: every version of
``DISPATCH_SLURM_VERSIONS``, default ``22.05,24.11,26.05``). For a chroot cluster the
adapter's commands go over SSH as ``dispatch`` (``runner_for``; the ``local`` transport of
``slurm_runner`` is skipped), and ``as_root``/``as_user`` run inside its chroot.
"""

from __future__ import annotations

import asyncio
import contextlib
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
from controller.slurm.adapter import Capabilities, SlurmAdapter
from controller.slurm.naming import discovery_name
from controller.slurm.script import StartSettings

__all__ = [
    "ALL_VERSIONS", "HOST_VERSION", "OUTPUT_DIR", "SLURM_CTL", "SlurmEnv", "Tracker", "adapter",
    "as_root", "as_user", "capabilities_of", "close_ssh_runners", "cluster_up", "host_only",
    "jobs", "local_runner", "local_runner_for", "make_adapter", "make_ssh_runner", "matrix",
    "matrix_versions", "request_for", "run_in_thread", "runner_for", "slurm", "slurm_ctl",
    "slurm_runner", "slurm_target", "slurm_version", "squeue_rows", "ssh_runner",
    "wait_gone_from_squeue", "wait_obs", "wait_node_ready",
]

ROOT = Path(__file__).resolve().parent.parent
SLURM_UP = ROOT / "scripts" / "slurm-up"
SLURM_CTL = ROOT / "scripts" / "slurm-ctl"
ENV_FILE = Path("/var/lib/dispatch-slurm/env")
HOST_VERSION = "22.05"  # the host's own packages (scripts/slurm-up without --version)
ALL_VERSIONS = ("22.05", "24.11", "26.05")
VERSIONS_VAR = "DISPATCH_SLURM_VERSIONS"
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
    series: str = HOST_VERSION  # "22.05", "24.11", "26.05"
    chroot: str | None = None  # the root filesystem of a chroot cluster


def matrix_versions() -> list[str]:
    """The versions of ``DISPATCH_SLURM_VERSIONS`` (default: all three), in order."""
    text = os.environ.get(VERSIONS_VAR, ",".join(ALL_VERSIONS))
    versions = [v.strip() for v in text.split(",") if v.strip()]
    unknown = [v for v in versions if v not in ALL_VERSIONS]
    if unknown or not versions:
        raise pytest.UsageError(f"{VERSIONS_VAR}={text!r}: known versions are "
                                f"{', '.join(ALL_VERSIONS)}")
    return versions


# Run the test against every cluster of DISPATCH_SLURM_VERSIONS (grouped per module).
matrix = pytest.mark.parametrize("slurm_version", matrix_versions(), indirect=True,
                                 scope="module")
# The host's 22.05 only, in a module whose module-scoped fixtures follow the version (so
# these tests share the 22.05 instance with the module's @matrix tests).
host_only = pytest.mark.parametrize("slurm_version", [HOST_VERSION], indirect=True,
                                    scope="module")

# The version of the running test (slurm_target); 22.05 outside one.
_ACTIVE: list[str] = [HOST_VERSION]


def env_file(version: str) -> Path:
    return ENV_FILE if version == HOST_VERSION else ENV_FILE.with_name(f"env-{version}")


def _read_env(version: str | None = None) -> dict[str, str]:
    env: dict[str, str] = {}
    for line in env_file(version or _ACTIVE[0]).read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep:
            env[key.strip()] = value.strip()
    return env


def _env_of(version: str) -> SlurmEnv:
    env = _read_env(version)
    return SlurmEnv(
        version=env["SLURM_VERSION"], ssh_port=int(env["SSH_PORT"]), ssh_key=env["SSH_KEY"],
        known_hosts=env["SSH_KNOWN_HOSTS"], submit_user=env["SUBMIT_USER"],
        other_user=env["OTHER_USER"], node=env["NODE"], cluster=env["CLUSTER"],
        partition=env["PARTITION"], accounting=env.get("ACCOUNTING", "on") == "on",
        series=version, chroot=env.get("CHROOT") or None)


def _root_prefix(version: str | None) -> list[str]:
    """``chroot ROOT`` for a chroot cluster's commands; nothing for the host's."""
    version = version or _ACTIVE[0]
    if version == HOST_VERSION:
        return []
    return ["chroot", _read_env(version)["CHROOT"]]


def slurm_ctl(*args: str, version: str | None = None,
              check: bool = True) -> subprocess.CompletedProcess[str]:
    """``scripts/slurm-ctl [--version V] ARGS`` on the host (stop/start/status a daemon)."""
    version = version or _ACTIVE[0]
    pick = [] if version == HOST_VERSION else ["--version", version]
    return subprocess.run([str(SLURM_CTL), *pick, *args], capture_output=True, text=True,
                          check=check, timeout=120)


def _live_options(version: str | None = None) -> dict[str, str] | None:
    """MinJobAge and MaxJobId of the running slurmctld, or None when it does not answer."""
    try:
        out = subprocess.run([*_root_prefix(version), "scontrol", "show", "config"],
                             capture_output=True, text=True, timeout=15, check=False)
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


def _daemons_up(version: str | None = None) -> bool:
    version = version or _ACTIVE[0]
    if version != HOST_VERSION:
        return slurm_ctl("status", version=version, check=False).returncode == 0
    for name in ("slurmctld", "slurmd", "slurmdbd", "sshd"):
        status = subprocess.run([str(SLURM_CTL), "status", name],
                                capture_output=True, check=False)
        if status.returncode != 0:
            return False
    return True


DEFAULT_MAX_JOB_ID = "67043328"


def cluster_up(*, min_job_age: int | None = None, max_job_id: int | None = None,
               version: str | None = None) -> SlurmEnv:
    """Make the cluster of ``version`` (default: the running test's) run with these
    options (None: Slurm's/slurm-up's defaults)."""
    version = version or _ACTIVE[0]
    want_age = str(300 if min_job_age is None else min_job_age)
    want_max = DEFAULT_MAX_JOB_ID if max_job_id is None else str(max_job_id)
    live = _live_options(version) if env_file(version).exists() else None
    if (live is None or live.get("MinJobAge") != want_age or live.get("MaxJobId") != want_max
            or not _daemons_up(version)):
        args = [str(SLURM_UP)]
        if version != HOST_VERSION:
            args += ["--version", version]
        if min_job_age is not None:
            args += ["--min-job-age", str(min_job_age)]
        if max_job_id is not None:
            args += ["--max-job-id", str(max_job_id)]
        subprocess.run(args, check=True, stdout=subprocess.DEVNULL, timeout=600)
    wait_node_ready(version=version)
    return _env_of(version)


def wait_node_ready(timeout: float = 60, *, version: str | None = None) -> None:
    """Wait until the node takes jobs, resuming it if a test left it down."""
    version = version or _ACTIVE[0]
    deadline = time.monotonic() + timeout
    resumed = 0.0
    state = ""
    while time.monotonic() < deadline:
        out = subprocess.run([*_root_prefix(version), "sinfo", "-h", "-o", "%T"],
                             capture_output=True, text=True, check=False, timeout=15)
        state = out.stdout.strip().splitlines()[0] if out.stdout.strip() else ""
        if state.rstrip("*") in ("idle", "mixed", "allocated", "completing"):
            return
        if state.startswith(("down", "drain", "fail")) and time.monotonic() - resumed > 3:
            node = _read_env(version)["NODE"]
            as_root("scontrol", "update", f"NodeName={node}", "State=RESUME", check=False,
                    version=version)
            resumed = time.monotonic()
        time.sleep(0.3)
    raise AssertionError(f"node not ready after {timeout}s: {state!r}")


def as_root(*argv: str, check: bool = True,
            version: str | None = None) -> subprocess.CompletedProcess[str]:
    """An administrator's command (we are root), on the cluster of ``version`` (default:
    the running test's; inside the chroot for 24.11/26.05)."""
    return subprocess.run([*_root_prefix(version), *argv], capture_output=True, text=True,
                          check=check, timeout=60, env={**os.environ, "TZ": "UTC"})


def as_user(user: str, *argv: str, check: bool = True, stdin: str | None = None,
            version: str | None = None) -> subprocess.CompletedProcess[str]:
    """A command of an ordinary user (``runuser``), with TZ=UTC."""
    return subprocess.run([*_root_prefix(version), "runuser", "-u", user, "--", "env",
                           "TZ=UTC", *argv],
                          capture_output=True, text=True, check=check, timeout=60,
                          input=stdin)


def started_runs(version: str, names: set[str]) -> dict[str, int]:
    """Per job name: how many of the cluster's sacct records of it (all users, duplicates
    of reused ids too) ever started."""
    out = as_root("sacct", "-a", "-X", "-D", "-P", "-n", "-S", "now-2hours",
                  "-o", "JobName%64,Start,NodeList%200", version=version).stdout
    counts = dict.fromkeys(names, 0)
    for line in out.splitlines():
        name, start, nodes = [*line.split("|"), "", ""][:3]
        # (on 22.05 a job cancelled while pending gets its end time as Start, no node)
        if name in counts and start not in ("Unknown", "None", "") \
                and nodes.strip() not in ("", "None assigned"):
            counts[name] += 1
    return counts


def squeue_rows(user: str, name: str, *, version: str | None = None) -> list[str]:
    """``id|name|state`` of every job of ``user`` with this name (any state)."""
    out = as_user(user, "squeue", "-h", "--me", "--states=all", f"--name={name}",
                  "-o", "%i|%j|%T", version=version)
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

    def __init__(self, user: str, version: str | None = None) -> None:
        self.user = user
        self.version = version or _ACTIVE[0]
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
                      "-o", "%i|%j", check=False, version=self.version)
        ids = [line.split("|")[0] for line in out.stdout.splitlines()
               if line.split("|", 1)[1:] and line.split("|", 1)[1] in wanted]
        if ids:
            as_root("scancel", *ids, check=False, version=self.version)


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
            forensics = "" if last is None else await asyncio.to_thread(
                job_forensics, last.ref.id, last.ref.uid)
            raise AssertionError(f"{what} not reached in {timeout}s; last: {last}{forensics}")
        await asyncio.sleep(interval)


def job_forensics(slurm_id: int, uid: str = "") -> str:
    """What the running test's cluster knows of job ``slurm_id``, for a failure message:
    its sacct records (every one of a reused or requeued id), the daemons' log lines
    that name it and Slurm's own messages to the job (``D/s<N>-<id>.slurm`` under
    OUTPUT_DIR, when ``uid`` is its ``dj-`` name). Never raises: it only explains."""
    parts = []
    pattern = f"JobId={slurm_id}( |$)|job[ _]?{slurm_id}( |$|\\.)"
    for title, argv in (
            ("sacct -D", ["sacct", "-X", "-D", "-P", "-j", str(slurm_id), "-o",
                          "JobID,JobName,User,State,ExitCode,Submit,Start,End,Reason,NodeList"]),
            ("Slurm logs", ["sh", "-c", f"grep -h -E '{pattern}' "
                            "/var/lib/dispatch-slurm/log/*.log | tail -n 40"]),
            ("Slurm's messages to the job", ["sh", "-c", "tail -n 20 " + OUTPUT_DIR.replace(
                "~", f"~{_env_of(_ACTIVE[0]).submit_user}", 1)
                + f"/{uid.removeprefix('dj-') or 'none'}/s*-{slurm_id}.slurm"])):
        try:
            out = as_root(*argv, check=False)
            parts.append(f"\n--- {title}:\n{out.stdout.strip()}{out.stderr.strip()}")
        except Exception as exc:  # explaining a failure, not testing
            parts.append(f"\n--- {title}: {exc}")
    return "".join(parts)


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


@pytest.fixture(scope="module")
def slurm_version(request: pytest.FixtureRequest) -> str:
    """The Slurm series a test talks to: its ``@matrix`` parameter, else the host's."""
    return str(getattr(request, "param", HOST_VERSION))


@pytest.fixture(autouse=True)
def slurm_target(request: pytest.FixtureRequest) -> Iterator[str]:
    """Points ``as_root``/``as_user`` (and the other helpers' default) at the running
    test's cluster, and back at the host's afterwards."""
    callspec = getattr(request.node, "callspec", None)
    version = str(callspec.params.get("slurm_version", HOST_VERSION)) if callspec else HOST_VERSION
    _ACTIVE[0] = version
    yield version
    _ACTIVE[0] = HOST_VERSION


@pytest.fixture(scope="module")
def slurm(slurm_version: str) -> SlurmEnv:
    """The cluster of ``slurm_version`` up, whatever options it runs with now."""
    version = slurm_version
    if (not env_file(version).exists() or _live_options(version) is None
            or not _daemons_up(version)):
        return cluster_up(version=version)
    wait_node_ready(version=version)
    return _env_of(version)


def local_runner_for(env: SlurmEnv, **kwargs: Any) -> Runner:
    """The host cluster: a LocalRunner as ``dispatch``; a chroot cluster: SSH (the
    product's way; closed after the test by ``close_ssh_runners``)."""
    if env.chroot is not None:
        return runner_for(env, **kwargs)
    return LocalRunner(run_as=env.submit_user, default_timeout=60, **kwargs)


def runner_for(env: SlurmEnv, **kwargs: Any) -> Runner:
    """LocalRunner for the host cluster, an SSHRunner for a chroot cluster."""
    if env.chroot is None:
        return LocalRunner(run_as=env.submit_user, default_timeout=60, **kwargs)
    return make_ssh_runner(env, **kwargs)


_OPEN_SSH: list[SSHRunner] = []  # made by make_ssh_runner; closed after each test


def make_ssh_runner(env: SlurmEnv, **kwargs: Any) -> SSHRunner:
    kwargs.setdefault("known_hosts", env.known_hosts)
    runner = SSHRunner("127.0.0.1", port=env.ssh_port, username=env.submit_user,
                       client_keys=[env.ssh_key], default_timeout=60, **kwargs)
    _OPEN_SSH.append(runner)
    return runner


@pytest.fixture(autouse=True)
async def close_ssh_runners() -> AsyncIterator[None]:
    """Closes the SSH runners a test made and left open (closing twice is harmless)."""
    yield
    while _OPEN_SSH:
        runner = _OPEN_SSH.pop()
        # another loop's runner (run_in_thread) cannot be closed here: its loop is gone
        with contextlib.suppress(Exception):
            await runner.close()


_CAPABILITIES: dict[str, Capabilities] = {}


def capabilities_of(env: SlurmEnv) -> Capabilities:
    """What Preflight finds on ``env``'s cluster (once per version and session): the
    daemon runs Preflight on gaining the lease, so its adapter has them."""
    caps = _CAPABILITIES.get(env.series)
    if caps is None:
        async def probe() -> Capabilities:
            runner = runner_for(env)
            try:
                return await make_adapter(env, runner, capabilities=None).preflight()
            finally:
                await runner.close()
        caps = _CAPABILITIES[env.series] = run_in_thread(probe)
    return caps


def make_adapter(env: SlurmEnv, runner: Runner, **kwargs: Any) -> SlurmAdapter:
    """An adapter of ``env``'s cluster with its Preflight capabilities (identity: SLUID
    writes on 26.05); ``capabilities=None`` for one that has not run Preflight."""
    if "capabilities" not in kwargs:
        kwargs["capabilities"] = capabilities_of(env)
    kwargs.setdefault("command_timeout", 60)
    return SlurmAdapter(runner, cluster=env.cluster, settings=StartSettings(
        output_dir=OUTPUT_DIR), user=env.submit_user, **kwargs)


@pytest.fixture
def local_runner(slurm: SlurmEnv) -> LocalRunner:
    if slurm.chroot is not None:
        pytest.skip(f"Slurm {slurm.series} runs in a chroot: reached over SSH only")
    return LocalRunner(run_as=slurm.submit_user, default_timeout=60)


@pytest.fixture
async def ssh_runner(slurm: SlurmEnv) -> AsyncIterator[SSHRunner]:
    runner = make_ssh_runner(slurm)
    yield runner
    await runner.close()


@pytest.fixture(params=["local", "ssh"])
async def slurm_runner(request: pytest.FixtureRequest, slurm: SlurmEnv) -> AsyncIterator[Runner]:
    if request.param == "local" and slurm.chroot is not None:
        pytest.skip(f"Slurm {slurm.series} runs in a chroot: reached over SSH only")
    runner: Runner = (local_runner_for(slurm) if request.param == "local"
                      else make_ssh_runner(slurm))
    yield runner
    await runner.close()


@pytest.fixture
def adapter(slurm: SlurmEnv, slurm_runner: Runner) -> SlurmAdapter:
    return make_adapter(slurm, slurm_runner)


@pytest.fixture
def jobs(slurm: SlurmEnv) -> Iterator[Tracker]:
    tracker = Tracker(slurm.submit_user, slurm.series)
    yield tracker
    tracker.cancel_all()
