"""Grid Engine's failures, for real, with the daemon running (seed 003 and issue 21's
Proof): execd SIGKILLed under a running job whose processes die with it (the host is
gone, Grid Engine still lists the job 'r'); qmaster restarted mid-flow; a job driven
into Eqw; job numbers wrapped and reused. Each test that changes the cell holds the cell
lock and restores it (``scripts/gridengine-up`` starts whatever is down; the module
starts with it, so a killed run does not poison the next)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.client import Client
from controller.errors import ErrNotFound
from controller.model.obs import ObjectRef, State
from controller.store.db import Store
from tests.daemon_harness import metric_key
from tests.fault_support import emit
from tests.ge_fixtures import (
    OTHER,
    QMASTER_SPOOL,
    USER,
    GridEngine,
    accounting,
    adapter,
    as_root,
    as_user,
    cell_lock,
    daemon_pid,
    delete_all,
    ge_up,
    job_pids,
    live_numbers,
    only,
    output_dir,
    queue_state,
    ran,
    request,
    wait_until,
)
from tests.test_ge_daemon import TERMINAL, _doc, _executions, _phases, _sh, ge_daemon


@pytest.fixture(scope="module")
def ge() -> GridEngine:
    return ge_up()


@pytest.fixture(autouse=True)
def _clean(ge: GridEngine) -> Iterator[None]:
    yield
    ge_up()
    delete_all(USER)
    delete_all(OTHER)


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path}/ge.db"
    Store(url).migrate()
    return url


def test_execd_killed_under_running_jobs(ge: GridEngine, tmp_path: Path,
                                         sqlite_url: str) -> None:
    """The host's execd is SIGKILLed under two running jobs; the processes of one (LOST)
    die with it, the other's (ALIVE) live on (its shepherd is reparented). Grid Engine
    keeps both 'r' (reschedule_unknown 0) and the host's queue turns 'u' (max_unheard,
    20 s here): both are Stale (NodeDown; dispatch_jobs_stale). Past the unheard grace
    (10 s here) the daemon looks on the host: LOST has no process there and no execd
    runs, so it is deleted and resubmitted as node-lost, excluding the host; ALIVE is
    found and never resubmitted. With one host nothing else can run LOST's
    resubmission: qsub -w e refuses the exclusion and it goes without it
    (ExclusionDropped, as on Slurm), waits for the host's execd, and runs once it is
    back; ALIVE ends normally then. Each job: its executions once each."""
    client = Client(sqlite_url)
    lost = client.submit(_doc(_sh('[ "$DISPATCH_SUBMISSION" -ge 2 ] || sleep 300')),
                         policy={"causes": {"node-lost": {"budget": 2,
                                                          "exclude_node": True}},
                                 "backoff": {"initial_s": 1, "max_s": 2}})
    alive = client.submit(_doc(["sleep", "50"]))
    stale = metric_key("dispatch_jobs_stale", cluster="ge")
    with cell_lock(), ge_daemon(tmp_path, sqlite_url) as d:
        wait_until(lambda: all(v["phase"] == "running"
                               for v in _phases(client, [lost, alive]).values()),
                   timeout=60, what="both running")
        first = client.describe(lost).submissions[0].slurm_job_id
        assert first is not None
        execd = daemon_pid("sge_execd")
        assert execd is not None
        os.kill(execd, signal.SIGKILL)
        killed_at = time.monotonic()
        for pid in job_pids(first):
            os.kill(pid, signal.SIGKILL)
        assert first in live_numbers()  # still listed
        wait_until(lambda: d.metrics().get(stale, 0) >= 1, timeout=60, what="Stale")
        wait_until(lambda: len(subs := client.describe(lost).submissions) >= 2
                   and subs[1].slurm_job_id is not None, timeout=90, what="the resubmission")
        detected = time.monotonic() - killed_at
        unheard = "u" in queue_state(ge.host)
        found = client.describe(lost)
        kinds = [e.kind for e in found.events]
        messages = " ".join(e.message for e in found.events)
        assert "node-lost" in messages, messages
        assert "ExclusionDropped" in kinds, kinds
        wait_until(lambda: "listed running, found on its host" in d.log_text(), timeout=30,
                   what="the probe finding ALIVE")
        conditions = {c["type"]: c for c in _phases(client, [alive])[alive]["conditions"]}
        assert conditions["Stale"]["reason"] == "NodeDown", conditions
        assert len(client.describe(alive).submissions) == 1
        ge_up()  # execd back: the resubmission runs, ALIVE's end is reported
        wait_until(lambda: all(v["phase"] in TERMINAL
                               for v in _phases(client, [lost, alive]).values()),
                   timeout=120, what="both to finish")
        assert d.alive()
    views = _phases(client, [lost, alive])
    runs = [r for r in accounting(ge, {"dj-" + lost}) if ran(r)]
    emit(f"\ngridengine execd-kill: detected and resubmitted in {detected:.1f}s "
         f"(max_unheard 20 s; queue 'u' then: {unheard}); phases "
         f"{views[lost]['phase']}/{views[alive]['phase']}; accounted executions of the "
         f"lost job {len(runs)}")
    assert views[lost]["phase"] == views[alive]["phase"] == "succeeded", views
    # the lost run (submission 1, killed with its host) and the resubmission, once each
    assert sorted((r.account, r.failed) for r in runs)[-1] == ("dispatch;s=2;a=1", 0)
    assert len({r.account for r in runs}) == len(runs) <= 2, runs
    assert len(client.describe(alive).submissions) == 1
    assert _executions(ge, [alive]) == {alive: 1}
    assert detected < 20 + 12 + 30


def test_qmaster_restarted_mid_flow(ge: GridEngine, tmp_path: Path, sqlite_url: str) -> None:
    """qmaster stopped (SIGKILL) and started again while 12 jobs flow: nothing lost,
    nothing run twice."""
    client = Client(sqlite_url)
    ids = [client.submit(_doc(_sh(f"sleep {i % 4}"))) for i in range(12)]
    with cell_lock(), ge_daemon(tmp_path, sqlite_url) as d:
        wait_until(lambda: any(v["phase"] == "running" for v in _phases(client, ids).values()),
                   timeout=60, what="a job running")
        qmaster = daemon_pid("sge_qmaster")
        assert qmaster is not None
        os.kill(qmaster, signal.SIGKILL)
        down_at = time.monotonic()
        up = metric_key("dispatch_slurm_up", cluster="ge")
        wait_until(lambda: d.metrics().get(up) == 0, timeout=30,
                   what="the daemon to see the cluster down")
        ge_up()
        restarted = time.monotonic() - down_at
        wait_until(lambda: all(v["phase"] in TERMINAL for v in _phases(client, ids).values()),
                   timeout=180, interval=1, what="12 jobs to finish")
    final = _phases(client, ids)
    executions = _executions(ge, ids)
    emit(f"\ngridengine qmaster-restart: down {restarted:.1f}s, jobs 12, "
         f"executions {sum(executions.values())}")
    assert {v["phase"] for v in final.values()} == {"succeeded"}
    assert all(executions.get(i) == 1 for i in ids), executions


def test_a_job_driven_into_eqw_ends_under_the_policy(ge: GridEngine, tmp_path: Path,
                                                     sqlite_url: str) -> None:
    """A working directory that does not exist puts each submission in Eqw (failed 28):
    each is deleted and resubmitted as launch-failed until the budget is spent, then
    the job fails. Never pending forever."""
    client = Client(sqlite_url)
    jid = client.submit(_doc(["true"], workdir="/nonexistent/dispatch-eqw"),
                        policy={"causes": {"launch-failed": {"budget": 1,
                                                             "exclude_node": False}},
                                "backoff": {"initial_s": 1, "max_s": 2}})
    with ge_daemon(tmp_path, sqlite_url):
        wait_until(lambda: _phases(client, [jid])[jid]["phase"] in TERMINAL, timeout=120,
                   what="the Eqw job to end")
    view = _phases(client, [jid])[jid]
    assert view["phase"] == "failed" and view["cause"] == "launch-failed", view
    assert len(client.describe(jid).submissions) == 2
    assert not [r for r in accounting(ge, {"dj-" + jid}) if ran(r)]
    assert live_numbers() == set()


def _set_jobseqnum(value: int) -> int:
    """Stop qmaster, set the next job number's predecessor, start it; the old value.
    (SIGKILL, not ``qconf -km``'s 9 s controlled shutdown: the spool survives it, as the
    qmaster restart test shows; the file is written while qmaster is down. execd goes
    too -- no job runs then -- because a restarted qmaster waits ~25 s for the old execd
    to report again, and a new one registers at once.)"""
    for name in ("sge_execd", "sge_qmaster"):
        pid = daemon_pid(name)
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
    wait_until(lambda: daemon_pid("sge_qmaster") is None, timeout=60, what="qmaster down")
    path = QMASTER_SPOOL / "jobseqnum"
    old = int(path.read_text().strip() or 0)
    path.write_text(f"{value}\n")
    ge_up()
    return old


def test_job_numbers_wrap_and_a_reused_number_is_never_written(ge: GridEngine) -> None:
    """Job numbers past 9,999,999 start over at 1 (the wrap, verified here); a number of
    ours deleted behind our back and handed to dispatch-other's job named like ours,
    with our account string, is never written by a ref that names it."""
    out = output_dir()

    async def main() -> tuple[list[int], int]:
        a = adapter(ge, out)
        wrapped = []
        for _ in range(3):
            ref = await a.start(request(["true"]))
            wrapped.append(ref.id)
        # reuse: our gated job k deleted by root, k handed to another user's job
        req = request(["true"])
        ours = await a.start(req)
        as_root("qdel", str(ours.id))
        wait_until(lambda: ours.id not in live_numbers(), timeout=30, what="deleted")
        _set_jobseqnum(ours.id - 1)
        number = int(as_user(OTHER, "qsub", "-terse", "-h", "-N", ours.uid, "-A",
                             "dispatch;s=1;a=0", "-o", "/dev/null", "-j", "y",
                             stdin="sleep 300\n").stdout.strip())
        assert number == ours.id
        await a.stop(ours)
        for write in (a.release(ours), a.hold(ours, 1)):
            with pytest.raises(ErrNotFound):
                await write
        assert await only(a, req.job_id) is None
        assert number in live_numbers(OTHER)
        return wrapped, number

    with cell_lock():
        before = _set_jobseqnum(9_999_998)
        try:
            wrapped, _ = asyncio.run(main())
        finally:
            delete_all(USER)
            delete_all(OTHER)
            _set_jobseqnum(max(before, 100))
    emit(f"\ngridengine wrap: numbers after 9999998: {wrapped}")
    assert wrapped[0] == 9_999_999 and wrapped[1] == 1, wrapped


def test_a_gated_job_of_a_dead_ref_is_not_adopted_by_name_alone(ge: GridEngine) -> None:
    """The live read keeps only our user's jobs named exactly dj-<ULID>, whatever else
    the user runs."""
    async def main() -> None:
        a = adapter(ge, output_dir())
        as_user(USER, "qsub", "-terse", "-h", "-N", "dj-not-a-ulid", "-o", "/dev/null",
                "-j", "y", stdin="true\n")
        strays: dict[str, list[object]] = {}
        await a.find_many([], strays=strays)  # type: ignore[arg-type]
        assert strays == {}

    asyncio.run(main())
    assert State.GATED  # (vocabulary import kept for readers)
    assert ObjectRef
