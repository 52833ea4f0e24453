"""Identity (SPEC §2) under REAL job-id reuse: the module runs the cluster with
``MaxJobId=20`` and ``MinJobAge=5`` (ids wrap within seconds) and restores slurm-up's
defaults afterwards.

* a ref to a finished job whose id now belongs to a new job -- even the next submission
  of the same dispatch job, with the same name -- is never acted on: hold, release and
  requeue raise ErrNotFound, stop cancels nothing, the new job is untouched, and inspect
  reads the old job's own accounting record;
* a ``dj-`` job with a comment that is not ours is reported foreign and never written;
* another user's ``dj-<ULID>`` job with a valid comment is never returned;
* sbatch blocked by a full job table ("temporarily unable to accept job, sleeping and
  retrying") times out, and Start rediscovers instead of submitting again.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable, Iterator

import pytest

from controller.errors import ErrNotFound, TransientError
from controller.model.ids import new_job_id
from controller.model.obs import CauseKind, ObjectRef, Source, State
from controller.runner import Runner
from controller.slurm.adapter import SlurmAdapter, pick_record
from controller.slurm.dialects import parse_sacct_text, parse_text_time
from controller.slurm.naming import discovery_name
from controller.slurm.record import SlurmJob
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
    matrix_versions,
    request_for,
    squeue_rows,
    wait_gone_from_squeue,
    wait_obs,
)

MAX_JOB_ID = 20


@pytest.fixture(scope="module")
def cluster(slurm_version: str) -> Iterator[SlurmEnv]:
    env = cluster_up(min_job_age=5, max_job_id=MAX_JOB_ID, version=slurm_version)
    yield env
    cluster_up(version=slurm_version)  # slurm-up's defaults again


def _filler(user: str) -> int:
    out = as_user(user, "sbatch", "--parsable", "--job-name=dispatch-filler", "--wrap", "true")
    return int(out.stdout.strip().split(";")[0])


async def land_on(target: int, user: str,
                  start: Callable[[], Awaitable[ObjectRef]],
                  cancel: Callable[[ObjectRef], Awaitable[None]]) -> ObjectRef:
    """Cycle the ids with short filler jobs until ``start()`` lands on ``target``."""
    before = target - 1 if target > 1 else MAX_JOB_ID - 1
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline:
        got = await asyncio.to_thread(_filler, user)
        if got == before:
            ref = await start()
            if ref.id == target:
                return ref
            await cancel(ref)  # someone took the id first: go round again
        elif got == target:
            await asyncio.sleep(2)  # a filler took it; it is free again after MinJobAge
    raise AssertionError(f"job id {target} was not reused within 150 s")


@pytest.mark.slurm
@matrix
async def test_reused_id_is_never_acted_on(cluster: SlurmEnv, jobs: Tracker) -> None:
    adapter = make_adapter(cluster, local_runner_for(cluster))
    job_id = jobs.new()
    old = await adapter.start(request_for(job_id, ["true"]))
    await wait_obs(lambda: adapter.inspect(old), lambda o: o.state is State.ENDED,
                   what="first submission ended")
    await wait_gone_from_squeue(old)

    submission = 1

    async def next_submission() -> ObjectRef:
        nonlocal submission
        submission += 1
        return await adapter.start(request_for(job_id, ["true"], submission=submission,
                                               gate=True))

    new = await land_on(old.id, cluster.submit_user, next_submission, adapter.stop)
    # the same Slurm id AND the same name: only the submit time tells them apart
    assert (new.id, new.uid) == (old.id, old.uid) and new.submit > old.submit

    with pytest.raises(ErrNotFound):
        await adapter.hold(old, 7)
    with pytest.raises(ErrNotFound):
        await adapter.release(old)
    with pytest.raises(ErrNotFound):
        await adapter.requeue(old)
    await adapter.stop(old)  # cancels nothing
    wrong_submit = ObjectRef(old.cluster, old.uid, new.id, new.submit - 1)
    with pytest.raises(ErrNotFound):
        await adapter.hold(wrong_submit, 7)
    other_name = ObjectRef(old.cluster, discovery_name(new_job_id()), new.id, new.submit)
    with pytest.raises(ErrNotFound):
        await adapter.release(other_name)
    await adapter.stop(other_name)
    other_cluster = ObjectRef("elsewhere", new.uid, new.id, new.submit)
    with pytest.raises(ErrNotFound):
        await adapter.hold(other_cluster, 7)

    # the new job is untouched: still gated, no hold, not cancelled
    live = await adapter.inspect(new)
    assert (live.state, live.hold_instance, live.submission) == (State.GATED, None,
                                                                 submission)
    found = [o for o in await adapter.find(job_id) if o.ref.submit == new.submit]
    assert [(o.state, o.submission) for o in found] == [(State.GATED, submission)]

    # the old ref reads the old job's own accounting record, not the new job
    obs = await wait_obs(lambda: adapter.inspect(old),
                         lambda o: o.source is Source.ACCOUNTING, what="old record in sacct",
                         timeout=30)
    assert (obs.state, obs.cause.kind, obs.submission) == (State.ENDED, CauseKind.COMPLETED, 1)
    many = await adapter.inspect_many([old], since=old.submit - 60)
    assert many[old].cause.kind is CauseKind.COMPLETED and many[old].submission == 1

    await adapter.stop(new)
    assert (await wait_obs(lambda: adapter.inspect(new), lambda o: o.state is State.ENDED,
                           what="new ended")).cause.kind is CauseKind.CANCELLED


@pytest.mark.slurm
@pytest.mark.parametrize("slurm_version", [  # 24.11 is 22.05 here (no SLUID in squeue)
    pytest.param(v, marks=pytest.mark.skip(reason="as 22.05: covered there"))
    if v == "24.11" else v for v in matrix_versions()], indirect=True, scope="module")
async def test_a_stale_ref_never_touches_another_users_job_on_its_reused_id(
        cluster: SlurmEnv, jobs: Tracker) -> None:
    """Our job ended and left; another user's held job (same name, even) took its id.
    26.05: every write names a job by its SLUID, never reused: the low-level write with
    the stale SLUID -- as if the identity check were skipped -- is refused by Slurm and
    the other job is untouched. 22.05 (no SLUID): the identity check refuses each write."""
    adapter = make_adapter(cluster, local_runner_for(cluster))
    sluid_writes = adapter.capabilities is not None and adapter.capabilities.identity == "sluid"
    assert sluid_writes is (cluster.series == "26.05")
    job_id = jobs.new()
    old = await adapter.start(request_for(job_id, ["true"]))
    assert (old.sluid is not None) is sluid_writes
    await wait_obs(lambda: adapter.inspect(old), lambda o: o.state is State.ENDED,
                   what="ended")
    await wait_gone_from_squeue(old)

    async def start_theirs() -> ObjectRef:
        out = as_user(cluster.other_user, "sbatch", "--parsable", "--hold",
                      f"--job-name={old.uid}", "--comment=dispatch:s=1;a=0", "--wrap", "true")
        return ObjectRef(cluster.cluster, old.uid, int(out.stdout.strip().split(";")[0]), 0)

    async def cancel_theirs(ref: ObjectRef) -> None:
        as_root("scancel", str(ref.id), check=False)

    theirs = await land_on(old.id, cluster.other_user, start_theirs, cancel_theirs)
    fields = "JobID:|,UserName:|,Name:|,State:|,Reason:|,StartTime:|,EligibleTime:|"

    def their_row() -> str:
        return as_root("squeue", "-h", "-j", str(theirs.id), "-O", fields).stdout.strip()

    before = their_row()
    assert before.startswith(f"{theirs.id}|{cluster.other_user}|{old.uid}|PENDING|")
    try:
        if sluid_writes:
            assert old.sluid is not None
            begin = old.submit + 10 * 365 * 86400
            for operation in ("hold", "start-now", "release", "requeue", "cancel"):
                result = await adapter._write(operation, old.sluid, uid=old.uid, begin=begin)
                # scontrol refuses the unknown SLUID; scancel (26.05.5) exits 0 silently
                assert operation == "cancel" or not result.ok, (operation, result)
                assert their_row() == before, operation
        for write in (lambda: adapter.hold(old, 7), lambda: adapter.release(old),
                      lambda: adapter.requeue(old)):
            with pytest.raises(ErrNotFound):
                await write()
        await adapter.stop(old)  # cancels nothing
        assert their_row() == before
    finally:
        as_root("scancel", str(theirs.id), check=False)


@pytest.mark.slurm
@host_only
@pytest.mark.parametrize("comment", [
    pytest.param("dispatch:s=01;a=0", id="leading-zero"),
    pytest.param("someone else's", id="other"),
    pytest.param(None, id="none"),
])
async def test_foreign_comment_is_reported_and_never_written(
        adapter: SlurmAdapter, cluster: SlurmEnv, jobs: Tracker, comment: str | None) -> None:
    job_id = jobs.new()
    name = discovery_name(job_id)
    argv = ["sbatch", "--parsable", "--hold", f"--job-name={name}", "--wrap", "true"]
    if comment is not None:
        argv.insert(2, f"--comment={comment}")
    slurm_id = int(as_user(cluster.submit_user, *argv).stdout.strip())

    [obs] = (await adapter.find_many([job_id]))[job_id]
    assert obs.foreign and obs.ref.id == slurm_id
    assert (obs.submission, obs.attempt) == (None, None)
    assert obs.state is State.GATED  # reported with its state, never dropped
    ref = obs.ref
    with pytest.raises(ErrNotFound, match="foreign"):
        await adapter.hold(ref, 9)
    with pytest.raises(ErrNotFound):
        await adapter.release(ref)
    with pytest.raises(ErrNotFound):
        await adapter.requeue(ref)
    await adapter.stop(ref)
    assert squeue_rows(cluster.submit_user, name) == [f"{slurm_id}|{name}|PENDING"]
    assert (await adapter.inspect(ref)).foreign  # read, yes


@pytest.mark.slurm
@matrix
async def test_other_users_jobs_are_never_returned(adapter: SlurmAdapter, cluster: SlurmEnv,
                                                   jobs: Tracker) -> None:
    job_id = jobs.new()
    name = discovery_name(job_id)
    ours = await adapter.start(request_for(job_id, ["true"], gate=True))
    theirs = int(as_user(cluster.other_user, "sbatch", "--parsable", "--hold",
                         f"--job-name={name}", "--comment=dispatch:s=1;a=0", "--wrap",
                         "true").stdout.strip())
    other_only = jobs.new()
    as_user(cluster.other_user, "sbatch", "--parsable", "--hold",
            f"--job-name={discovery_name(other_only)}", "--comment=dispatch:s=1;a=0",
            "--wrap", "true")

    found = await adapter.find_many([job_id, other_only])
    assert [o.ref for o in found[job_id]] == [ours]
    assert not found[other_only]

    submit = parse_text_time(as_root("squeue", "-h", "-j", str(theirs), "-o", "%V").stdout.strip())
    assert submit is not None
    theirs_ref = ObjectRef(cluster.cluster, name, theirs, submit)
    with pytest.raises(ErrNotFound):
        await adapter.inspect(theirs_ref)
    with pytest.raises(ErrNotFound):
        await adapter.hold(theirs_ref, 3)
    await adapter.stop(theirs_ref)
    assert squeue_rows(cluster.other_user, name) == [f"{theirs}|{name}|PENDING"]


@pytest.mark.slurm
@host_only
async def test_sbatch_blocked_by_a_full_job_table_is_rediscovered_not_resubmitted(
        cluster: SlurmEnv, jobs: Tracker) -> None:
    """With MaxJobId=20 slurmctld holds at most 19 jobs; sbatch then sleeps and retries
    ("temporarily unable to accept job"). Start times out, kills sbatch, looks for the
    job by name instead of submitting again, finds none: TransientError."""
    # slurmctld forgets ended jobs within seconds (MinJobAge=5); wait for that, so the
    # table is full only of held jobs and stays full
    deadline = time.monotonic() + 60
    while True:
        states = as_root("squeue", "-h", "-a", "--states=all", "-o", "%T").stdout.split()
        if all(state == "PENDING" for state in states) or time.monotonic() > deadline:
            break
        await asyncio.sleep(1)

    def occupy(limit: int) -> bool:
        """One held job; False when sbatch is still retrying after ``limit`` seconds."""
        out = as_user(cluster.submit_user, "timeout", str(limit), "sbatch", "--parsable",
                      "--hold", "--job-name=dispatch-occupy", "--wrap", "true", check=False)
        return out.returncode == 0

    try:
        for _ in range(MAX_JOB_ID - 1 - len(states)):
            assert occupy(20)
        for _ in range(10):
            if not occupy(4):
                break  # full: sbatch sleeps and retries
        else:
            pytest.fail("the job table never filled up")

        calls: list[str] = []
        runner: Runner = local_runner_for(cluster, observer=lambda n, _d, _ok: calls.append(n))
        adapter = make_adapter(cluster, runner, command_timeout=5)
        job_id = jobs.new()
        with pytest.raises(TransientError, match="outcome unknown"):
            await adapter.start(request_for(job_id, ["true"]))
        assert calls.count("sh") == 1  # the Start script ran once; never again
        assert squeue_rows(cluster.submit_user, discovery_name(job_id)) == []
    finally:
        as_root("scancel", "-u", cluster.submit_user, "--name=dispatch-occupy", check=False)
    await asyncio.sleep(3)  # a killed sbatch cannot land late
    assert squeue_rows(cluster.submit_user, discovery_name(job_id)) == []


# ---------------------------------------------------------------- pure: pick_record

T0 = 1_796_000_000
UID = "dj-01JZ8Q2N5V0000000000000042"


def _record(state: str, submit: int, comment: str | None, *, name: str = UID,
            user: str = "dispatch") -> SlurmJob:
    return SlurmJob(job_id=7, name=name, user=user, base_state=state, flags=(), reason="",
                    description="", comment=comment, submit_time=submit, eligible_time=submit,
                    start_time=submit + 1, end_time=submit + 2, preempt_time=None,
                    restart_count=None, nodes=("vm",), return_code=0, signal=None,
                    time_limit_s=None, requeue=None, cluster="lab")


REF = ObjectRef("lab", UID, 7, T0)


@pytest.mark.parametrize(("records", "before", "expected"), [
    pytest.param([_record("COMPLETED", T0, "dispatch:s=1;a=0")], None, 0, id="one"),
    pytest.param([_record("COMPLETED", T0 + 200, "dispatch:s=1;a=0"),
                  _record("REQUEUED", T0, "dispatch:s=1;a=0")], None, 0,
                 id="requeued-then-completed"),
    pytest.param([_record("COMPLETED", T0 + 200, "dispatch:s=1;a=0"),
                  dataclasses.replace(_record("", T0, "dispatch:s=1;a=0"),
                                      flags=("REQUEUED",))], None, 0,
                 id="text-requeued-flag-then-completed"),
    pytest.param([_record("COMPLETED", T0, "dispatch:s=1;a=0"),
                  _record("PENDING", T0 + 50, None)], None, 0, id="reused-same-name-pending"),
    pytest.param([_record("NODE_FAIL", T0, "dispatch:s=1;a=0"),
                  _record("COMPLETED", T0 + 50, "dispatch:s=2;a=0")], None, 0,
                 id="reused-same-name-after-node-fail"),
    pytest.param([_record("REQUEUED", T0, "dispatch:s=1;a=0"),
                  _record("PENDING", T0 + 50, None)], T0 + 50, 0, id="cut-at-live-job"),
    pytest.param([_record("COMPLETED", T0 + 5, "dispatch:s=1;a=0")], None, None,
                 id="no-record-at-submit"),
    pytest.param([_record("COMPLETED", T0, "dispatch:s=1;a=0", user="dispatch-other")], None,
                 None, id="other-user"),
    pytest.param([_record("COMPLETED", T0, "dispatch:s=1;a=0", name="dj-other")], None, None,
                 id="other-name"),
])
def test_pick_record(records: list[SlurmJob], before: int | None,
                     expected: int | None) -> None:
    picked = pick_record(REF, records, user="dispatch", before=before)
    assert picked is (None if expected is None else records[expected])


# ``sacct -X -D -P -n -o <SACCT_TEXT_FIELDS>`` of a job that ``scontrol requeue`` requeued
# and that then completed, as recorded (captures-<version>/requeued-finished.sacct-P-product.txt
# in the shared research notes)
REQUEUED_FINISHED = {
    "24.11": (
        "24|dj-01M8QP3FSYGQD2A4C8FFBRV8RM|dispatch|1001|REQUEUED|None|2026-12-01T02:14:26|"
        "2026-12-01T02:14:27|2026-12-01T02:14:27|2026-12-01T02:14:51|0:0|vm|UNLIMITED|"
        "trixie|dispatch:s=1;a=0\n"
        "24|dj-01M8QP3FSYGQD2A4C8FFBRV8RM|dispatch|1001|COMPLETED|BeginTime|"
        "2026-12-01T02:14:51|2026-12-01T02:16:52|2026-12-01T02:16:54|2026-12-01T02:17:54|0:0|"
        "vm|365-00:00:00|trixie|dispatch:s=1;a=0\n"),
    "26.05": (
        "36|dj-01M8QP3FS0DKAXCYEKV9P1B5TE|dispatch|1001|REQUEUED|None|2026-12-01T02:14:26|"
        "2026-12-01T02:14:26|2026-12-01T02:14:27|2026-12-01T02:14:50|0:0|vm|UNLIMITED|forky|"
        "dispatch:s=1;a=0\n"
        "36|dj-01M8QP3FS0DKAXCYEKV9P1B5TE|dispatch|1001|COMPLETED|BeginTime|"
        "2026-12-01T02:14:50|2026-12-01T02:16:51|2026-12-01T02:17:35|2026-12-01T02:18:35|0:0|"
        "vm|UNLIMITED|forky|dispatch:s=1;a=0\n"),
}


@pytest.mark.parametrize("version", sorted(REQUEUED_FINISHED))
def test_pick_record_follows_recorded_text_requeue(version: str) -> None:
    """Text sacct prints the requeued record's state as the one word REQUEUED (a flag in
    place of the base state); the chain goes on to the record that completed."""
    requeued, completed = parse_sacct_text(REQUEUED_FINISHED[version])
    assert (requeued.base_state, requeued.flags) == ("", ("REQUEUED",))
    assert requeued.submit_time is not None
    ref = ObjectRef("lab", requeued.name, requeued.job_id, requeued.submit_time)
    assert pick_record(ref, [completed, requeued], user="dispatch") is completed
