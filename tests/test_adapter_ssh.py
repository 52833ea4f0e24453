"""The adapter over the SSH transport against the REAL sshd and Slurm: as
``dispatch@127.0.0.1:$SSH_PORT`` with host-key checking, one reused connection; a host
key that does not match known_hosts is refused with a clear error before anything runs."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from controller.model.obs import CauseKind, State
from controller.runner import HostKeyError
from controller.slurm.naming import discovery_name
from tests.slurm_fixtures import *  # noqa: F403
from tests.slurm_fixtures import (
    SlurmEnv,
    Tracker,
    make_adapter,
    make_ssh_runner,
    request_for,
    squeue_rows,
    wait_obs,
)

pytestmark = pytest.mark.slurm


async def test_start_find_and_writes_over_one_connection(slurm: SlurmEnv,
                                                         jobs: Tracker) -> None:
    commands: list[str] = []
    runner = make_ssh_runner(slurm, observer=lambda name, _d, _ok: commands.append(name))
    try:
        adapter = make_adapter(slurm, runner)
        job_id = jobs.new()
        ref = await adapter.start(request_for(job_id, ["sleep", "300"], gate=True,
                                              submission=4, attempt=1))
        assert squeue_rows(slurm.submit_user, ref.uid) == [f"{ref.id}|{ref.uid}|PENDING"]
        [obs] = await adapter.find(job_id)
        assert obs.ref == ref and (obs.submission, obs.attempt) == (4, 1)
        assert obs.state is State.GATED and not obs.foreign
        await adapter.hold(ref, 11)
        assert (await adapter.inspect(ref)).hold_instance == 11
        await adapter.release(ref)
        await wait_obs(lambda: adapter.inspect(ref), lambda o: o.state is State.RUNNING,
                       what="running")
        await adapter.stop(ref)
        obs = await wait_obs(lambda: adapter.inspect(ref), lambda o: o.state is State.ENDED,
                             what="ended")
        assert obs.cause.kind is CauseKind.CANCELLED
        assert runner.connections_opened == 1
        assert commands[0] == "sh" and "squeue" in commands and "scancel" in commands
    finally:
        await runner.close()


def _foreign_known_hosts(tmp_path: Path, port: int) -> str:
    key = tmp_path / "impostor"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)],
                   check=True)
    algorithm, blob = key.with_suffix(".pub").read_text().split()[:2]
    path = tmp_path / "known_hosts"
    path.write_text(f"[127.0.0.1]:{port} {algorithm} {blob}\n")
    return str(path)


async def test_host_key_mismatch_is_refused(slurm: SlurmEnv, tmp_path: Path,
                                            jobs: Tracker) -> None:
    commands: list[str] = []
    runner = make_ssh_runner(slurm, known_hosts=_foreign_known_hosts(tmp_path, slurm.ssh_port),
                             observer=lambda name, _d, _ok: commands.append(name))
    adapter = make_adapter(slurm, runner)
    job_id = jobs.new()
    with pytest.raises(HostKeyError, match="does not match known_hosts"):
        await adapter.find(job_id)
    with pytest.raises(HostKeyError, match="refusing to connect"):
        await adapter.start(request_for(job_id, ["true"]))
    assert squeue_rows(slurm.submit_user, discovery_name(job_id)) == []  # nothing ran
    assert runner.connections_opened == 0
    await runner.close()


async def test_unknown_host_is_refused(slurm: SlurmEnv, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    runner = make_ssh_runner(slurm, known_hosts=str(empty))
    adapter = make_adapter(slurm, runner)
    with pytest.raises(HostKeyError, match="not in known_hosts"):
        await adapter.cluster_stats()
    await runner.close()
