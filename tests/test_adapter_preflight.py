"""Preflight (issue 9): what the daemon needs and the cluster lacks (``preflight_problems``),
``dispatchctl preflight`` exiting non-zero on it, and the real cluster passing it."""

from __future__ import annotations

import argparse
import dataclasses
import io
from pathlib import Path
from typing import Any

import pytest

from controller import wiring
from controller.cli import base
from controller.cli import slurm as slurm_commands
from controller.slurm.adapter import Capabilities, SlurmAdapter, preflight_problems
from tests.slurm_fixtures import *  # noqa: F403
from tests.slurm_fixtures import SlurmEnv, local_runner_for, make_adapter, matrix

GOOD = Capabilities(slurm_version="22.05.8", accounting_history=True, job_comment=True,
                    whoami=True, output_dir_writable=True, cluster_name="lab")


@pytest.mark.parametrize(("changes", "problem"), [
    pytest.param({}, None, id="all-there"),
    pytest.param({"accounting_history": False, "job_comment": False}, None,
                 id="accounting-is-optional"),
    pytest.param({"cluster_name": "other"}, None, id="cluster-name-is-a-warning"),
    pytest.param({"slurm_version": "21.08.8"}, "outside the supported", id="too-old"),
    pytest.param({"slurm_version": "27.05.0"}, "outside the supported", id="too-new"),
    pytest.param({"slurm_version": "banana"}, "unreadable Slurm version", id="no-version"),
    pytest.param({"whoami": False}, "squeue --me", id="no-squeue-me"),
    pytest.param({"output_dir_writable": False}, "output.dir", id="output-dir"),
    pytest.param({"missing_commands": ("sbatch", "scancel")}, "sbatch, scancel",
                 id="missing-commands"),
])
def test_preflight_problems(changes: dict[str, Any], problem: str | None) -> None:
    problems = preflight_problems(dataclasses.replace(GOOD, **changes))
    if problem is None:
        assert problems == []
    else:
        assert len(problems) == 1 and problem in problems[0], problems


class _FakeAdapter:
    def __init__(self, caps: Capabilities) -> None:
        self.caps = caps

    async def preflight(self) -> Capabilities:
        return self.caps

    async def preflight_report(self) -> tuple[dict[str, Any], list[str]]:
        """As ``SlurmAdapter.preflight_report`` (``dispatchctl preflight`` asks for it)."""
        caps = await self.preflight()
        return {"kind": "slurm", **dataclasses.asdict(caps)}, preflight_problems(caps)


class _NoRunner:
    async def close(self) -> None:
        return None


@pytest.mark.parametrize(("caps", "code"), [
    pytest.param(GOOD, base.EXIT_OK, id="ok"),
    pytest.param(dataclasses.replace(GOOD, whoami=False), base.EXIT_FAILURE, id="lacking"),
])
def test_dispatchctl_preflight_exit_status(monkeypatch: pytest.MonkeyPatch,
                                           caps: Capabilities, code: int) -> None:
    monkeypatch.setattr(wiring, "build_runner", lambda config: _NoRunner())
    monkeypatch.setattr(wiring, "build_adapter", lambda config, runner: _FakeAdapter(caps))
    out, err = io.StringIO(), io.StringIO()
    args = argparse.Namespace(config=None, output="text", cluster=None)
    assert slurm_commands._preflight(args, base.Streams(out, err)) == code
    assert ("squeue --me" in err.getvalue()) == (code == base.EXIT_FAILURE)


def test_dispatchctl_preflight_checks_every_cluster(monkeypatch: pytest.MonkeyPatch,
                                                   tmp_path: Path) -> None:
    """Several clusters: each is checked; one lacking fails the command and is named;
    ``--cluster`` checks only the ones named."""
    config = tmp_path / "config.toml"
    config.write_text('[[clusters]]\nname = "cpu"\n[[clusters]]\nname = "gpu"\n')
    caps = {"cpu": GOOD, "gpu": dataclasses.replace(GOOD, whoami=False)}
    monkeypatch.setattr(wiring, "build_runner", lambda cluster: _NoRunner())
    monkeypatch.setattr(wiring, "build_adapter",
                        lambda cluster, runner: _FakeAdapter(caps[cluster.name]))
    out, err = io.StringIO(), io.StringIO()
    args = argparse.Namespace(config=str(config), output="text", cluster=None)
    assert slurm_commands._preflight(args, base.Streams(out, err)) == base.EXIT_FAILURE
    assert "cluster cpu" in out.getvalue() and "cluster gpu" in out.getvalue()
    assert "preflight: gpu: " in err.getvalue() and "cpu: " not in err.getvalue()
    out, err = io.StringIO(), io.StringIO()
    args = argparse.Namespace(config=str(config), output="text", cluster=["cpu"])
    assert slurm_commands._preflight(args, base.Streams(out, err)) == base.EXIT_OK
    assert err.getvalue() == ""


@pytest.mark.slurm
@matrix
async def test_the_lab_cluster_has_what_the_daemon_needs(slurm: SlurmEnv) -> None:
    adapter: SlurmAdapter = make_adapter(slurm, local_runner_for(slurm))
    assert await adapter.check_preflight() == []
    assert adapter.capabilities is not None
    assert adapter.capabilities.slurm_user_uid == 0  # SlurmUser=root(0) on the lab cluster
    assert adapter.capabilities.missing_commands == ()
