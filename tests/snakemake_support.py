"""What the Snakemake plugin's end-to-end tests share: the daemon as a real process on the
host's Slurm, and Snakemake as a real process of the ordinary user ``dispatch`` -- the
user the daemon runs every job as, so Snakemake and its jobs share one user and one file
system, as on a site.

Snakemake runs from ``.venv-jobs`` (Debian's ``/usr/bin/python3`` with this repository's
``[snakemake]`` extra and pytest, built by ``scripts/test``): the tests' own ``.venv``
is under ``/root``, which ``dispatch`` cannot enter, and a Snakemake job runs the Python
of the Snakemake that submitted it. Workflow directories belong to ``dispatch``; a SQLite
database is shared by the daemon (root) and Snakemake (``dispatch``), so its directory and
files are made writable by both (``shared_sqlite``).
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.daemon_harness import ROOT, DaemonProcess, daemon, wait_for

JOBS_VENV = ROOT / ".venv-jobs"
JOBS_PYTHON = JOBS_VENV / "bin" / "python"
USER = "dispatch"
WORKFLOWS = Path("/tmp/dispatch-snakemake")
# the test node is the only one: a resubmission after node loss must not exclude it
POLICY = {"causes": {"node-lost": {"budget": 2, "exclude_node": False},
                     "boot-failed": {"budget": 2, "exclude_node": False},
                     "launch-failed": {"budget": 2, "exclude_node": False}},
          "backoff": {"initial_s": 1}}


def require_jobs_venv() -> Path:
    if not (JOBS_VENV / "bin" / "snakemake").exists():
        raise AssertionError(f"{JOBS_VENV} is missing: scripts/test builds it (Debian's "
                             "python3 with '.[snakemake]' and pytest)")
    return JOBS_VENV


def _owned(path: Path) -> None:
    entry = pwd.getpwnam(USER)
    os.chown(path, entry.pw_uid, entry.pw_gid)


def workflow_dir(name: str, snakefile: str | None = None) -> Path:
    """A fresh directory of the job user's, with ``snakefile`` as its Snakefile."""
    WORKFLOWS.mkdir(exist_ok=True)
    os.chmod(WORKFLOWS, 0o1777)
    path = WORKFLOWS / f"{name}-{uuid.uuid4().hex[:8]}"
    path.mkdir()
    _owned(path)
    if snakefile is not None:
        (path / "Snakefile").write_text(snakefile)
        _owned(path / "Snakefile")
    policy = path / "dispatch-policy.json"
    policy.write_text(json.dumps(POLICY))
    return path


def shared_sqlite() -> str:
    """A migrated SQLite database both root (the daemon) and ``dispatch`` (Snakemake)
    write: in a directory of the job user's, the file its too (SQLite run by root gives
    the WAL files the database file's owner); its URL."""
    WORKFLOWS.mkdir(exist_ok=True)
    os.chmod(WORKFLOWS, 0o1777)
    directory = WORKFLOWS / f"sqlite-{uuid.uuid4().hex[:8]}"
    directory.mkdir()
    _owned(directory)
    url = f"sqlite:///{directory / 'dispatch.db'}"
    migrate(url)
    for path in directory.iterdir():
        _owned(path)
    return url


def migrate(database_url: str) -> None:
    subprocess.run([str(Path(sys.executable).parent / "dispatchctl"), "migrate"],
                   check=True, capture_output=True,
                   env={**os.environ, "DISPATCH_DATABASE_URL": database_url})


@contextmanager
def dispatch_daemon(tmp: Path, database_url: str) -> Iterator[DaemonProcess]:
    """The daemon (``dispatchctl run``) on a migrated ``database_url``, ticking every
    second."""
    migrate(database_url)
    with daemon(tmp, database_url, tick_s=1.0) as process:
        yield process


def _user_env() -> dict[str, str]:
    entry = pwd.getpwnam(USER)
    return {"HOME": entry.pw_dir, "USER": USER, "LOGNAME": USER, "LANG": "C.UTF-8",
            "PATH": f"{JOBS_VENV / 'bin'}:/usr/local/bin:/usr/bin:/bin"}


def as_job_user(argv: list[str], *, cwd: Path, env: Mapping[str, str] | None = None,
                log: Path | None = None) -> subprocess.Popen[bytes]:
    """``argv`` as the job user, in its own process group, output appended to ``log``."""
    handle = log.open("ab") if log is not None else None
    try:
        return subprocess.Popen(argv, cwd=str(cwd), env={**_user_env(), **(env or {})},
                                user=USER, group=USER, extra_groups=[],
                                stdout=handle or subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)
    finally:
        if handle is not None:
            handle.close()


def snakemake_argv(workdir: Path, database_url: str, *extra: str, jobs: int = 8) -> list[str]:
    return [str(require_jobs_venv() / "bin" / "snakemake"), "--executor", "dispatch",
            "--jobs", str(jobs), "--dispatch-database-url", database_url,
            "--dispatch-policy", str(workdir / "dispatch-policy.json"),
            "--seconds-between-status-checks", "1", "--latency-wait", "5", *extra]


def start_snakemake(workdir: Path, database_url: str, *extra: str,
                    jobs: int = 8) -> subprocess.Popen[bytes]:
    """``snakemake --executor dispatch`` in ``workdir`` as the job user; its output
    appended to ``<workdir>/snakemake.log``."""
    return as_job_user(snakemake_argv(workdir, database_url, *extra, jobs=jobs),
                       cwd=workdir, log=workdir / "snakemake.log")


def finish(proc: subprocess.Popen[bytes], *, timeout: float) -> int:
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise


def run_snakemake(workdir: Path, database_url: str, *extra: str, jobs: int = 8,
                  timeout: float = 300) -> tuple[int, str]:
    """Snakemake to its end: (exit status, everything it printed so far)."""
    code = finish(start_snakemake(workdir, database_url, *extra, jobs=jobs), timeout=timeout)
    return code, (workdir / "snakemake.log").read_text(errors="replace")


def views_by_run(database_url: str) -> dict[str, list[dict[str, Any]]]:
    """Every dispatch job of the database, by its ``snakemake/run`` label."""
    from controller.client import Client

    client = Client(database_url)
    try:
        out: dict[str, list[dict[str, Any]]] = {}
        for view in client.list_jobs():
            out.setdefault(view["labels"].get("snakemake/run", ""), []).append(view)
        return out
    finally:
        client.close()


def remove_workflow(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


__all__ = ["JOBS_PYTHON", "POLICY", "as_job_user", "dispatch_daemon", "finish",
           "remove_workflow", "require_jobs_venv", "run_snakemake", "shared_sqlite",
           "snakemake_argv", "start_snakemake", "views_by_run", "wait_for", "workflow_dir"]
