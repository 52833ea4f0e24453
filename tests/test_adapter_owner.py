"""The ownership marker's scripts (``SlurmAdapter.owner_marker``/``set_owner_marker``)
run for real by ``/bin/sh`` through the local runner, on a directory of the test's own:
absent, written atomically, read back, written again; bad ids and tokens refused before
anything runs; the write goes through the adapter's write guard."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.errors import ErrInvalid, LeaseLost
from controller.runner import LocalRunner
from controller.slurm.adapter import SlurmAdapter
from controller.slurm.script import StartSettings

DEPLOYMENT = "0123456789abcdef0123456789abcdef"


def adapter_for(tmp_path: Path, **kwargs: object) -> SlurmAdapter:
    return SlurmAdapter(LocalRunner(default_timeout=30), cluster="lab", user="svc",
                        settings=StartSettings(output_dir=str(tmp_path / "out")),
                        **kwargs)  # type: ignore[arg-type]


async def test_a_marker_is_absent_then_written_then_read(tmp_path: Path) -> None:
    adapter = adapter_for(tmp_path)
    assert await adapter.owner_marker(DEPLOYMENT) is None
    await adapter.set_owner_marker(DEPLOYMENT, "aa11")
    assert await adapter.owner_marker(DEPLOYMENT) == "aa11"
    await adapter.set_owner_marker(DEPLOYMENT, "bb22")
    assert await adapter.owner_marker(DEPLOYMENT) == "bb22"
    owners = tmp_path / "out" / ".owners"
    marker = f"{DEPLOYMENT}@lab"  # one marker per cluster: clusters share home directories
    assert sorted(p.name for p in owners.iterdir()) == [marker]  # no .new left over
    assert (owners / marker).read_text() == "bb22\n"


@pytest.mark.parametrize(("deployment", "token"), [
    pytest.param("../etc", "aa", id="deployment-path"),
    pytest.param("", "aa", id="deployment-empty"),
    pytest.param(DEPLOYMENT, "aa; rm -rf ~", id="token-shell"),
    pytest.param(DEPLOYMENT, "", id="token-empty"),
])
async def test_bad_ids_are_refused_before_anything_runs(tmp_path: Path, deployment: str,
                                                        token: str) -> None:
    adapter = adapter_for(tmp_path)
    with pytest.raises(ErrInvalid):
        await adapter.set_owner_marker(deployment, token)
    assert not (tmp_path / "out").exists()


async def test_the_marker_write_is_guarded(tmp_path: Path) -> None:
    def lost() -> None:
        raise LeaseLost("not the lease holder")

    adapter = adapter_for(tmp_path, write_guard=lost)
    with pytest.raises(LeaseLost):
        await adapter.set_owner_marker(DEPLOYMENT, "aa11")
    assert await adapter.owner_marker(DEPLOYMENT) is None
