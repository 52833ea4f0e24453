"""Every script under scripts/ answers ``--help`` at once (before it installs or starts
anything) and its help names every option it parses, ``--version`` of the Slurm scripts
included (issue 21: ``scripts/slurm-up --help`` did not list ``--version``)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT

SCRIPTS = sorted(p for p in (ROOT / "scripts").iterdir() if p.is_file())
# an option a script parses: a case pattern such as `--max-job-id)` or `--slots=*)`
OPTION = re.compile(r"^\s*(?:-\w\s*\|\s*)?(--[a-z][a-z0-9-]*)(?:=\*)?\s*[|)]", re.M)
HELP_HANDLER = re.compile(r"--help\s*[|)]")


def options(script: Path) -> set[str]:
    text = script.read_text()
    found = set(OPTION.findall(text)) - {"--help"}
    if "ds_version_hook" in text:  # scripts/lib/slurm-version.sh takes --version
        found.add("--version")
    return found


def test_every_script_is_listed() -> None:
    names = {p.name for p in SCRIPTS}
    assert {"demo", "test", "slurm-up", "slurm-down", "slurm-ctl", "slurm-chroot",
            "postgres-up", "image-base", "gridengine-up", "gridengine-down"} <= names


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.name for p in SCRIPTS])
def test_help_names_every_option(script: Path) -> None:
    # never run a script that would not stop at --help (it could start a cluster)
    assert HELP_HANDLER.search(script.read_text()), f"{script.name}: no --help handler"
    done = subprocess.run([str(script), "--help"], capture_output=True, text=True,
                          timeout=30, stdin=subprocess.DEVNULL, check=False)
    assert done.returncode == 0, done.stderr
    missing = sorted(o for o in options(script) if o not in done.stdout)
    assert not missing, f"{script.name} --help does not name {missing}"
