"""Joined identity reads and writes (issue 13): concurrent Releases and Stops share one
``squeue --me -j`` and one ``scontrol release`` / ``scancel``, and each job is still
identity-checked: a ref whose id another user's job holds now is in the list read, fails
its check, and is left out of the write -- the N-1 of ours are written, nothing else.

``Coalescer`` is tested alone (pure asyncio); the rest on the REAL clusters of the
version matrix (numeric ids on 22.05 and 24.11, SLUIDs on 26.05)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import pytest

from controller.coalesce import Coalescer
from controller.errors import ErrNotFound
from controller.model.obs import ObjectRef, State
from controller.runner import CommandResult, Runner
from tests.slurm_fixtures import *  # noqa: F403
from tests.slurm_fixtures import (
    SlurmEnv,
    Tracker,
    as_root,
    as_user,
    make_adapter,
    matrix,
    request_for,
    runner_for,
    wait_obs,
)

# ---------------------------------------------------------------- Coalescer (pure)


async def test_concurrent_calls_share_one_run_each_with_its_own_answer() -> None:
    runs: list[list[int]] = []

    async def run(keys: Sequence[int]) -> Mapping[int, str | BaseException]:
        runs.append(list(keys))
        await asyncio.sleep(0)
        return {k: (ValueError(f"bad {k}") if k == 3 else f"v{k}") for k in keys}

    joined: Coalescer[int, str] = Coalescer(run, limit=4, parallel=1)
    results = await asyncio.gather(*(joined.call(k) for k in (1, 2, 3, 2, 5, 6)),
                                   return_exceptions=True)
    assert [str(r) for r in results] == ["v1", "v2", "bad 3", "v2", "v5", "v6"]
    assert runs == [[1, 2, 3, 5], [6]]  # a key asked twice runs once; at most `limit`


async def test_a_failed_run_fails_each_caller_and_the_next_batch_still_runs() -> None:
    calls = 0

    async def run(keys: Sequence[int]) -> Mapping[int, int | BaseException]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ConnectionError("dropped")
        return {k: k * 10 for k in keys}

    joined: Coalescer[int, int] = Coalescer(run, limit=2, parallel=1)
    first = await asyncio.gather(joined.call(1), joined.call(2), joined.call(3),
                                 return_exceptions=True)
    assert [type(r) for r in first[:2]] == [ConnectionError, ConnectionError]
    assert first[2] == 30
    assert await joined.call(4) == 40


async def test_a_key_the_run_forgot_is_an_error_not_a_hang() -> None:
    async def run(keys: Sequence[int]) -> Mapping[int, int | BaseException]:
        return {}

    joined: Coalescer[int, int] = Coalescer(run, limit=8)
    with pytest.raises(RuntimeError, match="no answer"):
        await asyncio.wait_for(joined.call(1), 5)


# ---------------------------------------------------------------- real Slurm


class Recording:
    """A runner that notes the argv of every command it runs."""

    def __init__(self, inner: Runner) -> None:
        self.inner = inner
        self.argvs: list[tuple[str, ...]] = []

    async def run(self, argv: Sequence[str], **kwargs: Any) -> CommandResult:
        self.argvs.append(tuple(argv))
        return await self.inner.run(argv, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def commands(self, program: str, *first: str) -> list[tuple[str, ...]]:
        n = len(first)
        return [a for a in self.argvs if a[0] == program and a[1:1 + n] == first]


N = 4


@pytest.fixture
async def recorded(slurm: SlurmEnv) -> AsyncIterator[tuple[Recording, Any]]:
    """An adapter of the version's cluster whose commands are noted (``Recording``)."""
    runner = Recording(runner_for(slurm))
    try:
        yield runner, make_adapter(slurm, runner)  # type: ignore[arg-type]
    finally:
        await runner.close()


async def _ours_and_a_reused_id(slurm: SlurmEnv, jobs: Tracker, adapter: Any
                                ) -> tuple[list[ObjectRef], ObjectRef, str]:
    """N gated jobs of ours, and a ref of ours whose id another user's held job (named
    like ours, with a comment like ours) holds now: what a stale ref meets after id
    reuse. Returns the refs, the stale ref and the other job's id."""
    refs = list(await asyncio.gather(*(
        adapter.start(request_for(jobs.new(), ["true"], gate=True)) for _ in range(N))))
    name = refs[0].uid
    out = as_user(slurm.other_user, "sbatch", "--parsable", "--hold", f"--job-name={name}",
                  "--comment=dispatch:s=1;a=0", "--wrap", "true")
    theirs = out.stdout.strip().split(";")[0]
    stale = ObjectRef(slurm.cluster, name, int(theirs), refs[0].submit - 1, sluid=None)
    return refs, stale, theirs


def _their_row(theirs: str) -> str:
    return as_root("squeue", "-h", "-j", theirs, "-O",
                   "JobID:|,UserName:|,State:|,Reason:|").stdout.strip()


@pytest.mark.slurm
@matrix
async def test_joined_release_writes_ours_and_nothing_else(slurm: SlurmEnv,
                                                           jobs: Tracker,
        recorded: tuple[Recording, Any]) -> None:
    runner, adapter = recorded
    try:
        refs, stale, theirs = await _ours_and_a_reused_id(slurm, jobs, adapter)
        before = _their_row(theirs)
        assert "|PENDING|" in before
        runner.argvs.clear()
        results = await asyncio.gather(*(adapter.release(r) for r in [*refs, stale]),
                                       return_exceptions=True)
        assert results[:N] == [None] * N
        assert isinstance(results[N], ErrNotFound)  # its identity check failed
        # one identity read for all five, one release naming exactly our four
        reads = runner.commands("squeue", "-h", "--me")
        assert len(reads) == 1 and len(runner.commands("squeue")) == 1, runner.argvs
        releases = runner.commands("scontrol", "release")
        assert len(releases) == 1, runner.argvs
        named = set(releases[0][2].split(","))
        assert len(named) == N and theirs not in named
        for ref in refs:
            await wait_obs(lambda r=ref: adapter.inspect(r),
                           lambda o: o.state is not State.GATED, what="released")
        assert _their_row(theirs) == before  # still held: never written
    finally:
        as_root("scancel", theirs, check=False)


@pytest.mark.slurm
@matrix
async def test_joined_stop_cancels_ours_and_nothing_else(slurm: SlurmEnv,
                                                         jobs: Tracker,
        recorded: tuple[Recording, Any]) -> None:
    runner, adapter = recorded
    try:
        refs, stale, theirs = await _ours_and_a_reused_id(slurm, jobs, adapter)
        before = _their_row(theirs)
        runner.argvs.clear()
        await asyncio.gather(*(adapter.stop(r) for r in [*refs, stale]))
        cancels = runner.commands("scancel")
        assert len(cancels) == 1, runner.argvs
        assert theirs not in cancels[0] and len(cancels[0]) >= N + 1
        for ref in refs:
            obs = await adapter.inspect(ref)
            assert obs.state is State.ENDED, obs
        assert _their_row(theirs) == before
    finally:
        as_root("scancel", theirs, check=False)


@pytest.mark.slurm
@matrix
async def test_a_failed_joined_release_checks_each_again(slurm: SlurmEnv,
                                                         jobs: Tracker,
        recorded: tuple[Recording, Any]) -> None:
    """A job of the list is purged between its identity read and the joined release (here
    an id slurmctld does not know is added to the list), and the command fails. Which job
    failed is not read from the text: each is checked again and written alone only if it
    is still held. 22.05 and 24.11 release the others and exit 1 ("Invalid job id
    specified"): nothing is written again. 26.05 refuses a SLUID list with an unknown
    SLUID whole (tried on 26.05.5): each of ours is then released alone. Every call
    succeeds either way, and no job is written after it was released."""
    runner, adapter = recorded
    refs = list(await asyncio.gather(*(
        adapter.start(request_for(jobs.new(), ["true"], gate=True)) for _ in range(N))))
    write_many = adapter._write_many
    sluids = refs[0].sluid is not None and adapter.capabilities is not None and \
        adapter.capabilities.identity == "sluid"
    purged = "s0000000000ZZ" if sluids else "999999"

    async def with_a_purged_job(operation: str, targets: Sequence[str]) -> CommandResult:
        return await write_many(operation, [*targets, purged])

    adapter._write_many = with_a_purged_job  # type: ignore[method-assign]
    runner.argvs.clear()
    results = await asyncio.gather(*(adapter.release(r) for r in refs),
                                   return_exceptions=True)
    assert results == [None] * N, results
    joined, *alone = runner.commands("scontrol", "release")
    assert purged in joined[2].split(",")
    assert len(runner.commands("squeue", "-h", "--me")) == 2  # checked, checked again
    named = [argv[2] for argv in alone]
    assert len(named) == len(set(named)) and purged not in named
    assert len(named) == (N if sluids else 0), runner.argvs
    for ref in refs:
        await wait_obs(lambda r=ref: adapter.inspect(r),
                       lambda o: o.state is not State.GATED, what="released")
