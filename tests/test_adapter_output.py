"""Output (SPEC §3.4) of REAL jobs: the manifest names the files, every execution of a
requeued job writes its own, and they are read back in restart order -- in one read
after the job ended, and followed live while Slurm requeues it."""

from __future__ import annotations

import asyncio
import posixpath
from typing import Any

import pytest

from controller.errors import ErrInvalid, ErrNotFound
from controller.model.obs import CauseKind, ObjectRef, State
from controller.runner import Runner
from controller.slurm.adapter import SlurmAdapter
from controller.slurm.naming import discovery_name
from tests.slurm_fixtures import *  # noqa: F403
from tests.slurm_fixtures import (
    OUTPUT_DIR,
    SlurmEnv,
    Tracker,
    as_root,
    as_user,
    make_adapter,
    matrix,
    request_for,
    wait_obs,
)

pytestmark = pytest.mark.slurm

# r0 writes and waits to be requeued; r1 writes and exits 0. r0 waits in `exec sleep`:
# a shell left waiting on a child that the requeue's SIGTERM kills first may write
# "Terminated" to r0's stderr (dash does, depending on which of the two dies first).
REQUEUED_COMMAND = [
    "sh", "-c",
    'echo "out $DISPATCH_ATTEMPT"; echo "err $DISPATCH_ATTEMPT" >&2; '
    'if [ "${SLURM_RESTART_COUNT:-0}" -ge 1 ]; then exit 0; fi; exec sleep 300',
]


async def read_all(adapter: SlurmAdapter, ref: ObjectRef, stream: Any, *,
                   follow: bool = False, submission: int = 1) -> bytes:
    chunks = [chunk async for chunk in adapter.output(
        ref, stream, follow=follow, submission=submission)]
    return b"".join(chunks)


@matrix
async def test_requeued_job_output_in_restart_order(slurm: SlurmEnv, slurm_runner: Runner,
                                                    jobs: Tracker) -> None:
    adapter = make_adapter(slurm, slurm_runner, poll_interval=0.3)
    job_id = jobs.new()
    ref = await adapter.start(request_for(job_id, REQUEUED_COMMAND, requeue=True))
    followed = asyncio.create_task(read_all(adapter, ref, "stdout", follow=True))

    r0 = f"out s1-{ref.id}-r0\n".encode()
    await wait_obs(lambda: adapter.inspect(ref), lambda o: o.state is State.RUNNING,
                   what="running")
    for _ in range(100):
        if await read_all(adapter, ref, "stdout") == r0:
            break
        await asyncio.sleep(0.2)
    else:
        pytest.fail("the first execution wrote nothing")
    assert not followed.done()  # still following: the job has not ended

    as_root("scontrol", "requeue", str(ref.id))
    await wait_obs(lambda: adapter.inspect(ref),
                   lambda o: o.state is State.PENDING and o.restart_count == 1,
                   what="requeued", timeout=20)
    as_root("scontrol", "update", f"JobId={ref.id}", "StartTime=now")
    obs = await wait_obs(lambda: adapter.inspect(ref), lambda o: o.state is State.ENDED,
                         what="second execution ended", timeout=40)
    assert obs.cause.kind is CauseKind.COMPLETED and obs.restart_count == 1

    r1 = f"out s1-{ref.id}-r1\n".encode()
    assert await read_all(adapter, ref, "stdout") == r0 + r1
    assert await read_all(adapter, ref, "stderr") == (
        f"err s1-{ref.id}-r0\nerr s1-{ref.id}-r1\n".encode())
    assert await asyncio.wait_for(followed, 30) == r0 + r1  # ended: follow stopped

    # numeric restart order: r9 before r10 (files made by hand next to the real ones)
    directory = posixpath.join(OUTPUT_DIR.replace("~", f"/home/{slurm.submit_user}", 1),
                               job_id)
    for restart in (10, 9, 2):
        as_user(slurm.submit_user, "sh", "-c",
                f'echo r{restart} >"$1/s1-{ref.id}-r{restart}.out"', "sh", directory)
    as_user(slurm.submit_user, "sh", "-c", 'echo stray >"$1/s1-999-r3.out"', "sh", directory)
    assert await read_all(adapter, ref, "stdout") == r0 + r1 + b"r2\nr9\nr10\n"


async def test_absolute_output_paths_and_missing_manifest(slurm: SlurmEnv,
                                                          local_runner: Runner,
                                                          jobs: Tracker) -> None:
    adapter = make_adapter(slurm, local_runner)
    job_id = jobs.new()
    base = f"/tmp/dispatch-adapter-test/{job_id}"
    ref = await adapter.start(request_for(
        job_id, ["sh", "-c", "printf 'a\\0b\\377'; echo oops >&2"],
        extra={"extensions": {"dispatch": {"Output": {"stdout": f"{base}/out",
                                                      "stderr": f"{base}/err"}}}}))
    await wait_obs(lambda: adapter.inspect(ref), lambda o: o.state is State.ENDED,
                   what="ended")
    assert await read_all(adapter, ref, "stdout") == b"a\0b\377"  # bytes, not text
    assert await read_all(adapter, ref, "stderr") == b"oops\n"
    listing = as_user(slurm.submit_user, "ls", base).stdout.split()
    assert listing == [f"err.s1-{ref.id}-r0", f"out.s1-{ref.id}-r0"]

    with pytest.raises(ErrNotFound, match="manifest"):
        await read_all(adapter, ref, "stdout", submission=2)
    with pytest.raises(ErrInvalid):
        await read_all(adapter, ref, "journal")
    other = ObjectRef(ref.cluster, discovery_name(jobs.new()), ref.id, ref.submit)
    with pytest.raises(ErrNotFound):
        await read_all(adapter, other, "stdout")
