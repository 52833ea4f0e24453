"""Every state and cause of SPEC §4, reached for REAL on the local Slurm cluster and read
back through the adapter: find/find_many (squeue), inspect (squeue, then sacct once the
job has left slurmctld's memory) and inspect_many (one sacct call).

Reached for real: gated; held by dispatch (instance decoded), by an admin, by Slurm's
requeuehold; pending (begin time), unrunnable, requeued; running; suspended; ended
completed, non-zero-exit (exit code carried), signaled, cancelled (by the user, by an
admin), timeout, node-lost; and the sacct forms of the ended ones. Not reachable on this
one-node cluster without cgroups or preemption: out-of-memory, preempted, launch-failed,
boot-failed, deadline (tests/test_classify.py covers their rows).

The module runs with ``MinJobAge=5`` (so ended jobs leave squeue within seconds) and
restores slurm-up's defaults afterwards. Slow scenarios overlap: the node-lost scenario
runs first (setting the node DOWN kills every job on it), then the one-minute
``--time=1`` job starts and is only asserted by the last test, ~70 s later.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
from collections.abc import Iterator

import pytest

from controller.errors import ErrConflict, ErrNotFound, ErrUnsupported, TransientError
from controller.model.ids import JobID
from controller.model.obs import CauseKind, ObjectObs, ObjectRef, Provenance, Source, State
from controller.slurm.adapter import SlurmAdapter, utc_text
from controller.slurm.holds import HOLD_BASE
from tests.slurm_fixtures import *  # noqa: F403
from tests.slurm_fixtures import (
    SlurmEnv,
    Tracker,
    as_root,
    as_user,
    cluster_up,
    host_only,
    local_runner_for,
    make_adapter,
    matrix,
    request_for,
    run_in_thread,
    slurm_ctl,
    wait_gone_from_squeue,
    wait_node_ready,
    wait_obs,
)

pytestmark = pytest.mark.slurm


@pytest.fixture(scope="module", autouse=True)
def cluster(slurm_version: str) -> Iterator[SlurmEnv]:
    env = cluster_up(min_job_age=5, version=slurm_version)
    yield env
    cluster_up(version=slurm_version)  # slurm-up's defaults again


async def only(adapter: SlurmAdapter, job_id: JobID) -> ObjectObs | None:
    """The one live object of ``job_id`` (find_many), or None."""
    found = (await adapter.find_many([job_id]))[job_id]
    assert len(found) <= 1, found
    return found[0] if found else None


async def ended(adapter: SlurmAdapter, ref: ObjectRef) -> ObjectObs:
    """After stop: squeue's text prints a cancelled job that is still cleaning up as
    COMPLETING (running) for about a second, then CANCELLED -- on a loaded machine for
    longer (a full suite run: still COMPLETING 15 s after the scancel of a job just
    requeued by root and started again)."""
    return await wait_obs(lambda: adapter.inspect(ref), lambda o: o.state is State.ENDED,
                          what="ended", timeout=60, interval=0.3)


async def script_runs(marker: str, count: int, *, timeout: float = 60) -> list[str]:
    """Wait until the job's script has appended ``count`` lines to ``marker`` (one per run,
    on the node): squeue says RUNNING before slurmd has launched the script."""
    deadline = time.monotonic() + timeout
    while True:
        lines = as_root("cat", marker, check=False).stdout.split()
        if len(lines) >= count:
            return lines
        if time.monotonic() > deadline:
            raise AssertionError(f"{count} runs of the script not seen in {timeout}s: {lines}")
        await asyncio.sleep(0.3)


def _identity_ok(obs: ObjectObs, ref: ObjectRef) -> None:
    assert obs.ref.uid == ref.uid and obs.ref.id == ref.id and obs.ref.cluster == ref.cluster
    assert obs.submission == 1 and obs.attempt == 0 and not obs.foreign


# ---------------------------------------------------------------- node-lost (first)


@host_only
async def test_node_lost(cluster: SlurmEnv, jobs: Tracker) -> None:
    """A --no-requeue job on a node set DOWN ends NODE_FAIL: ended / node-lost."""
    adapter = make_adapter(cluster, local_runner_for(cluster))
    job_id = jobs.new()
    ref = await adapter.start(request_for(job_id, ["sleep", "300"]))
    await wait_obs(lambda: adapter.inspect(ref), lambda o: o.state is State.RUNNING,
                   what="running")
    try:
        as_root("scontrol", "update", f"NodeName={cluster.node}", "State=DOWN",
                "Reason=dispatch-adapter-test")
        obs = await wait_obs(lambda: adapter.inspect(ref), lambda o: o.state is State.ENDED,
                             what="ended", interval=0.3)
    finally:
        as_root("scontrol", "update", f"NodeName={cluster.node}", "State=RESUME",
                check=False)
        await asyncio.to_thread(wait_node_ready)
    assert obs.cause.kind is CauseKind.NODE_LOST, obs
    assert obs.cause.provenance is Provenance.SLURM
    assert obs.nodes == (cluster.node,) and obs.exit_code is None
    assert obs.source is Source.LIVE and obs.restart_count == 0
    _identity_ok(obs, ref)
    found = await only(adapter, job_id)
    assert found is not None and found.cause.kind is CauseKind.NODE_LOST


# ---------------------------------------------------------------- the one-minute job


@pytest.fixture(scope="module")
def timeout_job(cluster: SlurmEnv) -> Iterator[tuple[ObjectRef, float]]:
    """A ``--time=1`` job started once for the module (asserted by the last test)."""
    tracker = Tracker(cluster.submit_user, cluster.series)
    job_id = tracker.new()

    async def start() -> ObjectRef:
        runner = local_runner_for(cluster)
        try:
            adapter = make_adapter(cluster, runner)
            return await adapter.start(request_for(job_id, ["sleep", "300"], time_limit_s=60))
        finally:
            await runner.close()

    ref = run_in_thread(start)
    yield ref, time.monotonic()
    tracker.cancel_all()


@host_only
async def test_time_limited_job_runs(cluster: SlurmEnv,
                                     timeout_job: tuple[ObjectRef, float]) -> None:
    adapter = make_adapter(cluster, local_runner_for(cluster))
    ref, _ = timeout_job
    obs = await wait_obs(lambda: adapter.inspect(ref), lambda o: o.state is State.RUNNING,
                         what="running")
    assert obs.time_limit_s == 60 and obs.cause.kind is CauseKind.NONE
    assert obs.nodes == (cluster.node,) and obs.start is not None and obs.end is None


# ---------------------------------------------------------------- both transports


@matrix
async def test_gated_held_released_running_cancelled(adapter: SlurmAdapter,
                                                     cluster: SlurmEnv, jobs: Tracker) -> None:
    """gated → gated + dispatch hold → held (gate opened, hold kept) → released →
    running → stopped: ended / cancelled by the user."""
    job_id = jobs.new()
    ref = await adapter.start(request_for(job_id, ["sleep", "300"], gate=True))
    obs = await only(adapter, job_id)
    assert obs is not None
    assert (obs.state, obs.cause.kind) == (State.GATED, CauseKind.NONE)
    assert obs.hold_instance is None and obs.restart_count == 0 and obs.nodes == ()
    assert obs.reason == "JobHeldUser" and obs.submit == ref.submit
    _identity_ok(obs, ref)

    await adapter.hold(ref, 4242)
    obs = await only(adapter, job_id)
    assert obs is not None and obs.state is State.GATED and obs.hold_instance == 4242
    assert obs.eligible == ref.submit + HOLD_BASE + 4242

    # open only the gate, as the user: the dispatch hold keeps it from starting
    as_user(cluster.submit_user, "scontrol", "release", str(ref.id))
    obs = await wait_obs(lambda: adapter.inspect(ref), lambda o: o.state is not State.GATED,
                         what="gate open")
    assert (obs.state, obs.cause.kind, obs.cause.provenance) == (
        State.HELD, CauseKind.NONE, Provenance.DISPATCH), obs
    assert obs.hold_instance == 4242

    await adapter.release(ref)
    obs = await wait_obs(lambda: adapter.inspect(ref), lambda o: o.state is State.RUNNING,
                         what="running", timeout=40)
    assert obs.hold_instance is None and obs.nodes == (cluster.node,)
    assert obs.start is not None and obs.start >= ref.submit
    await adapter.release(ref)  # idempotent on a running job

    await adapter.stop(ref)  # returns once the job ends (CANCELLED, or still COMPLETING)
    obs = await ended(adapter, ref)
    assert (obs.state, obs.cause.kind, obs.cause.provenance) == (
        State.ENDED, CauseKind.CANCELLED, Provenance.USER), obs
    assert obs.exit_code is None and obs.end is not None


@host_only
async def test_pending_and_unrunnable(adapter: SlurmAdapter, cluster: SlurmEnv,
                                      jobs: Tracker) -> None:
    """Waiting on a begin time is pending / none; a request the partition can never
    satisfy (2 nodes of 1) is pending / unrunnable with the reason as detail."""
    waiting = jobs.new()
    ref = await adapter.start(request_for(waiting, ["true"], gate=True))
    as_user(cluster.submit_user, "scontrol", "update", f"JobId={ref.id}",
            f"StartTime={utc_text(time.time() + 3600)}")
    await adapter.release(ref)
    obs = await wait_obs(lambda: adapter.inspect(ref), lambda o: o.reason == "BeginTime",
                         what="BeginTime", timeout=20)
    assert (obs.state, obs.cause.kind) == (State.PENDING, CauseKind.NONE), obs
    assert obs.hold_instance is None and obs.start is None
    _identity_ok(obs, ref)

    too_big = jobs.new()
    ref2 = await adapter.start(request_for(too_big, ["true"], nodes=2))
    obs = await wait_obs(lambda: adapter.inspect(ref2),
                         lambda o: o.cause.kind is CauseKind.UNRUNNABLE,
                         what="unrunnable", timeout=20)
    assert obs.state is State.PENDING and obs.cause.provenance is Provenance.SLURM
    assert obs.cause.detail in ("PartitionNodeLimit", "PartitionConfig")  # Slurm picks one


@matrix
async def test_ended_causes(adapter: SlurmAdapter, cluster: SlurmEnv, jobs: Tracker) -> None:
    """exit 0 → completed; exit 3 → non-zero-exit with exit code 3; killed by SIGKILL →
    signaled (22.05 says FAILED/JobLaunchFailure with the signal in exit_code)."""
    commands = {
        "completed": ["true"],
        "exit3": ["sh", "-c", "exit 3"],
        "killed": ["sh", "-c", "kill -9 $$"],
    }
    ids = {key: jobs.new() for key in commands}
    refs = dict(zip(commands, await asyncio.gather(*(
        adapter.start(request_for(ids[key], command)) for key, command in commands.items())),
        strict=True))

    async def ended(key: str) -> ObjectObs:
        return await wait_obs(lambda: adapter.inspect(refs[key]),
                              lambda o: o.state is State.ENDED, what=f"{key} ended",
                              timeout=40)

    done = dict(zip(commands, await asyncio.gather(*(ended(k) for k in commands)),
                    strict=True))
    assert done["completed"].cause.kind is CauseKind.COMPLETED
    assert done["completed"].exit_code is None
    assert done["exit3"].cause.kind is CauseKind.NON_ZERO_EXIT
    assert done["exit3"].exit_code == 3
    assert done["killed"].cause.kind is CauseKind.SIGNALED, done["killed"]
    assert done["killed"].cause.detail == "signal 9"
    for key, obs in done.items():
        _identity_ok(obs, refs[key])
        assert obs.nodes == (cluster.node,) and obs.end is not None and obs.start is not None
        assert obs.cause.provenance is Provenance.SLURM
    # find_many sees the three in one read
    found = await adapter.find_many(list(ids.values()))
    assert {key: [o.cause.kind for o in found[ids[key]]] for key in ids} == {
        key: [done[key].cause.kind] for key in ids}


# ---------------------------------------------------------------- admin and requeue


@host_only
async def test_admin_hold(cluster: SlurmEnv, jobs: Tracker) -> None:
    """scontrol hold by root: held / admin-hold (admin); release does not touch it."""
    adapter = make_adapter(cluster, local_runner_for(cluster))
    job_id = jobs.new()
    ref = await adapter.start(request_for(job_id, ["true"], gate=True))
    as_root("scontrol", "hold", str(ref.id))
    obs = await adapter.inspect(ref)
    assert (obs.state, obs.cause.kind, obs.cause.provenance) == (
        State.HELD, CauseKind.ADMIN_HOLD, Provenance.ADMIN), obs
    await adapter.release(ref)
    assert (await adapter.inspect(ref)).cause.kind is CauseKind.ADMIN_HOLD


@host_only
async def test_suspended_by_admin(cluster: SlurmEnv, jobs: Tracker) -> None:
    """scontrol suspend by root: suspended / none; resumed: running again."""
    adapter = make_adapter(cluster, local_runner_for(cluster))
    ref = await adapter.start(request_for(jobs.new(), ["sleep", "300"]))
    await wait_obs(lambda: adapter.inspect(ref), lambda o: o.state is State.RUNNING,
                   what="running")
    as_root("scontrol", "suspend", str(ref.id))
    obs = await adapter.inspect(ref)
    assert (obs.state, obs.cause.kind) == (State.SUSPENDED, CauseKind.NONE), obs
    assert obs.nodes == (cluster.node,)
    as_root("scontrol", "resume", str(ref.id))
    assert (await adapter.inspect(ref)).state is State.RUNNING
    await adapter.stop(ref)
    assert (await ended(adapter, ref)).cause.kind is CauseKind.CANCELLED


@matrix
async def test_requeued_by_admin(cluster: SlurmEnv, jobs: Tracker) -> None:
    """An opted-in --requeue job requeued by root: pending / requeued, restart count 1,
    submit time moved forward; the ref still passes the identity check; after
    StartTime=now it runs again as the same object.

    The requeue waits for the script to run: a requeue in the moment between squeue's R
    and slurmd's launch left the job's next launch failing at once (exit 1, no output)."""
    adapter = make_adapter(cluster, local_runner_for(cluster))
    job_id = jobs.new()
    marker = f"/tmp/dispatch-test-requeue-{job_id}"  # the job's workdir is /tmp
    script = f'echo "${{SLURM_RESTART_COUNT:-0}}" >> {marker}; exec sleep 300'
    ref = await adapter.start(request_for(job_id, ["sh", "-c", script], requeue=True))
    try:
        await _requeued_and_run_again(adapter, ref, job_id, marker)
    finally:
        as_root("rm", "-f", marker, check=False)


async def _requeued_and_run_again(adapter: SlurmAdapter, ref: ObjectRef, job_id: JobID,
                                  marker: str) -> None:
    await wait_obs(lambda: adapter.inspect(ref), lambda o: o.state is State.RUNNING,
                   what="running")
    assert await script_runs(marker, 1) == ["0"]
    as_root("scontrol", "requeue", str(ref.id))
    obs = await wait_obs(lambda: adapter.inspect(ref),
                         lambda o: o.state is State.PENDING and o.restart_count == 1,
                         what="requeued pending", timeout=20)
    assert (obs.cause.kind, obs.cause.provenance) == (CauseKind.REQUEUED, Provenance.SLURM)
    assert obs.submit is not None and obs.submit > ref.submit
    assert obs.ref.submit == obs.submit and obs.hold_instance is None
    _identity_ok(obs, ref)
    found = await only(adapter, job_id)
    assert found is not None and found.restart_count == 1

    as_root("scontrol", "update", f"JobId={ref.id}", "StartTime=now")
    obs = await wait_obs(lambda: adapter.inspect(ref), lambda o: o.state is State.RUNNING,
                         what="running again", timeout=30)
    assert obs.restart_count == 1 and obs.cause.kind is CauseKind.NONE
    assert await script_runs(marker, 2) == ["0", "1"]

    await adapter.stop(ref)  # identity holds after the requeue
    obs = await ended(adapter, ref)
    assert (obs.state, obs.cause.kind) == (State.ENDED, CauseKind.CANCELLED)


@host_only
async def test_requeue_held_by_admin(cluster: SlurmEnv, jobs: Tracker) -> None:
    """scontrol requeuehold: held / requeued (JobHeldUser after a restart, not the gate);
    release leaves Slurm's own hold alone."""
    adapter = make_adapter(cluster, local_runner_for(cluster))
    job_id = jobs.new()
    ref = await adapter.start(request_for(job_id, ["sleep", "300"], requeue=True))
    await wait_obs(lambda: adapter.inspect(ref), lambda o: o.state is State.RUNNING,
                   what="running")
    as_root("scontrol", "requeuehold", str(ref.id))
    obs = await wait_obs(lambda: adapter.inspect(ref), lambda o: o.state is State.HELD,
                         what="requeue-held", timeout=20)
    assert (obs.cause.kind, obs.cause.provenance) == (CauseKind.REQUEUED, Provenance.SLURM)
    assert obs.cause.detail == "job requeued in held state" and obs.restart_count == 1
    await adapter.release(ref)
    assert (await adapter.inspect(ref)).state is State.HELD
    await adapter.stop(ref)
    assert (await ended(adapter, ref)).cause.kind is CauseKind.CANCELLED


@matrix
async def test_requeue_through_the_adapter(cluster: SlurmEnv, jobs: Tracker) -> None:
    """requeue(): pending → ErrConflict; --no-requeue → ErrUnsupported; an opted-in
    running job is requeued (restart count 1)."""
    adapter = make_adapter(cluster, local_runner_for(cluster))
    gated, plain, opted = jobs.new(), jobs.new(), jobs.new()
    gated_ref, plain_ref, opted_ref = await asyncio.gather(
        adapter.start(request_for(gated, ["true"], gate=True, requeue=True)),
        adapter.start(request_for(plain, ["sleep", "300"])),
        adapter.start(request_for(opted, ["sleep", "300"], requeue=True)))
    with pytest.raises(ErrConflict, match="pending"):
        await adapter.requeue(gated_ref)
    for ref in (plain_ref, opted_ref):
        await wait_obs(functools.partial(adapter.inspect, ref),
                       lambda o: o.state is State.RUNNING, what="running")
    with pytest.raises(ErrUnsupported, match="disabled"):
        await adapter.requeue(plain_ref)
    await adapter.requeue(opted_ref)
    obs = await wait_obs(lambda: adapter.inspect(opted_ref),
                         lambda o: o.restart_count == 1 and o.state is State.PENDING,
                         what="requeued", timeout=20)
    assert obs.cause.kind is CauseKind.REQUEUED


# ---------------------------------------------------------------- accounting


@matrix
async def test_accounting_after_leaving_squeue(cluster: SlurmEnv, jobs: Tracker) -> None:
    """Once slurmctld forgets a job (MinJobAge), inspect reads sacct: completed,
    non-zero exit 3, cancelled by the user, cancelled by an admin; inspect_many answers
    for all of them with one sacct call."""
    calls: list[str] = []
    adapter = make_adapter(cluster, local_runner_for(
        cluster, observer=lambda name, _s, _ok: calls.append(name)))
    ids = {key: jobs.new() for key in ("completed", "exit3", "user-cancel", "admin-cancel")}
    refs = {
        "completed": await adapter.start(request_for(ids["completed"], ["true"])),
        "exit3": await adapter.start(request_for(ids["exit3"], ["sh", "-c", "exit 3"])),
        "user-cancel": await adapter.start(request_for(ids["user-cancel"], ["sleep", "300"])),
        "admin-cancel": await adapter.start(request_for(ids["admin-cancel"],
                                                        ["sleep", "300"])),
    }
    for key in ("user-cancel", "admin-cancel"):
        await wait_obs(functools.partial(adapter.inspect, refs[key]),
                       lambda o: o.state is State.RUNNING, what="running")
    await adapter.stop(refs["user-cancel"])
    as_root("scancel", str(refs["admin-cancel"].id))
    for ref in refs.values():
        await wait_gone_from_squeue(ref)

    async def accounted(key: str) -> ObjectObs:
        return await wait_obs(lambda: adapter.inspect(refs[key]),
                              lambda o: o.source is Source.ACCOUNTING,
                              what=f"{key} in sacct", timeout=30)

    seen = {key: await accounted(key) for key in refs}
    assert seen["completed"].cause.kind is CauseKind.COMPLETED
    assert seen["exit3"].cause.kind is CauseKind.NON_ZERO_EXIT
    assert seen["exit3"].exit_code == 3
    assert (seen["user-cancel"].cause.kind, seen["user-cancel"].cause.provenance) == (
        CauseKind.CANCELLED, Provenance.USER)
    # the lab's administrator is root, whose cancels read as Slurm's own in accounting
    # ("CANCELLED by 0" on every version: classify's issue-9 rule): lost, by Slurm
    assert (seen["admin-cancel"].cause.kind, seen["admin-cancel"].cause.provenance) == (
        CauseKind.LOST, Provenance.SLURM), seen["admin-cancel"]
    for key, obs in seen.items():
        assert obs.state is State.ENDED and obs.ref == refs[key]
        assert obs.submission == 1 and obs.attempt == 0 and not obs.foreign  # job_comment
        assert obs.restart_count is None and obs.hold_instance is None and not obs.requeued
        assert obs.nodes == (cluster.node,)

    # gone from squeue: find_many sees nothing; inspect_many answers in one sacct call
    assert all(not v for v in (await adapter.find_many(list(ids.values()))).values())
    calls.clear()
    many = await adapter.inspect_many(list(refs.values()),
                                      since=min(r.submit for r in refs.values()) - 60)
    assert calls == ["sacct"]
    assert {ref: obs.cause for ref, obs in many.items()} == {
        refs[key]: seen[key].cause for key in refs}

    # slurmdbd down: transient, never "not found"; once Preflight knows, unsupported
    ref = refs["completed"]
    slurm_ctl("stop", "slurmdbd")
    try:
        with pytest.raises(TransientError, match="database"):
            await adapter.inspect_many([ref], since=ref.submit - 60)
        with pytest.raises(TransientError):
            await adapter.inspect(ref)
        # a transient failure never turns accounting off (Preflight keeps what it knew)
        caps = await adapter.preflight()
        assert caps.accounting_history
        assert any("sacct does not answer for now" in w for w in caps.warnings)
        with pytest.raises(TransientError):
            await adapter.inspect_many([ref], since=ref.submit - 60)
        # a cluster whose Preflight found no accounting: unsupported, never guessed
        off = make_adapter(cluster, local_runner_for(cluster),
                           capabilities=dataclasses.replace(caps, accounting_history=False))
        with pytest.raises(ErrUnsupported):
            await off.inspect_many([ref], since=ref.submit - 60)
        with pytest.raises(ErrNotFound, match="accounting is off"):
            await off.inspect(ref)
    finally:
        slurm_ctl("start", "slurmdbd")
    assert (await adapter.preflight()).accounting_history
    assert (await adapter.inspect(ref)).cause.kind is CauseKind.COMPLETED


# ---------------------------------------------------------------- timeout (last)


@host_only
async def test_timeout(cluster: SlurmEnv, timeout_job: tuple[ObjectRef, float]) -> None:
    """The --time=1 job ends TIMEOUT after 60-75 s: ended / timeout."""
    adapter = make_adapter(cluster, local_runner_for(cluster))
    ref, started = timeout_job
    remaining = max(5.0, 110 - (time.monotonic() - started))
    obs = await wait_obs(lambda: adapter.inspect(ref), lambda o: o.state is State.ENDED,
                         what="timed out", timeout=remaining, interval=1)
    assert (obs.cause.kind, obs.cause.provenance) == (CauseKind.TIMEOUT, Provenance.SLURM), obs
    assert obs.exit_code is None and obs.end is not None and obs.start is not None
    assert 55 <= obs.end - obs.start <= 120
