"""Issue 10: slurmctld's RPC rate limit is back-pressure, on the REAL 24.11 and 26.05.

``scripts/slurm-up --version V --rate-limit BUCKET:REFILL`` runs the chroot cluster with
``SlurmctldParameters=rl_enable,rl_bucket_size=BUCKET,rl_refill_rate=REFILL,...``: every
RPC of user ``dispatch`` takes a token from a bucket of its own (root is exempt) and a
client that finds it empty is told to back off. 100 trivial jobs go through the daemon (a
real ``dispatchctl run`` over SSH, every command recorded) with a global budget of
``BUDGET`` commands per second; the bucket is small enough that slurmctld refuses the
daemon's RPCs within the first seconds (with 200 jobs its log counted ~95 of ~600). All jobs
must succeed, each run exactly once; no job fails or is resubmitted, no event mentions a
rate limit, no Slurm command fails or times out (no Start batch or joined write is
killed and rediscovered), and the daemon's command rate (``dispatch_slurm_commands_total``
over the run) stays within its budget. The cluster gets its earlier options back (rate
limit off, checked) whatever happens. About 40 s per version.

``DISPATCH_TEST_RATE_LIMIT`` (default ``10:10``), ``DISPATCH_TEST_RATE_BUDGET`` (5) and
``DISPATCH_TEST_RATE_JOBS`` (100) change the run. A slower refill saturates the bucket for
longer: every RPC of a limited client then costs at least libslurm's 1 s sleep, so a
command that names many jobs (a joined ``scontrol release`` of 32 jobs is 32 RPCs) or a
command that keeps losing the race for the refilled tokens can outlast its timeout.
``10:5`` killed a joined release of 32 jobs at 30 s on 24.11; joined writes now get 2 s
more per extra job (``PER_JOB_RPC_S``, as Start batches) and name at most 64 jobs, but a
cluster-stats ``sinfo -N`` on 26.05 still waited past its 30 s there (not re-run since).

What each client does when it is limited, per version, is recorded in
``testdata/slurm/rate-limit/`` (``INDEX.md``): libslurm sleeps and sends the RPC again,
printing nothing, so a limited command only takes longer; the texts Slurm has for it are
classified as back-pressure (``test_rate_limit_texts_are_back_pressure``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from controller.client import Client
from controller.errors import ErrBackPressure
from controller.runner.base import CommandResult
from controller.slurm.adapter import RATE_LIMIT_RETRY_S, slurm_failure
from controller.store.db import Store
from tests.daemon_harness import free_port, wait_for
from tests.fault_support import (
    FaultDaemon,
    config_text,
    emit,
    event_counts,
    query,
    wait_terminal,
)
from tests.slurm_fixtures import *  # noqa: F403
from tests.slurm_fixtures import (
    ALL_VERSIONS,
    SlurmEnv,
    as_root,
    matrix_versions,
    started_runs,
)

ROOT = Path(__file__).resolve().parent.parent
SLURM_UP = ROOT / "scripts" / "slurm-up"
CAPTURES = ROOT / "testdata" / "slurm" / "rate-limit"
# a bucket of 10 tokens, 10 added every second: the daemon's bursts exceed it at once
RATE_LIMIT = os.environ.get("DISPATCH_TEST_RATE_LIMIT", "10:10")
# slurm.rate_per_s: the daemon's global budget, commands per second
BUDGET = float(os.environ.get("DISPATCH_TEST_RATE_BUDGET", "5"))
JOBS = int(os.environ.get("DISPATCH_TEST_RATE_JOBS", "100"))
CHROOT_VERSIONS = [v for v in matrix_versions() if v in ALL_VERSIONS[1:]]  # 24.11, 26.05
CTLD_LOG = "var/lib/dispatch-slurm/log/slurmctld.log"  # inside the chroot
LIMITED = re.compile(r"RPC rate limit exceeded by uid (\d+) with (\S+)")


# ---------------------------------------------------------------- pure: the texts


# Slurm's two rate-limit texts (the client library's error table, 24.11 and 26.05) as the
# clients print a failed RPC. With rl_enable alone no client prints either (libslurm
# retries BACKOFF itself: testdata/slurm/rate-limit/); HARD_DROP (slurmctld's RPC queue)
# is not retried and fails the command.
RATE_LIMIT_TEXTS = {
    "sbatch-hard-drop": "sbatch: error: Batch job submission failed: Rate limit exceeded, "
                        "please retry later\n",
    "squeue-hard-drop": "slurm_load_jobs error: Rate limit exceeded, please retry later\n",
    "scontrol-hard-drop": "slurm_update error: Rate limit exceeded, please retry later\n",
    "scancel-hard-drop": "scancel: error: Kill job error on job id 7: Rate limit exceeded, "
                         "please retry later\n",
    "backoff": "sbatch: error: Batch job submission failed: Rate limit exceeded, please "
               "retry momentarily\n",
}


@pytest.mark.parametrize("stderr", [pytest.param(text, id=key)
                                    for key, text in RATE_LIMIT_TEXTS.items()])
def test_rate_limit_texts_are_back_pressure(stderr: str) -> None:
    """A command that fails with Slurm's rate-limit text is back-pressure with a
    retry_after: never a job failure, an invalid request or an unknown outcome."""
    error = slurm_failure(CommandResult(("sbatch",), 1, "", stderr, 0.01), operation="sbatch")
    assert type(error) is ErrBackPressure
    assert error.retry_after == RATE_LIMIT_RETRY_S


def test_limited_clients_print_nothing() -> None:
    """The captures: under rl_enable every limited client exits 0 (or was still backing
    off when the capture's own ``timeout 60`` ended it, 124) with an empty stderr."""
    versions = sorted(p.name for p in CAPTURES.iterdir() if p.is_dir())
    assert versions == ["24.11", "26.05"]
    for version in versions:
        for line in (CAPTURES / version / "commands.tsv").read_text().splitlines():
            rc = line.split("\t")[1]
            assert rc in ("rc=0", "rc=124"), (version, line)
        for line in (CAPTURES / version / "stderr-sizes.tsv").read_text().splitlines():
            assert line.split("\t")[1] == "0 bytes", (version, line)


# ---------------------------------------------------------------- the cluster


def _env(version: str) -> dict[str, str]:
    env: dict[str, str] = {}
    for line in Path(f"/var/lib/dispatch-slurm/env-{version}").read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep:
            env[key.strip()] = value.strip()
    return env


def _options(env: dict[str, str]) -> list[str]:
    """The ``slurm-up`` options the cluster runs with now (rate limit aside)."""
    options = ["--version", env["SLURM_SERIES"], "--min-job-age", env["MIN_JOB_AGE"],
               "--ssh-port", env["SSH_PORT"]]
    if env.get("MAX_JOB_ID"):
        options += ["--max-job-id", env["MAX_JOB_ID"]]
    return options


def _ctld_params(version: str) -> str:
    out = as_root("scontrol", "show", "config", version=version).stdout
    for line in out.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "SlurmctldParameters":
            return value.strip()
    return ""


@dataclass(frozen=True)
class Limited:
    env: dict[str, str]
    log: Path  # slurmctld's log, seen from the host
    uid: int  # dispatch's


@pytest.fixture(scope="module")
def rate_limited(slurm_version: str, slurm: SlurmEnv) -> Iterator[Limited]:
    """The cluster of ``slurm_version`` with slurmctld's RPC rate limit on; afterwards the
    options it had before, rate limit off (checked)."""
    before = _options(_env(slurm_version))
    subprocess.run([str(SLURM_UP), *before, "--rate-limit", RATE_LIMIT], check=True,
                   stdout=subprocess.DEVNULL, timeout=600)
    try:
        bucket, refill = RATE_LIMIT.split(":")
        params = _ctld_params(slurm_version)
        assert (f"rl_enable,rl_bucket_size={bucket},rl_refill_rate={refill},"
                f"rl_refill_period=1") in params, params
        env = _env(slurm_version)
        uid = int(as_root("id", "-u", env["SUBMIT_USER"], version=slurm_version).stdout)
        yield Limited(env, Path(env["CHROOT"]) / CTLD_LOG, uid)
    finally:
        as_root("scancel", "-u", "dispatch", check=False, version=slurm_version)
        subprocess.run([str(SLURM_UP), *before], check=True, stdout=subprocess.DEVNULL,
                       timeout=600)
        assert "rl_enable" not in _ctld_params(slurm_version)


def _script_durations(records: list[dict[str, Any]]) -> list[tuple[float, int]]:
    """(seconds, sbatch count) of every Start batch script the daemon ran. A record's end
    names no begin: each is paired with the oldest open begin of the same process and
    size (two of a size at once may be swapped, which leaves the longest about right)."""
    open_: dict[tuple[int, int], list[float]] = {}
    out: list[tuple[float, int]] = []
    for r in records:
        if r.get("kind") != "script":
            continue
        key = (r["pid"], r["sbatch"])
        if r["phase"] == "begin":
            open_.setdefault(key, []).append(r["t"])
        elif open_.get(key):
            out.append((round(r["t"] - open_[key].pop(0), 1), r["sbatch"]))
    return out


def _user_rpcs(version: str, user: str) -> int:
    """How many RPCs slurmctld has counted for ``user`` (sdiag, since its start)."""
    out = as_root("sdiag", version=version).stdout
    by_user = out.partition("statistics by user")[2]
    match = re.search(rf"^\s*{re.escape(user)}\s*\(\s*\d+\)\s*count:(\d+)", by_user,
                      re.MULTILINE)
    return int(match.group(1)) if match else 0


def _commands(metrics: dict[str, float]) -> tuple[float, float]:
    """(commands run, commands failed) summed over every command label."""
    run = sum(v for k, v in metrics.items() if k.startswith("dispatch_slurm_commands_total{"))
    failed = sum(v for k, v in metrics.items()
                 if k.startswith("dispatch_slurm_command_errors_total{"))
    return run, failed


# ---------------------------------------------------------------- the proof


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.parametrize("slurm_version", CHROOT_VERSIONS, indirect=True, scope="module")
def test_rate_limit_is_back_pressure(rate_limited: Limited, slurm_version: str,
                                     tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path}/rate-limit.db"
    Store(url).migrate()
    client = Client(url)
    port = free_port()
    config = tmp_path / "config.toml"
    text = config_text(database_url=url, port=port, transport="ssh", env=rate_limited.env)
    assert "rate_per_s = 200" in text
    config.write_text(text.replace("rate_per_s = 200", f"rate_per_s = {BUDGET:g}"))
    daemon = FaultDaemon(config, port, tmp_path / "daemon", record=tmp_path / "record.jsonl")
    log_from = rate_limited.log.stat().st_size
    rpcs0 = _user_rpcs(slurm_version, rate_limited.env["SUBMIT_USER"])
    ids = [client.submit({"command": ["true"], "workdir": "/tmp", "labels": {"e2e": "rl"}})
           for _ in range(JOBS)]
    daemon.start()
    try:
        wait_for(lambda: "dispatch_ticks_total" in "".join(daemon.metrics()), timeout=60,
                 what="daemon metrics endpoint")
        t0 = time.monotonic()
        run0, _ = _commands(daemon.metrics())
        final = wait_terminal(client, ids, timeout=300)
        took = time.monotonic() - t0
        run1, failed = _commands(daemon.metrics())
        ended = time.time()  # what the daemon's SIGTERM cancels after this is no error
        daemon.terminate(timeout=60)
        rpcs = _user_rpcs(slurm_version, rate_limited.env["SUBMIT_USER"]) - rpcs0
    finally:
        if daemon.alive():
            daemon.kill()
    with rate_limited.log.open("rb") as handle:
        handle.seek(log_from)
        limited = [m for m in LIMITED.finditer(handle.read().decode(errors="replace"))
                   if int(m.group(1)) == rate_limited.uid]
    records = daemon.records()
    scripts = _script_durations(records)
    errors = [r for r in records if r["phase"] == "end" and r.get("error") and r["t"] < ended]
    events = query(url, "SELECT kind, message FROM events")
    mentions = [(k, m) for k, m in events if "rate limit" in str(m).lower()]
    counts = event_counts(url, ["Failed", "Resubmitting", "SubmitDeferred", "ActionFailed"])
    executions = started_runs(slurm_version, {"dj-" + i for i in ids})
    rate = (run1 - run0) / took
    log_text = daemon.log_text()
    emit(f"\nrate limit {RATE_LIMIT} on {slurm_version}: {JOBS} jobs in {took:.1f}s; "
         f"{rpcs} RPCs of dispatch, {len(limited)} refused by slurmctld "
         f"({sorted({m.group(2) for m in limited})}); daemon {run1 - run0:.0f} commands, "
         f"{rate:.2f}/s (budget {BUDGET:g}/s), {failed:.0f} failed; Start batches "
         f"{len(scripts)}, longest {max((s for s, _ in scripts), default=0):.1f}s "
         f"({json.dumps(sorted(scripts, reverse=True)[:3])}); events {counts}", capsys)

    phases = {v["phase"] for v in final.values()}
    assert phases == {"succeeded"}, {i: (v["phase"], v["cause"]) for i, v in final.items()
                                     if v["phase"] != "succeeded"}
    assert limited, "slurmctld never refused an RPC: the rate limit was not reached"
    assert all(n == 1 for n in executions.values()), {
        n: c for n, c in executions.items() if c != 1}
    assert counts["Failed"] == counts["Resubmitting"] == 0, counts
    assert mentions == [], mentions
    assert errors == [] and failed == 0, errors
    assert "start outcome unknown" not in log_text  # no Start batch killed by its timeout
    # the global budget: a bucket of int(BUDGET) commands, BUDGET more every second
    assert run1 - run0 <= BUDGET * took + int(BUDGET), (run1 - run0, took)
