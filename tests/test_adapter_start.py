"""Start, FindMany, Preflight and the cheap reads against the REAL cluster, plus the
error mapping of Slurm's messages (pure, table-driven).

* Start submits one job, reads it back and returns its ref (submit time from Slurm);
* an ambiguous Start (the script ran, then the connection "dropped") is resolved by
  rediscovery by name and submission: exactly one sbatch, exactly one job;
* sbatch's refusals map to ErrInvalid, and nothing lands;
* FindMany makes exactly one Slurm command for 50 jobs;
* Preflight reports what the cluster really is.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence

import pytest

from controller.errors import (
    CommandFailed,
    DispatchError,
    ErrBackPressure,
    ErrConflict,
    ErrInvalid,
    ErrNotFound,
    ErrUnsupported,
    TransientError,
)
from controller.model.obs import State
from controller.runner import CommandResult, Runner
from controller.slurm.adapter import (
    Capabilities,
    SlurmAdapter,
    batch_script,
    parse_batch_output,
    parse_parsable,
    parse_slurm_version,
    slurm_failure,
)
from controller.slurm.dialects import parse_text_time
from controller.slurm.naming import discovery_name
from controller.slurm.script import StartSettings
from tests.slurm_fixtures import *  # noqa: F403
from tests.slurm_fixtures import (
    SlurmEnv,
    Tracker,
    as_root,
    local_runner_for,
    make_adapter,
    make_ssh_runner,
    matrix,
    request_for,
    squeue_rows,
)

# ---------------------------------------------------------------- pure: error mapping


def _failed(stderr: str, returncode: int = 1) -> CommandResult:
    return CommandResult(("sbatch",), returncode, "", stderr, 0.01)


@pytest.mark.parametrize(("stderr", "returncode", "kind"), [
    pytest.param("sbatch: error: Batch job submission failed: Invalid partition name specified",
                 1, ErrInvalid, id="partition"),
    pytest.param("sbatch: error: invalid partition specified: nope", 1, ErrInvalid,
                 id="partition-client"),
    pytest.param("sbatch: error: Batch job submission failed: Invalid account or "
                 "account/partition combination specified", 1, ErrInvalid, id="account"),
    pytest.param("sbatch: error: Batch job submission failed: Invalid qos specification", 1,
                 ErrInvalid, id="qos"),
    pytest.param("sbatch: error: Batch job submission failed: Requested node configuration "
                 "is not available", 1, ErrInvalid, id="node-config"),
    pytest.param("sbatch: error: Invalid generic resource (gres) specification", 1,
                 ErrInvalid, id="gres"),
    pytest.param("sbatch: error: Memory specification can not be satisfied", 1, ErrInvalid,
                 id="memory"),
    pytest.param("sbatch: error: Batch job submission failed: Job violates accounting/QOS "
                 "policy (job submit limit, user's size and/or time limits)", 1, ErrBackPressure,
                 id="policy"),
    pytest.param("sbatch: error: Batch job submission failed: Unable to contact slurm "
                 "controller (connect failure)", 1, TransientError, id="ctld-down"),
    pytest.param("squeue: error: Socket timed out on send/recv operation", 1, TransientError,
                 id="socket-timeout"),
    pytest.param("sbatch: error: Slurm temporarily unable to accept job, sleeping and "
                 "retrying", 1, TransientError, id="busy"),
    pytest.param("sacct: error: Problem talking to the database: Connection refused", 1,
                 TransientError, id="dbd-down"),
    pytest.param("sh: 1: sbatch: not found", 127, TransientError, id="no-sbatch"),
    pytest.param("slurm_load_jobs error: Invalid job id specified", 1, ErrNotFound,
                 id="unknown-id"),
    pytest.param("Job is no longer pending execution for job 7", 1, ErrConflict,
                 id="not-pending"),
    pytest.param("Requested operation is presently disabled for job 7", 1, ErrUnsupported,
                 id="requeue-disabled"),
    pytest.param("Job is pending execution for job 7", 1, ErrConflict, id="requeue-pending"),
    pytest.param("sacct: error: Slurm accounting storage is disabled", 1, ErrUnsupported,
                 id="no-accounting"),
    pytest.param("mkdir: cannot create directory '/x': Permission denied", 1, CommandFailed,
                 id="unknown"),
])
def test_slurm_failure_mapping(stderr: str, returncode: int,
                               kind: type[DispatchError]) -> None:
    error = slurm_failure(_failed(stderr, returncode), operation="op")
    assert type(error) is kind
    assert str(error).startswith("op")


@pytest.mark.parametrize(("text", "expected"), [
    ("42\n", 42), ("42;lab\n", 42), ("", None), ("Submitted batch job 42\n", None),
    ("warning\n43\n", 43),
])
def test_parse_parsable(text: str, expected: int | None) -> None:
    assert parse_parsable(text) == expected


@pytest.mark.parametrize(("text", "version"), [
    ("slurm-wlm 22.05.8\n", (22, 5, 8)),
    ("slurm 22.05.2", (22, 5, 2)),
    ("slurm 24.05.1", (24, 5, 1)),
    ("slurm 25.11.0", (25, 11, 0)),
    ("slurm 26.05.4", (26, 5, 4)),
])
def test_versions(text: str, version: tuple[int, int, int]) -> None:
    assert parse_slurm_version(text) == version


# ---------------------------------------------------------------- real cluster


class DroppingRunner:
    """Passes everything through, but reports the Start script's connection as lost:
    ``after`` runs it first (the job lands), otherwise it never runs."""

    def __init__(self, inner: Runner, *, after: bool) -> None:
        self.inner = inner
        self.after = after
        self.start_scripts = 0

    async def run(self, argv: Sequence[str], *, stdin: str | None = None,
                  timeout: float | None = None,
                  env: Mapping[str, str] | None = None) -> CommandResult:
        return await self.inner.run(argv, stdin=stdin, timeout=timeout, env=env)

    async def run_script(self, script: str, *, timeout: float | None = None) -> CommandResult:
        if "sbatch --parsable" not in script:
            return await self.inner.run_script(script, timeout=timeout)
        self.start_scripts += 1
        if self.after:
            await self.inner.run_script(script, timeout=timeout)
        raise TransientError("SSH connection lost while running sh; its outcome is unknown")

    async def close(self) -> None:
        await self.inner.close()


@pytest.mark.slurm
@matrix
async def test_start_reads_back(adapter: SlurmAdapter, slurm: SlurmEnv,
                                jobs: Tracker) -> None:
    job_id = jobs.new()
    ref = await adapter.start(request_for(job_id, ["true"], gate=True, submission=3,
                                          attempt=2))
    assert ref.cluster == slurm.cluster and ref.uid == discovery_name(job_id)
    row = as_root("squeue", "-h", "-j", str(ref.id), "-o", "%j|%u|%k|%V|%T").stdout.strip()
    name, user, comment, submit, state = row.split("|")
    assert (name, user, comment, state) == (ref.uid, slurm.submit_user, "dispatch:s=3;a=2",
                                            "PENDING")
    assert parse_text_time(submit) == ref.submit
    [obs] = await adapter.find(job_id)
    assert (obs.ref, obs.submission, obs.attempt, obs.state) == (ref, 3, 2, State.GATED)
    # the SLUID: read and recorded where squeue prints it (26.05), else unknown live
    if slurm.series == "26.05":
        sluid = as_root("squeue", "-h", "-j", str(ref.id), "-O", "SLUID:").stdout.strip()
        assert ref.sluid == obs.ref.sluid == sluid and sluid.startswith("s")
    else:
        assert ref.sluid is None and obs.ref.sluid is None


@pytest.mark.slurm
@pytest.mark.parametrize("after", [pytest.param(True, id="landed"),
                                   pytest.param(False, id="never-ran")])
async def test_ambiguous_start_is_rediscovered_not_resubmitted(
        slurm: SlurmEnv, slurm_runner: Runner, jobs: Tracker, after: bool) -> None:
    runner = DroppingRunner(slurm_runner, after=after)
    adapter = make_adapter(slurm, runner)
    job_id = jobs.new()
    request = request_for(job_id, ["true"], gate=True, submission=5)
    if after:
        ref = await adapter.start(request)
        rows = squeue_rows(slurm.submit_user, ref.uid)
        assert rows == [f"{ref.id}|{ref.uid}|PENDING"]  # exactly one job, this one
        [obs] = await adapter.find(job_id)
        assert obs.ref == ref and obs.submission == 5
    else:
        with pytest.raises(TransientError, match="outcome unknown"):
            await adapter.start(request)
        assert squeue_rows(slurm.submit_user, discovery_name(job_id)) == []
    assert runner.start_scripts == 1  # sbatch ran at most once: never submitted again


@pytest.mark.slurm
@pytest.mark.parametrize("placement", [
    pytest.param({"partition": "no-such-partition"}, id="partition"),
    pytest.param({"nodelist": "no-such-node"}, id="nodelist"),
    pytest.param({"constraint": "no-such-feature"}, id="constraint"),
])
async def test_sbatch_refusals_are_invalid(slurm: SlurmEnv, jobs: Tracker,
                                           placement: dict[str, str]) -> None:
    adapter = make_adapter(slurm, local_runner_for(slurm))
    job_id = jobs.new()
    with pytest.raises(ErrInvalid, match="sbatch"):
        await adapter.start(request_for(job_id, ["true"], extra={
            "extensions": {"slurm": {"Placement": placement}}}))
    assert squeue_rows(slurm.submit_user, discovery_name(job_id)) == []


@pytest.fixture(params=["local", "ssh"])
async def observed(request: pytest.FixtureRequest,
                   slurm: SlurmEnv) -> AsyncIterator[tuple[Runner, list[str]]]:
    """A runner of each transport and the commands its observer saw (argv[0] names)."""
    calls: list[str] = []

    def observer(name: str, _duration: float, _ok: bool) -> None:
        calls.append(name)

    runner: Runner = (local_runner_for(slurm, observer=observer) if request.param == "local"
                      else make_ssh_runner(slurm, observer=observer))
    yield runner, calls
    await runner.close()


@pytest.mark.slurm
async def test_concurrent_starts_share_a_call_and_keep_their_own_outcomes(
        slurm: SlurmEnv, observed: tuple[Runner, list[str]], jobs: Tracker) -> None:
    """Starts issued together run as one shell per batch (and read back in it), yet each
    keeps its own outcome: the one sbatch refuses fails alone."""
    runner, calls = observed
    adapter = make_adapter(slurm, runner, start_parallel=2)
    ids = [jobs.new() for _ in range(9)]
    bad = jobs.new()
    requests = [request_for(job_id, ["true"], gate=True, submission=i + 1)
                for i, job_id in enumerate(ids)]
    requests.insert(4, request_for(bad, ["true"], gate=True, extra={
        "extensions": {"slurm": {"Placement": {"partition": "no-such-partition"}}}}))
    results = await asyncio.gather(*(adapter.start(r) for r in requests),
                                   return_exceptions=True)
    assert calls == ["sh", "sh"]  # two shared calls, read-back included: nothing else
    assert isinstance(results[4], ErrInvalid)
    refs = [r for i, r in enumerate(results) if i != 4]
    assert all(not isinstance(r, BaseException) for r in refs)
    found = await adapter.find_many([*ids, bad])
    assert not found[bad]
    for i, job_id in enumerate(ids):
        [obs] = found[job_id]
        assert obs.ref == refs[i] and obs.submission == i + 1


def test_batch_output_with_a_dead_shell_leaves_the_rest_unknown() -> None:
    """The shell died after the first of three Start scripts reported: the first keeps
    its result, the other two are unknown (Start will rediscover them)."""
    result = CommandResult(("/bin/sh", "-s"), -9, "@@dispatch-start 1 0\n17\n",
                           "@@dispatch-start 1\n@@dispatch-start 2\n", 1.0)
    first, second, third = parse_batch_output(result, 3, user="dispatch")
    assert first.error is None and first.result.ok and parse_parsable(first.result.stdout) == 17
    assert isinstance(second.error, TransientError) and "unknown" in str(second.error)
    assert isinstance(third.error, TransientError)


def test_batch_script_runs_each_start_script_unchanged() -> None:
    scripts = ["#!/bin/sh\nset -eu\necho one\n", "#!/bin/sh\nset -eu\necho two\n"]
    text = batch_script(scripts)
    for index, body in enumerate(scripts, start=1):
        assert f"dispatch_start_{index}() {{\n{body}}}\n" in text
    assert text.count("squeue") == 1


@pytest.mark.slurm
async def test_refused_before_anything_runs(slurm: SlurmEnv, jobs: Tracker) -> None:
    calls: list[str] = []
    adapter = make_adapter(slurm, local_runner_for(
        slurm, observer=lambda name, _d, _ok: calls.append(name)))
    with pytest.raises(ErrInvalid, match="submission"):
        await adapter.start(request_for(jobs.new(), ["true"], submission=0))
    with pytest.raises(ErrInvalid, match=r"output\.dir"):
        SlurmAdapter(local_runner_for(slurm), cluster=slurm.cluster, user=slurm.submit_user,
                     settings=StartSettings(output_dir="/tmp/%j"))
    assert calls == []


@pytest.mark.slurm
async def test_find_many_is_one_command_for_50_jobs(
        slurm: SlurmEnv, observed: tuple[Runner, list[str]], jobs: Tracker) -> None:
    runner, calls = observed
    adapter = make_adapter(slurm, runner)
    ids = [jobs.new() for _ in range(50)]
    refs = await asyncio.gather(*(adapter.start(request_for(job_id, ["true"], gate=True))
                                  for job_id in ids))
    absent = [jobs.new() for _ in range(5)]
    calls.clear()
    found = await adapter.find_many(ids + absent)
    assert calls == ["squeue"]
    assert {job_id: [o.ref for o in found[job_id]] for job_id in ids} == {
        job_id: [ref] for job_id, ref in zip(ids, refs, strict=True)}
    assert all(not found[job_id] for job_id in absent)
    assert all(o.state is State.GATED for job_id in ids for o in found[job_id])


@pytest.mark.slurm
@matrix
async def test_preflight(slurm: SlurmEnv, adapter: SlurmAdapter) -> None:
    config = {}
    for line in as_root("scontrol", "show", "config").stdout.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            config[key.strip()] = value.strip()
    caps = await adapter.preflight()
    assert isinstance(caps, Capabilities) and adapter.capabilities == caps
    assert caps.slurm_version == slurm.version and caps.version[:2] >= (22, 5)
    assert caps.accounting_history is slurm.accounting
    assert caps.job_comment is ("job_comment" in config["AccountingStoreFlags"])
    assert caps.min_job_age == int(config["MinJobAge"].split()[0])
    assert caps.max_job_id == int(config["MaxJobId"])
    assert caps.first_job_id == int(config["FirstJobId"])
    assert caps.job_requeue is (config["JobRequeue"] == "1")
    assert caps.max_batch_requeue == (int(config["MaxBatchRequeue"])
                                      if "MaxBatchRequeue" in config else None)
    assert caps.whoami and caps.output_dir_writable and caps.cluster_name == slurm.cluster
    assert caps.warnings == ()
    # which identity the cluster supports, probed (squeue/sacct -O SLUID accepted or not)
    assert (caps.identity, caps.squeue_sluid, caps.sacct_sluid) == {
        "22.05": ("id+name+submit", False, False),
        "24.11": ("sluid-accounting", False, True),
        "26.05": ("sluid", True, True)}[slurm.series]


@pytest.mark.slurm
async def test_preflight_warns(slurm: SlurmEnv) -> None:
    adapter = SlurmAdapter(local_runner_for(slurm), cluster="not-" + slurm.cluster,
                           user=slurm.submit_user,
                           settings=StartSettings(output_dir="/root/dispatch-forbidden"))
    caps = await adapter.preflight()
    assert not caps.output_dir_writable
    assert any("output.dir" in w for w in caps.warnings)
    assert any("calls itself" in w for w in caps.warnings)


@pytest.mark.slurm
async def test_cluster_stats_and_missing_paths(slurm: SlurmEnv, jobs: Tracker) -> None:
    adapter = make_adapter(slurm, local_runner_for(slurm))
    gated = await adapter.start(request_for(jobs.new(), ["true"], gate=True))
    running = await adapter.start(request_for(jobs.new(), ["sleep", "60"]))
    for _ in range(50):
        if (await adapter.inspect(running)).state is State.RUNNING:
            break
        await asyncio.sleep(0.2)
    stats = await adapter.cluster_stats()
    assert stats.running >= 1 and stats.pending >= 1
    assert slurm.node not in stats.down_nodes
    assert stats.observed_wait_s is not None and 0 <= stats.observed_wait_s < 3600
    assert gated.id > 0

    home = f"/home/{slurm.submit_user}"
    missing = await adapter.missing_paths(
        ["/tmp", "/no/such/path", "~", "~/no such file", home, "/tmp/it's \"odd\"\n"])
    assert missing == ["/no/such/path", "~/no such file", "/tmp/it's \"odd\"\n"]
    assert await adapter.missing_paths([]) == []
