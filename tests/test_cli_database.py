"""dispatchctl and a database it cannot reach: every command that needs the database
ends with one line, ``dispatchctl: error: database unavailable: <reason>``, exit 1 (no
traceback, no password) -- PostgreSQL refusing connections and an SQLite file that cannot
be created alike."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from controller.cli.app import COMMANDS, main
from controller.cli.base import EXIT_FAILURE

ROOT = Path(__file__).resolve().parent.parent
JOB_ID = "01JZ8Q2N5V0000000000000000"
URLS = [
    pytest.param("postgresql://svc:hunter2@127.0.0.1:1/dispatch", id="postgres-refused"),
    pytest.param("sqlite:////nonexistent-dispatch-dir/sub/dispatch.db", id="sqlite-unwritable"),
]
# every command that reads or writes the database, with its arguments
DATABASE_COMMANDS = {
    "submit": ["JOB"],
    "get": [],
    "describe": [JOB_ID],
    "hold": [JOB_ID],
    "release": ["-l", "wf=x"],
    "cancel": [JOB_ID],
    "wait": [JOB_ID, "--timeout", "1"],
    "logs": [JOB_ID],
    "migrate": [],
    "run": [],
    "owner": [],
}
# the commands that never touch the database
NO_DATABASE = {"preflight", "config"}


def test_every_command_is_covered() -> None:
    assert set(DATABASE_COMMANDS) | NO_DATABASE == set(COMMANDS)


def _config(tmp_path: Path, url: str) -> str:
    path = tmp_path / "c.toml"
    path.write_text(f'[database]\nurl = "{url}"\n')
    return str(path)


def _argv(tmp_path: Path, name: str, url: str) -> list[str]:
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"command": ["/bin/true"], "workdir": "/tmp"}))
    args = [str(job) if a == "JOB" else a for a in DATABASE_COMMANDS[name]]
    return [name, *args, "--config", _config(tmp_path, url)]


def _check(code: int, out: str, err: str) -> None:
    assert code == EXIT_FAILURE, err
    assert out == ""
    assert err.count("\n") == 1, err
    assert err.startswith("dispatchctl: error: database unavailable: "), err
    assert "hunter2" not in err


@pytest.mark.parametrize("url", URLS)
@pytest.mark.parametrize("name", sorted(set(DATABASE_COMMANDS) - {"run"}))
def test_one_line_for_every_command(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                    name: str, url: str) -> None:
    code = main(_argv(tmp_path, name, url))
    captured = capsys.readouterr()
    _check(code, captured.out, captured.err)


@pytest.mark.parametrize("url", URLS)
def test_one_line_for_the_daemon(tmp_path: Path, url: str) -> None:
    """``run`` as a real process (it installs its own logging)."""
    done = subprocess.run([sys.executable, "-m", "controller.cli",
                           *_argv(tmp_path, "run", url)], capture_output=True, text=True,
                          timeout=60, cwd=ROOT, check=False)
    _check(done.returncode, done.stdout, done.stderr)
