"""Fault 7: security.

* SSH host keys: the real sshd of the cluster, reached with a known_hosts entry holding
  another key (mismatch) and with an empty known_hosts (unknown host), is refused with
  ``HostKeyError`` by the runner and the adapter before anything runs; a daemon configured
  that way never runs a command (recorded) and never submits its job.
* Another user's jobs: ``dispatch-other`` submits two jobs named ``dj-<ULID>`` with a valid
  dispatch comment (one held, one running). The adapter, as ``dispatch``, never returns
  them from ``find_many``/``inspect``/``inspect_many`` and writes nothing for them; the
  daemon, given a desired record with that very ULID, submits and runs its own job and
  leaves both of theirs exactly as they were (state, start time).
* Secrets: ``dispatchctl submit`` (and ``--dry-run``) warn about env names that look like
  secrets; the README and the job schema say so.
* The database password: a daemon on PostgreSQL as a role with a password, given by the
  config file and by ``DISPATCH_DATABASE_URL``, never shows it in its log, ``/metrics``,
  ``/readyz``, ``/healthz``, nor does ``dispatchctl`` (get, describe, migrate, and a run
  with a wrong password).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.client import Client
from controller.errors import ErrConflict, ErrNotFound
from controller.model.ids import new_job_id
from controller.model.obs import ObjectRef
from controller.runner import HostKeyError, LocalRunner, SSHRunner
from controller.slurm.adapter import SlurmAdapter
from controller.slurm.dialects import parse_text_time
from controller.slurm.script import StartSettings
from controller.store.db import Store
from tests.daemon_harness import free_port
from tests.fault_support import (
    ENV_FILE,
    OUTPUT_DIR,
    FaultRow,
    ListSink,
    RecordingRunner,
    emit,
    executions,
    fault_daemon,
    http_status,
    metric_key,
    metrics_text,
    pg_role_database,
    record_row,
    restore_cluster,
    slurm_env,
    slurm_up,
    squeue_state,
    tally,
    wait_for,
    wait_terminal,
    wrong_writes,
)

ROOT = Path(__file__).resolve().parent.parent
DISPATCHCTL = str(Path(sys.executable).parent / "dispatchctl")
FIGURES: dict[str, int] = {}


@pytest.fixture(scope="module")
def cluster() -> Iterator[dict[str, str]]:
    restore_cluster()
    env = slurm_up()
    yield env
    restore_cluster()


def _impostor_known_hosts(tmp: Path, port: str) -> Path:
    key = tmp / "impostor"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    algorithm, blob = key.with_suffix(".pub").read_text().split()[:2]
    path = tmp / "known_hosts.impostor"
    path.write_text(f"[127.0.0.1]:{port} {algorithm} {blob}\n")
    return path


# ---------------------------------------------------------------- host keys


@pytest.fixture
def ssh_env() -> dict[str, str]:
    """The cluster's sshd as slurm-up left it (read only: this test changes nothing)."""
    if not ENV_FILE.exists():
        pytest.skip("no cluster: run scripts/slurm-up")
    return slurm_env()


@pytest.mark.slurm
def test_host_key_mismatch_and_unknown_host_are_refused(ssh_env: dict[str, str],
                                                        tmp_path: Path) -> None:
    cluster = ssh_env
    impostor = _impostor_known_hosts(tmp_path, cluster["SSH_PORT"])
    empty = tmp_path / "known_hosts.empty"
    empty.write_text("")
    refused: list[str] = []

    async def probe(known_hosts: Path, expected: str) -> None:
        sink = ListSink()
        runner = SSHRunner("127.0.0.1", port=int(cluster["SSH_PORT"]),
                           username=cluster["SUBMIT_USER"], client_keys=[cluster["SSH_KEY"]],
                           known_hosts=str(known_hosts), default_timeout=20)
        adapter = SlurmAdapter(RecordingRunner(runner, sink), cluster="lab",
                               settings=StartSettings(output_dir=OUTPUT_DIR),
                               user=cluster["SUBMIT_USER"])
        for call in (runner.run(["true"]), adapter.find_many([new_job_id()]),
                     adapter.cluster_stats()):
            with pytest.raises(HostKeyError, match=expected):
                await call
        assert runner.connections_opened == 0
        await runner.close()
        refused.append(expected)

    asyncio.run(probe(impostor, "does not match known_hosts"))
    asyncio.run(probe(empty, "not in known_hosts"))
    FIGURES["host_keys_refused"] = len(refused)


@pytest.mark.slurm
@pytest.mark.slow
def test_daemon_with_a_mismatched_host_key_runs_nothing(cluster: dict[str, str],
                                                        tmp_path: Path) -> None:
    impostor = _impostor_known_hosts(tmp_path, cluster["SSH_PORT"])
    url = f"sqlite:///{tmp_path}/hostkey.db"
    Store(url).migrate()
    client = Client(url)
    job = client.submit({"command": ["true"], "workdir": "/tmp"})
    env = {**cluster, "SSH_KNOWN_HOSTS": str(impostor)}
    with fault_daemon(tmp_path, url, transport="ssh", env=env) as d:
        # each tick fails at its first Slurm host command (the ownership marker, then the
        # live read): counted as a tick that could not reach the cluster
        refused = [metric_key("dispatch_ticks_total", result=result)
                   for result in ("error", "slurm-unreachable")]
        wait_for(lambda: sum(d.metrics().get(key, 0) for key in refused) >= 3, timeout=60,
                 what="a few refused ticks")
        log = d.log_text()
        records = d.records()
        alive = d.alive()
    ran = [e for e in records if e.get("phase") == "end" and "rc" in e]
    FIGURES["daemon_refused_commands"] = len(ran)
    assert alive
    assert "does not match known_hosts" in log
    assert ran == []  # not one command reached the host
    assert client.get(job)["slurm_job_id"] is None
    assert executions([job])[job] == []


# ---------------------------------------------------------------- another user's dj- jobs


def _as_other(cluster: dict[str, str], *argv: str) -> str:
    out = subprocess.run(["runuser", "-u", cluster["OTHER_USER"], "--", "env", "TZ=UTC", *argv],
                         capture_output=True, text=True, check=True, timeout=60)
    return out.stdout


@pytest.mark.slurm
@pytest.mark.slow
def test_other_users_dj_jobs_are_never_seen_nor_touched(cluster: dict[str, str],
                                                        tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    job_id = new_job_id()
    name = "dj-" + job_id
    common = ["sbatch", "--parsable", f"--job-name={name}", "--comment=dispatch:s=1;a=0",
              "--chdir=/tmp", "--output=/dev/null"]
    held = int(_as_other(cluster, *common, "--hold", "--wrap", "sleep 300").split(";")[0])
    running = int(_as_other(cluster, *common, "--wrap", "sleep 300").split(";")[0])
    theirs = [held, running]
    try:
        wait_for(lambda: (squeue_state(running) or ("", ""))[0] == "RUNNING", timeout=60,
                 what="the other user's job to run")
        before = {j: squeue_state(j) for j in theirs}

        # the adapter itself, as the daemon's user
        sink = ListSink()
        adapter = SlurmAdapter(RecordingRunner(LocalRunner(run_as=cluster["SUBMIT_USER"],
                                                           default_timeout=60), sink),
                               cluster="lab", settings=StartSettings(output_dir=OUTPUT_DIR),
                               user=cluster["SUBMIT_USER"])

        async def probe() -> tuple[int, int, int]:
            found = await adapter.find_many([job_id])
            refs = []
            for j in theirs:
                fields = _as_other(cluster, "squeue", "-h", "-j", str(j), "-O",
                                   "SubmitTime").split()
                submit = parse_text_time(fields[0])
                assert submit is not None
                refs.append(ObjectRef("lab", name, j, submit))
            accounted = await adapter.inspect_many(refs, since=int(time.time()) - 3600)
            not_found = 0
            for ref in refs:
                with pytest.raises(ErrNotFound):
                    await adapter.inspect(ref)
                not_found += 1
                await adapter.stop(ref)  # identity fails: cancels nothing, succeeds
                for write in (adapter.hold(ref, 1), adapter.release(ref)):
                    with pytest.raises((ErrNotFound, ErrConflict)):
                        await write
            return len(found[job_id]), len(accounted), not_found

        seen, accounted, not_found = asyncio.run(probe())
        assert (seen, accounted) == (0, 0)
        assert sink.writes() == []

        # the daemon, with a desired record of that very ULID
        url = f"sqlite:///{tmp_path}/other.db"
        Store(url).migrate()
        client = Client(url)
        client.submit({"command": ["/bin/sh", "-c", "echo mine"], "workdir": "/tmp"},
                      job_id=job_id)
        with fault_daemon(tmp_path, url) as d:
            final = wait_terminal(client, [job_id], timeout=90)
            records = d.records()
        after = {j: squeue_state(j) for j in theirs}
        wrong, why_wrong = wrong_writes(records, url, protected=theirs)
        outcome = tally({job_id: "succeeded"}, final, executions([job_id]))
        deadline = time.time() + 60  # records reach slurmdbd seconds after the event
        while outcome.lost and time.time() < deadline:
            time.sleep(1)
            outcome = tally({job_id: "succeeded"}, final, executions([job_id]))
        changed = [j for j in theirs if after[j] != before[j]]
        foreign_seen = [c for c in final[job_id]["conditions"] if c["type"] == "ForeignObjects"]
        FIGURES.update(other_jobs=len(theirs), other_changed=len(changed), other_wrong=wrong,
                       other_lost=len(outcome.lost), other_dups=outcome.duplicate_executions)
        emit(f"\nfault 7 other user's dj- jobs: adapter saw {seen}, sacct gave {accounted}, "
             f"inspect refused {not_found}, writes {len(sink.writes())}; daemon ran its own "
             f"job ({final[job_id]['phase']}, {outcome.executed} execution); theirs before "
             f"{before} after {after}; wrong writes {why_wrong}", capsys)
        assert final[job_id]["phase"] == "succeeded"
        assert outcome.lost == [] and outcome.duplicates == {}
        assert changed == [] and wrong == 0, why_wrong
        assert before[held] is not None and before[held][0] == "PENDING"
        assert foreign_seen == []
    finally:
        subprocess.run(["scancel", *map(str, theirs)], check=False, capture_output=True)


# ---------------------------------------------------------------- secrets in env


def test_secret_looking_env_names_warn(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/secrets.db"
    Store(url).migrate()
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"command": ["true"], "workdir": "/tmp",
                               "env": {"API_TOKEN": "x", "DB_PASSWORD": "y",
                                       "AWS_SECRET_ACCESS_KEY": "z", "OMP_NUM_THREADS": "4"}}))
    env = {**os.environ, "DISPATCH_DATABASE_URL": url}
    warned: dict[str, list[str]] = {}
    for extra in ([], ["--dry-run"]):
        out = subprocess.run([DISPATCHCTL, "submit", str(job), *extra], capture_output=True,
                             text=True, env=env, check=True)
        warned[" ".join(extra) or "submit"] = [
            line.split("env.", 1)[1].split()[0] for line in out.stderr.splitlines()
            if "warning: env." in line]
    readme = (ROOT / "README.md").read_text()
    schema = json.loads((ROOT / "controller" / "schema" / "job.schema.json").read_text())
    env_doc = json.dumps(schema).lower()
    FIGURES["secret_warnings"] = sum(len(v) for v in warned.values())
    for names in warned.values():
        assert sorted(names) == ["API_TOKEN", "AWS_SECRET_ACCESS_KEY", "DB_PASSWORD"]
    assert "Secrets do not belong in `env`" in readme
    assert "warns about names that look like secrets" in readme
    assert "no secrets" in env_doc


# ---------------------------------------------------------------- the database password


@pytest.mark.slurm
@pytest.mark.postgres
@pytest.mark.slow
def test_database_password_never_leaks(cluster: dict[str, str], tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    password = "Pw-" + os.urandom(9).hex()
    wrong_password = "Wrong-" + os.urandom(9).hex()
    places: dict[str, str] = {}
    with pg_role_database(password) as url:
        Store(url).migrate()
        client = Client(url)
        # the config file names a database that does not exist: only DISPATCH_DATABASE_URL
        # can make the second daemon work
        elsewhere = url.replace(f":{password}@", "@").rsplit("/", 1)[0] + "/no_such_database"
        for how in ("config", "environment"):
            job = client.submit({"command": ["true"], "workdir": "/tmp"})
            kw: dict[str, object] = ({} if how == "config" else {
                "config_url": elsewhere, "extra_env": {"DISPATCH_DATABASE_URL": url}})
            where = tmp_path / how
            where.mkdir()
            with fault_daemon(where, url, **kw) as d:  # type: ignore[arg-type]
                assert wait_terminal(client, [job], timeout=90)[job]["phase"] == "succeeded"
                places[f"{how}: /metrics"] = metrics_text(d.port)
                places[f"{how}: /readyz"] = http_status(d.port, "/readyz")[1]
                places[f"{how}: /healthz"] = http_status(d.port, "/healthz")[1]
                places[f"{how}: log"] = d.log_text()
        client.close()
        env = {**os.environ, "DISPATCH_DATABASE_URL": url}
        for argv in (["get"], ["describe", job], ["migrate"]):
            out = subprocess.run([DISPATCHCTL, *argv], capture_output=True, text=True, env=env,
                                 timeout=60, check=False)
            places["dispatchctl " + argv[0]] = out.stdout + out.stderr
        # the error paths: no server behind the URL (this PostgreSQL trusts 127.0.0.1, so a
        # wrong password would be accepted; a refused connection is the error we can cause)
        bad = url.replace(password, wrong_password).replace(":5432/", f":{free_port()}/")
        run_failed = True
        for argv in (["run"], ["get"], ["migrate"]):
            out = subprocess.run([DISPATCHCTL, *argv], capture_output=True, text=True,
                                 timeout=60, env={**os.environ, "DISPATCH_DATABASE_URL": bad},
                                 check=False)
            places[f"dispatchctl {argv[0]} (no server)"] = out.stdout + out.stderr
            run_failed = run_failed and out.returncode != 0
    leaks = [where for where, text_ in places.items()
             if password in text_ or wrong_password in text_]
    FIGURES["password_places"] = len(places)
    FIGURES["password_leaks"] = len(leaks)
    emit(f"\nfault 7 password checked in {len(places)} places: {sorted(places)}; "
         f"leaks: {leaks}", capsys)
    assert run_failed
    assert "***" in places["config: log"]  # the redacted URL is what the log shows
    assert leaks == []


def test_zz_security_figures(capsys: pytest.CaptureFixture[str]) -> None:
    """The row of fault 7 in the summary table."""
    wrong = FIGURES.get("other_wrong", 0) + FIGURES.get("other_changed", 0)
    record_row(FaultRow(
        fault="7 security",
        jobs_in_flight=FIGURES["other_jobs"] + 1 if "other_jobs" in FIGURES else 0,
        lost=FIGURES.get("other_lost", 0), duplicates=FIGURES.get("other_dups", 0),
        wrong_writes=wrong + FIGURES.get("password_leaks", 0),
        recovery_s=None,
        notes=(f"host keys refused {FIGURES.get('host_keys_refused', '-')} of 2 (mismatch, "
               f"unknown); daemon with a wrong host key ran "
               f"{FIGURES.get('daemon_refused_commands', '-')} commands; other user's dj- jobs "
               f"untouched ({FIGURES.get('other_changed', '-')} changed); secret warnings "
               f"{FIGURES.get('secret_warnings', '-')}; password checked in "
               f"{FIGURES.get('password_places', '-')} places, "
               f"{FIGURES.get('password_leaks', '-')} leaks")), capsys)
