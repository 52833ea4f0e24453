"""The Grid Engine adapter against the real Son of Grid Engine 8.1.9 of the
``gridengine`` lane (``scripts/gridengine-up``): the gated submit and its release, exit
codes from the accounting file, a dispatch hold told apart from the gate and from an
operator's hold, a cancel while running, Eqw as a launch failure, node exclusion, and
another user's job named like ours (our ULID, our account string) never touched."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.errors import ErrInvalid, ErrNotFound
from controller.model.obs import CauseKind, ObjectObs, ObjectRef, Provenance, Source, State
from tests.ge_fixtures import (
    OTHER,
    USER,
    GridEngine,
    accounting,
    adapter,
    as_root,
    as_user,
    delete_all,
    ge_up,
    live_numbers,
    only,
    output_dir,
    ran,
    request,
    wait_obs,
)


@pytest.fixture(scope="module")
def ge() -> GridEngine:
    return ge_up()


@pytest.fixture(autouse=True)
def _clean(ge: GridEngine) -> Iterator[None]:
    yield
    delete_all(USER)
    delete_all(OTHER)


async def _ended(a, ref: ObjectRef, *, timeout: float = 60) -> ObjectObs:  # type: ignore[no-untyped-def]
    async def read() -> ObjectObs | None:
        return (await a.inspect_many([ref], since=ref.submit)).get(ref) if ref.id not in \
            live_numbers() else None
    found = await wait_obs(read, lambda o: o is not None, timeout=timeout,
                           what=f"job {ref.id} in accounting")
    assert found is not None
    return found


def test_gated_submit_release_runs_once_and_reads_back(ge: GridEngine) -> None:
    out = output_dir()

    async def main() -> None:
        a = adapter(ge, out)
        req = request(["sh", "-c", "echo hello; echo oops >&2"])
        ref = await a.start(req)
        obs = await only(a, req.job_id)
        assert obs is not None and obs.state is State.GATED and obs.ref == ref
        assert (obs.submission, obs.attempt, obs.foreign) == (1, 0, False)
        await asyncio.sleep(2.5)  # two scheduling intervals: a gated job never starts
        assert (await only(a, req.job_id)).state is State.GATED  # type: ignore[union-attr]
        await a.release(ref)
        end = await _ended(a, ref)
        assert (end.state, end.cause.kind, end.source) == (
            State.ENDED, CauseKind.COMPLETED, Source.ACCOUNTING)
        assert end.nodes == (ge.host,) and end.submission == 1
        assert b"".join([c async for c in a.output(ref, "stdout", submission=1)]) == b"hello\n"
        assert b"".join([c async for c in a.output(ref, "stderr", submission=1)]) == b"oops\n"
        assert await a.started_evidence(ref, 1)
        records = accounting(ge, {ref.uid})
        assert len([r for r in records if ran(r)]) == 1

    asyncio.run(main())


@pytest.mark.parametrize(("command", "cause", "code"), [
    pytest.param(["sh", "-c", "exit 3"], CauseKind.NON_ZERO_EXIT, 3, id="exit 3"),
    pytest.param(["sh", "-c", "kill -TERM $$"], CauseKind.SIGNALED, None, id="signal"),
])
def test_endings_from_accounting(ge: GridEngine, command: list[str], cause: CauseKind,
                                 code: int | None) -> None:
    async def main() -> None:
        a = adapter(ge, output_dir())
        ref = await a.start(request(command, gate=False))
        end = await _ended(a, ref)
        assert (end.cause.kind, end.exit_code) == (cause, code)

    asyncio.run(main())


def test_timeout_from_h_rt(ge: GridEngine) -> None:
    async def main() -> None:
        a = adapter(ge, output_dir())
        ref = await a.start(request(["sleep", "60"], gate=False,
                                    resources={"time_limit_s": 2}))
        end = await _ended(a, ref, timeout=90)
        assert end.cause.kind is CauseKind.TIMEOUT

    asyncio.run(main())


def test_dispatch_hold_gate_and_operator_hold_are_told_apart(ge: GridEngine) -> None:
    async def main() -> None:
        a = adapter(ge, output_dir())
        # a job that cannot start (its placement excludes the only host)
        req = request(["true"], extensions={"slurm": {"Placement": {"exclude": ge.host}}})
        ref = await a.start(req)
        await a.release(ref)
        pending = await wait_obs(lambda: only(a, req.job_id),
                                 lambda o: o is not None and o.state is State.PENDING,
                                 timeout=30, what="pending")
        assert pending is not None
        await a.hold(ref, 7)
        held = await only(a, req.job_id)
        assert held is not None and held.state is State.HELD
        assert (held.hold_instance, held.cause.kind, held.cause.provenance) == (
            7, CauseKind.NONE, Provenance.DISPATCH)
        await a.release(ref)
        assert (await only(a, req.job_id)).state is State.PENDING  # type: ignore[union-attr]
        # an operator's hold: reported as admin-hold, and our release leaves it alone
        as_root("qhold", "-h", "o", str(ref.id))
        op = await only(a, req.job_id)
        assert op is not None and op.state is State.HELD
        assert (op.cause.kind, op.hold_instance) == (CauseKind.ADMIN_HOLD, None)
        await a.release(ref)
        assert (await only(a, req.job_id)).cause.kind is CauseKind.ADMIN_HOLD  # type: ignore[union-attr]

    asyncio.run(main())


def test_cancel_while_running(ge: GridEngine) -> None:
    async def main() -> None:
        a = adapter(ge, output_dir())
        req = request(["sleep", "300"])
        ref = await a.start(req)
        await a.release(ref)
        await wait_obs(lambda: only(a, req.job_id),
                       lambda o: o is not None and o.state is State.RUNNING,
                       timeout=30, what="running")
        await a.stop(ref)
        assert ref.id not in live_numbers()
        end = await _ended(a, ref)
        assert (end.cause.kind, end.cause.provenance) == (CauseKind.CANCELLED,
                                                          Provenance.DISPATCH)
        rec = accounting(ge, {ref.uid})[-1]
        assert (rec.failed, rec.exit_status) == (100, 137)  # as NOTES.md recorded

    asyncio.run(main())


def test_eqw_is_a_launch_failure_and_is_deleted(ge: GridEngine) -> None:
    out = output_dir()

    async def main() -> None:
        a = adapter(ge, out)
        req = request(["true"])
        ref = await a.start(req)
        os.chmod(Path(out) / req.job_id, 0o555)  # root: the -o file cannot be written
        try:
            await a.release(ref)
            eqw = await wait_obs(lambda: only(a, req.job_id),
                                 lambda o: o is not None and o.state is State.HELD,
                                 timeout=30, what="Eqw")
            assert eqw is not None and eqw.cause.kind is CauseKind.LAUNCH_FAILED
            assert "Permission denied" in eqw.cause.detail or eqw.cause.detail
            await a.stop(ref)
            end = await _ended(a, ref)
            assert end.cause.kind is CauseKind.LAUNCH_FAILED
        finally:
            os.chmod(Path(out) / req.job_id, 0o755)

    asyncio.run(main())


def test_another_users_job_named_like_ours_is_never_touched(ge: GridEngine) -> None:
    """dispatch-other submits a job with our name and our account string; the adapter
    of dispatch never lists it, and a ref that names its number acts on nothing."""
    async def main() -> None:
        a = adapter(ge, output_dir())
        req = request(["true"])
        name = "dj-" + req.job_id
        script = "sleep 300\n"
        number = int(as_user(OTHER, "qsub", "-terse", "-h", "-N", name, "-A",
                             "dispatch;s=1;a=0", "-o", "/dev/null", "-j", "y",
                             stdin=script).stdout.strip())
        assert await only(a, req.job_id) is None
        strays: dict[str, list[ObjectObs]] = {}
        await a.find_many([], strays=strays)
        assert strays == {}
        detail = as_root("qstat", "-j", str(number), "-xml").stdout
        submit = int(detail.split("<JB_submission_time>")[1].split("<")[0])
        ref = ObjectRef("ge", name, number, submit)
        await a.stop(ref)  # nothing deleted
        with pytest.raises(ErrNotFound):
            await a.release(ref)
        with pytest.raises(ErrNotFound):
            await a.hold(ref, 1)
        assert number in live_numbers(OTHER)
        assert "hqw" in as_root("qstat", "-u", OTHER).stdout

    asyncio.run(main())


def test_an_exclusion_that_leaves_no_host_is_refused(ge: GridEngine) -> None:
    """A resubmission's exclusion is a preference: qsub -w e refuses a job no host could
    run (ErrInvalid: nothing created), and the caller submits again without it."""
    async def main() -> None:
        a = adapter(ge, output_dir())
        with pytest.raises(ErrInvalid, match="no suitable queues"):
            await a.start(request(["true"], exclude=(ge.host,)))
        ref = await a.start(request(["true"], exclude=("no-such-host",)))
        assert "hostname=!no-such-host" in as_root("qstat", "-j", str(ref.id)).stdout

    asyncio.run(main())


def test_one_read_for_a_steady_queue(ge: GridEngine) -> None:
    """The live read is one qstat per tick once nothing changes (the details and hold
    lists are read only for jobs whose state moved)."""
    calls: list[str] = []

    async def main() -> None:
        a = adapter(ge, output_dir())
        reqs = [request(["true"]) for _ in range(3)]
        for req in reqs:
            await a.start(req)
        real = a._runner.run_script

        async def counting(text: str, **kw: object):  # type: ignore[no-untyped-def]
            calls.append(text.split()[1] if text.startswith("exec") else text.split(maxsplit=1)[0])
            return await real(text, **kw)  # type: ignore[arg-type]
        a._runner.run_script = counting  # type: ignore[method-assign]
        ids = [r.job_id for r in reqs]
        first = await a.find_many(ids)
        assert all(o[0].state is State.GATED for o in first.values())
        before = len(calls)
        await a.find_many(ids)
        assert len(calls) - before == 1, calls

    asyncio.run(main())


def test_dispatchctl_preflight_of_a_grid_engine_cluster(ge: GridEngine, tmp_path: Path) -> None:
    """``dispatchctl preflight`` reaches the cell through the configured transport: what
    it supports, and exit 1 naming what the daemon needs and it lacks."""
    import subprocess

    from tests.daemon_harness import DISPATCHCTL

    def run(queue: str) -> subprocess.CompletedProcess[str]:
        config = tmp_path / f"{queue}.toml"
        config.write_text(f'[cluster]\nname = "ge"\nkind = "gridengine"\n[transport]\n'
                          f'run_as = "{USER}"\n[output]\ndir = "{output_dir()}"\n'
                          f'[gridengine]\nqueue = "{queue}"\n')
        return subprocess.run([DISPATCHCTL, "--config", str(config), "preflight"],
                              capture_output=True, text=True, check=False)

    good = run(ge.queue)
    assert good.returncode == 0, good.stderr
    assert "kind                     gridengine" in good.stdout
    assert "accounting_readable      True" in good.stdout
    bad = run("nosuch.q")
    assert bad.returncode == 1
    assert "gridengine.queue nosuch.q is not a queue of the cluster" in bad.stderr


def test_round_trip_over_ssh(ge: GridEngine) -> None:
    """The adapter over SSH (one asyncssh connection, host keys checked) as ``dispatch``:
    the loopback sshd that scripts/slurm-up runs on this host reaches the cell's commands
    as well (read only: nothing of Slurm is touched). Skipped without it."""
    from controller.gridengine.adapter import GridEngineAdapter
    from controller.runner.ssh import SSHRunner
    from controller.slurm.script import StartSettings

    env_file = Path("/var/lib/dispatch-slurm/env")
    if not env_file.exists():
        pytest.skip("no loopback sshd (scripts/slurm-up)")
    env = dict(line.split("=", 1) for line in env_file.read_text().splitlines() if "=" in line)
    out = output_dir()

    async def main() -> None:
        runner = SSHRunner("127.0.0.1", port=int(env["SSH_PORT"]), username=USER,
                           client_keys=[env["SSH_KEY"]], known_hosts=env["SSH_KNOWN_HOSTS"])
        try:
            a = GridEngineAdapter(runner, cluster="ge", settings=StartSettings(output_dir=out),
                                  user=USER, accounting_file=ge.accounting_file)
            assert await a.check_preflight() == []
            req = request(["sh", "-c", "echo over ssh"])
            ref = await a.start(req)
            assert (await only(a, req.job_id)).state is State.GATED  # type: ignore[union-attr]
            await a.release(ref)
            end = await _ended(a, ref)
            assert end.cause.kind is CauseKind.COMPLETED
            assert b"".join([c async for c in a.output(ref, "stdout", submission=1)]) == \
                b"over ssh\n"
        finally:
            await runner.close()

    asyncio.run(main())
