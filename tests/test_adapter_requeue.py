"""A job that Slurm requeued, then finished (issue 9): accounting (``inspect_many``, sacct
regardless of squeue) follows the requeue chain from the ref's submit time to the record
of the last execution, and reports its real outcome, on the REAL cluster."""

from __future__ import annotations

import asyncio
import time

import pytest

from controller.model.obs import CauseKind, ObjectObs, ObjectRef, Source, State
from controller.slurm.adapter import SlurmAdapter
from tests.slurm_fixtures import *  # noqa: F403
from tests.slurm_fixtures import (
    SlurmEnv,
    Tracker,
    as_root,
    local_runner_for,
    make_adapter,
    matrix,
    request_for,
    wait_obs,
)

pytestmark = pytest.mark.slurm

# r0 waits to be requeued; r1 exits 0.
COMMAND = ["sh", "-c", 'if [ "${SLURM_RESTART_COUNT:-0}" -ge 1 ]; then exit 0; fi; sleep 300']


async def accounting_of(adapter: SlurmAdapter, ref: ObjectRef, *,
                        timeout: float = 60) -> ObjectObs:
    """inspect_many until accounting has an ended record of ``ref``'s object."""
    deadline = time.monotonic() + timeout
    while True:
        found = await adapter.inspect_many([ref], since=ref.submit - 60)
        if ref in found and found[ref].state is State.ENDED:
            return found[ref]
        if time.monotonic() > deadline:
            raise AssertionError(f"no ended accounting record of {ref}: {found}")
        await asyncio.sleep(1)


@matrix
async def test_requeued_then_completed_job_is_completed_in_accounting(
        slurm: SlurmEnv, jobs: Tracker) -> None:
    adapter = make_adapter(slurm, local_runner_for(slurm))
    ref = await adapter.start(request_for(jobs.new(), COMMAND, requeue=True))
    await wait_obs(lambda: adapter.inspect(ref), lambda o: o.state is State.RUNNING,
                   what="running", timeout=30)
    as_root("scontrol", "requeue", str(ref.id))
    requeued = await wait_obs(lambda: adapter.inspect(ref),
                              lambda o: o.restart_count == 1 and o.state is not State.RUNNING,
                              what="requeued", timeout=30)
    assert requeued.submit is not None and requeued.submit > ref.submit  # a new submit time
    if requeued.state is not State.ENDED:
        as_root("scontrol", "update", f"JobId={ref.id}", "StartTime=now", check=False)
    live = await wait_obs(lambda: adapter.inspect(ref), lambda o: o.state is State.ENDED,
                          what="second execution ended", timeout=60)
    assert (live.cause.kind, live.restart_count) == (CauseKind.COMPLETED, 1)

    obs = await accounting_of(adapter, ref)  # the ref still names the FIRST submit time
    assert obs.source is Source.ACCOUNTING
    assert (obs.state, obs.cause.kind) == (State.ENDED, CauseKind.COMPLETED)
    assert obs.submit == live.submit and obs.ref.id == ref.id
    # the ref of the later execution (as a live read reports it) is matched too
    later = ObjectRef(ref.cluster, ref.uid, ref.id, live.submit or 0)
    assert (await accounting_of(adapter, later)).cause.kind is CauseKind.COMPLETED
