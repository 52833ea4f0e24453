"""Batched Start (issue 9): submit-limit refusals are back-pressure per request, and a batch
of big Start scripts is sent in pieces, never refused for its total size.

The unit tests run the REAL batch shell script (``batch_script``) under ``/bin/sh`` with a
stub ``sbatch`` and ``squeue`` first on PATH (so the shell protocol, the here-documents
and the per-script exit statuses are real); the real-Slurm test submits big scripts to
the local cluster.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from controller.errors import ErrBackPressure, ErrInvalid, TransientError
from controller.model.ids import new_job_id
from controller.model.obs import ObjectRef, StartRequest
from controller.runner import CommandResult, LocalRunner
from controller.runner.local import DEFAULT_PATH
from controller.slurm.adapter import START_BATCH_BYTES, SlurmAdapter, slurm_failure
from controller.slurm.script import MAX_SCRIPT_BYTES, StartSettings, render_start_script
from tests.slurm_fixtures import *  # noqa: F403
from tests.slurm_fixtures import SlurmEnv, Tracker, make_adapter, make_ssh_runner, request_for

# What sbatch printed on the lab cluster (22.05.8, AccountingStorageEnforce=limits), for
# MaxSubmitJobs=1 of the user's association, MaxSubmitJobsPerUser=1 of its QOS, and
# GrpSubmitJobs=1 of the association, each on the second submission.
SUBMIT_LIMIT_STDERR = {
    "assoc-max-submit": "sbatch: error: AssocMaxSubmitJobLimit\nsbatch: error: Batch job "
                        "submission failed: Job violates accounting/QOS policy (job submit "
                        "limit, user's size and/or time limits)\n",
    "qos-max-submit-per-user": "sbatch: error: QOSMaxSubmitJobPerUserLimit\nsbatch: error: "
                               "Batch job submission failed: Job violates accounting/QOS "
                               "policy (job submit limit, user's size and/or time limits)\n",
    "assoc-grp-submit": "sbatch: error: AssocGrpSubmitJobsLimit\nsbatch: error: Batch job "
                        "submission failed: Job violates accounting/QOS policy (job submit "
                        "limit, user's size and/or time limits)\n",
    "policy-alone": "sbatch: error: Batch job submission failed: Job violates accounting/QOS "
                    "policy (job submit limit, user's size and/or time limits)\n",
    "queue-full": "sbatch: error: Batch job submission failed: Slurm job queue full\n",
    # a partition an administrator drained (scontrol update State=DRAIN), 22.05-26.05
    "partition-drained": "sbatch: error: Batch job submission failed: Required partition "
                         "not available (inactive or drain)\n",
}


@pytest.mark.parametrize("stderr", [pytest.param(text, id=key)
                                    for key, text in SUBMIT_LIMIT_STDERR.items()])
def test_submit_limits_are_back_pressure(stderr: str) -> None:
    error = slurm_failure(CommandResult(("sbatch",), 1, "", stderr, 0.01), operation="sbatch")
    assert type(error) is ErrBackPressure


def test_a_per_job_limit_is_not_back_pressure() -> None:
    """A per-job size/time limit never frees itself: the request is invalid."""
    stderr = ("sbatch: error: AssocMaxWallDurationPerJobLimit\nsbatch: error: Batch job "
              "submission failed: Job violates accounting/QOS policy (job submit limit, "
              "user's size and/or time limits)\n")
    error = slurm_failure(CommandResult(("sbatch",), 1, "", stderr, 0.01), operation="sbatch")
    assert type(error) is ErrInvalid


# ---------------------------------------------------------------- stub Slurm

STUB_SBATCH = r"""#!/bin/sh
# stub sbatch --parsable: reads the batch script, records the job, prints its id
name=; comment=
for a in "$@"; do
  case $a in --job-name=*) name=${a#--job-name=} ;; --comment=*) comment=${a#--comment=} ;; esac
done
bytes=$(wc -c)
exec 9>>"$STUB_DIR/lock"
flock 9
n=$(cat "$STUB_DIR/count" 2>/dev/null || echo 0)
n=$((n + 1))
echo "$n" >"$STUB_DIR/count"
if [ -e "$STUB_DIR/refuse-$n" ]; then cat "$STUB_DIR/refuse-$n" >&2; exit 1; fi
id=$((1000 + n))
printf '%s|%s|%s|%s\n' "$id" "$name" "$comment" "$bytes" >>"$STUB_DIR/jobs"
echo "$id"
"""

STUB_SQUEUE = r"""#!/bin/sh
# stub squeue: every recorded job, pending and gated, in SQUEUE_TEXT_FORMAT's columns
[ -e "$STUB_DIR/jobs" ] || exit 0
while IFS='|' read -r id name comment bytes; do
  times='2026-12-01T00:00:00|N/A|N/A|N/A|N/A'
  printf '%s|%s|%s|PD|PENDING|JobHeldUser|%s|UNLIMITED|0|0|0||lab|%s|\n' \
    "$id" "$name" "$STUB_USER" "$times" "$comment"
done <"$STUB_DIR/jobs"
"""


class RecordingRunner:
    """A LocalRunner whose PATH starts with the stubs; remembers every script's size."""

    def __init__(self, stub: Path) -> None:
        self.inner = LocalRunner(env={"PATH": f"{stub}:{DEFAULT_PATH}", "STUB_DIR": str(stub),
                                      "STUB_USER": "svc"}, default_timeout=120)
        self.script_sizes: list[int] = []

    async def run(self, argv: Sequence[str], *, stdin: str | None = None,
                  timeout: float | None = None,
                  env: Mapping[str, str] | None = None) -> CommandResult:
        return await self.inner.run(argv, stdin=stdin, timeout=timeout, env=env)

    async def run_script(self, script: str, *, timeout: float | None = None) -> CommandResult:
        self.script_sizes.append(len(script.encode()))
        return await self.inner.run_script(script, timeout=timeout)

    async def close(self) -> None:
        await self.inner.close()


@pytest.fixture
def stub(tmp_path: Path) -> Path:
    directory = tmp_path / "stub"
    directory.mkdir()
    for name, text in (("sbatch", STUB_SBATCH), ("squeue", STUB_SQUEUE)):
        path = directory / name
        path.write_text(text)
        path.chmod(0o755)
    return directory


def stub_adapter(runner: RecordingRunner, tmp_path: Path, **kwargs: object) -> SlurmAdapter:
    return SlurmAdapter(runner, cluster="lab", user="svc",  # type: ignore[arg-type]
                        settings=StartSettings(output_dir=str(tmp_path / "out")), **kwargs)


def big_request(size: int) -> StartRequest:
    """A Start request whose script is about ``size`` bytes (long command arguments: one
    argument may hold at most 64 KiB)."""
    half = size // 2
    return request_for(new_job_id(), ["sh", "-c", ":", "sh", "x" * half, "y" * (size - half)])


async def test_each_refused_script_of_a_batch_is_back_pressure(stub: Path,
                                                              tmp_path: Path) -> None:
    """Three Starts share one shell; sbatch refuses the second for a submit limit: that
    Start raises ErrBackPressure, the other two start."""
    (stub / "refuse-2").write_text(SUBMIT_LIMIT_STDERR["assoc-max-submit"])
    runner = RecordingRunner(stub)
    adapter = stub_adapter(runner, tmp_path, start_parallel=1)
    requests = [request_for(new_job_id(), ["true"]) for _ in range(3)]
    results = await asyncio.gather(*(adapter.start(r) for r in requests),
                                   return_exceptions=True)
    assert len(runner.script_sizes) == 1  # one shared shell call
    assert isinstance(results[0], ObjectRef) and isinstance(results[2], ObjectRef)
    assert type(results[1]) is ErrBackPressure, results[1]
    assert isinstance(results[1], TransientError)  # keep the intent, retry later
    assert (results[0].id, results[2].id) == (1001, 1003)


async def test_a_batch_of_big_scripts_is_sent_in_pieces(stub: Path, tmp_path: Path) -> None:
    """30 Start scripts of ~80 KiB each (each under the 90 KiB limit, 2.4 MB together)
    all start, in shell calls of at most START_BATCH_BYTES each."""
    runner = RecordingRunner(stub)
    adapter = stub_adapter(runner, tmp_path, start_batch=32, start_parallel=1)
    requests = [big_request(80 * 1024) for _ in range(30)]
    sizes = {len(render_start_script(r, adapter._settings).encode()) for r in requests}
    assert all(80 * 1024 < size <= MAX_SCRIPT_BYTES for size in sizes)
    refs = await asyncio.gather(*(adapter.start(r) for r in requests))
    assert sorted(ref.id for ref in refs) == list(range(1001, 1031))
    assert len(runner.script_sizes) > 1
    assert max(runner.script_sizes) <= START_BATCH_BYTES, runner.script_sizes
    recorded = (stub / "jobs").read_text().splitlines()
    assert len(recorded) == 30 and all(int(line.rsplit("|", 1)[1]) > 80 * 1024
                                       for line in recorded)


async def test_one_script_over_the_batch_budget_still_goes_alone(stub: Path,
                                                                 tmp_path: Path) -> None:
    """START_BATCH_BYTES bounds a batch, never a single script (that one is bounded by
    MAX_SCRIPT_BYTES): a budget smaller than a script still starts it, alone."""
    runner = RecordingRunner(stub)
    adapter = stub_adapter(runner, tmp_path, start_batch_bytes=10_000)
    refs = await asyncio.gather(*(adapter.start(big_request(20_000)) for _ in range(3)))
    assert len(refs) == 3 and len(runner.script_sizes) == 3


# ---------------------------------------------------------------- real Slurm


@pytest.mark.slurm
async def test_big_scripts_start_on_real_slurm(slurm: SlurmEnv, jobs: Tracker) -> None:
    """Six Start scripts of ~80 KiB each over SSH, issued together: every one starts."""
    runner = make_ssh_runner(slurm)
    try:
        adapter = make_adapter(slurm, runner)
        requests = [request_for(jobs.new(), ["sh", "-c", ":", "sh", "x" * 40_000, "y" * 40_000],
                                gate=True) for _ in range(6)]
        refs = await asyncio.gather(*(adapter.start(r) for r in requests))
        assert len({ref.id for ref in refs}) == 6
        found = await adapter.find_many([r.job_id for r in requests])
        assert all(len(found[r.job_id]) == 1 for r in requests)
        for ref in refs:
            await adapter.stop(ref)
    finally:
        await runner.close()

