"""LocalRunner against real subprocesses; RateLimiter and the observer hook with a fake clock."""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from controller.errors import CommandFailed, ErrInvalid, TransientError
from controller.runner import CommandResult, LocalRunner, RateLimiter, Runner

ECHO_ARGV = [sys.executable, "-c", "import json, sys; print(json.dumps(sys.argv[1:]))"]

NASTY_ARGS = [
    pytest.param(["plain"], id="plain"),
    pytest.param(["a b", "  lead and trail  "], id="spaces"),
    pytest.param(["$(touch /tmp/dispatch-pwned)", "`id`", "${HOME}", "$HOME"], id="expansion"),
    pytest.param(["; rm -rf /", "a && b", "a || b", "a | b", "x > y", "< z", "&"], id="operators"),
    pytest.param(["'", '"', "'\"'", "it's", "\\", "a\\nb"], id="quotes-backslash"),
    pytest.param(["*", "?", "[a-z]", "~", "~root", "{a,b}"], id="globs-tilde-braces"),
    pytest.param(["line1\nline2", "tab\there", "\r", "\x1b[31mred"], id="control-chars"),
    pytest.param(["", "", "x"], id="empty-strings"),
    pytest.param(["-n", "--", "-e", "--help"], id="dashes"),
    pytest.param(["ümlaut", "日本語", "emoji-🙂"], id="unicode"),
    pytest.param(["#comment", "a#b", "!", "!!", "%s", "%n"], id="misc"),
]


def alive(pid: int) -> bool:
    """True if pid exists and is not a zombie (an unreaped dead process counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def wait_gone(*pids: int, within: float = 2.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + within
    while any(alive(p) for p in pids):
        assert loop.time() < end, f"still running: {[p for p in pids if alive(p)]}"
        await asyncio.sleep(0.02)


def other_user() -> str:
    """The user run_as tests run as: `dispatch` when it exists, else `nobody`."""
    try:
        pwd.getpwnam("dispatch")
    except KeyError:
        return "nobody"
    return "dispatch"


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="run_as needs root")


def test_is_a_runner() -> None:
    assert isinstance(LocalRunner(), Runner)


@pytest.mark.parametrize("args", NASTY_ARGS)
async def test_argv_reaches_program_verbatim(args: list[str]) -> None:
    result = await LocalRunner().run([*ECHO_ARGV, *args])
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == args
    assert not Path("/tmp/dispatch-pwned").exists()


async def test_argv_verbatim_through_printf() -> None:
    args = ["a b", "$(id)", "'", "\n", ""]
    result = await LocalRunner().run(["printf", "%s\\0", *args])
    assert result.stdout.split("\0")[:-1] == args


async def test_stdin_is_passed_and_absent_stdin_is_eof() -> None:
    runner = LocalRunner()
    text = "first line\n$(not expanded) 'quoted'\nümlaut\n" * 1000
    result = await runner.run(["cat"], stdin=text)
    assert result.stdout == text
    assert (await runner.run(["cat"], timeout=5)).stdout == ""


async def test_nonzero_exit_is_returned_not_raised() -> None:
    result = await LocalRunner().run(["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert result == CommandResult(("sh", "-c", "echo out; echo err >&2; exit 3"), 3,
                                   "out\n", "err\n", result.duration_s)
    assert not result.ok
    with pytest.raises(CommandFailed) as info:
        result.check_returncode()
    assert info.value.returncode == 3
    assert info.value.stderr == "err\n"


async def test_killed_by_signal_is_negative_returncode() -> None:
    result = await LocalRunner().run(["sh", "-c", "kill -TERM $$"])
    assert result.returncode == -15


async def test_undecodable_output_is_replaced() -> None:
    result = await LocalRunner().run(["printf", "ok\\377\\n"])
    assert result.stdout == "ok\ufffd\n"


async def test_timeout_raises_transient_and_kills_the_process_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "pids"
    script = f"echo $$ > {pidfile}; sleep 30 & echo $! >> {pidfile}; wait"
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    with pytest.raises(TransientError) as info:
        await LocalRunner().run(["sh", "-c", script], timeout=0.3)
    assert loop.time() - t0 < 2
    assert "timed out" in str(info.value)
    assert "unknown" in str(info.value)
    pids = [int(p) for p in pidfile.read_text().split()]
    assert len(pids) == 2
    await wait_gone(*pids)


async def test_timeout_when_a_grandchild_holds_the_pipes(tmp_path: Path) -> None:
    pidfile = tmp_path / "pids"
    # The shell exits at once; its background child keeps stdout open.
    script = f"sleep 30 & echo $! > {pidfile}; exit 0"
    with pytest.raises(TransientError):
        await LocalRunner().run(["sh", "-c", script], timeout=0.3)
    await wait_gone(int(pidfile.read_text()))


async def test_cancellation_kills_the_process_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "pids"
    task = asyncio.create_task(
        LocalRunner().run(["sh", "-c", f"echo $$ > {pidfile}; sleep 30"], timeout=10))
    while not pidfile.exists() or not pidfile.read_text().strip():
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await wait_gone(int(pidfile.read_text()))


@needs_root
async def test_run_as_other_user() -> None:
    user = other_user()
    entry = pwd.getpwnam(user)
    runner = LocalRunner(run_as=user)
    result = await runner.run(["sh", "-c", 'id -un; echo "$HOME|$USER|$LOGNAME|$TZ|$LANG"'])
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [user, f"{entry.pw_dir}|{user}|{user}|UTC|C.UTF-8"]
    script = await runner.run_script("id -un\n")
    assert script.stdout == f"{user}\n"


@needs_root
async def test_run_as_timeout_kills_runuser_and_its_child() -> None:
    shared = Path(tempfile.mkdtemp(prefix="dispatch-runner-test-"))
    try:
        shared.chmod(0o777)  # pytest's tmp_path is private to root
        pidfile = shared / "pid"
        runner = LocalRunner(run_as=other_user())
        with pytest.raises(TransientError):
            await runner.run(["sh", "-c", f"echo $$ > {pidfile}; sleep 30"], timeout=0.5)
        await wait_gone(int(pidfile.read_text()))
    finally:
        shutil.rmtree(shared)


def test_run_as_current_user_needs_no_runuser() -> None:
    me = pwd.getpwuid(os.geteuid()).pw_name
    assert LocalRunner(run_as=me)._prefix == ()


def test_run_as_unknown_user_is_invalid() -> None:
    with pytest.raises(ErrInvalid) as info:
        LocalRunner(run_as="no-such-user-dispatch-test")
    assert info.value.field == "run_as"


async def test_environment_is_clean_and_controlled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISPATCH_LEAK_CHECK", "leaked")
    monkeypatch.setenv("TZ", "America/New_York")
    runner = LocalRunner(env={"SLURM_CONF": "/etc/slurm/slurm.conf", "EXTRA": "ctor"})
    result = await runner.run(["env"], env={"EXTRA": "call", "SQUEUE_FORMAT": "%i %j"})
    got = dict(line.split("=", 1) for line in result.stdout.splitlines())
    me = pwd.getpwuid(os.geteuid())
    assert got == {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": me.pw_dir, "USER": me.pw_name, "LOGNAME": me.pw_name,
        "LANG": "C.UTF-8", "TZ": "UTC",
        "SLURM_CONF": "/etc/slurm/slurm.conf", "EXTRA": "call", "SQUEUE_FORMAT": "%i %j",
    }


async def test_times_are_utc() -> None:
    result = await LocalRunner().run(["date", "-d", "@0", "+%Y-%m-%dT%H:%M:%S%z"])
    assert result.stdout == "1970-01-01T00:00:00+0000\n"


async def test_working_directory_is_home() -> None:
    home = pwd.getpwuid(os.geteuid()).pw_dir
    result = await LocalRunner().run(["pwd"])
    assert result.stdout.strip() == (home if os.path.isdir(home) else "/")


async def test_run_script_uses_sh_with_script_on_stdin() -> None:
    script = (
        "set -eu\n"
        "x='it''s \"quoted\"'\n"
        "printf '%s|%s\\n' \"$x\" \"$TZ\"\n"
        "cat <<'EOF'\n"
        "$(not expanded)\n"
        "EOF\n"
        "exit 4\n"
    )
    result = await LocalRunner().run_script(script)
    assert result.argv == ("/bin/sh", "-s")
    assert result.returncode == 4
    assert result.stdout == 'its "quoted"|UTC\n$(not expanded)\n'


async def test_run_script_timeout() -> None:
    with pytest.raises(TransientError):
        await LocalRunner().run_script("sleep 30\n", timeout=0.2)


@pytest.mark.parametrize("program, code", [
    pytest.param("dispatch-no-such-program", 127, id="not-on-path"),
    pytest.param("/nonexistent/sbatch", 127, id="no-such-path"),
    pytest.param("/etc/passwd", 126, id="not-executable"),
])
async def test_missing_program_is_a_shell_like_result(program: str, code: int) -> None:
    result = await LocalRunner().run([program, "--version"])
    assert result.returncode == code
    assert result.stderr.startswith(f"{program}: ")


@needs_root
async def test_missing_program_under_run_as_is_127_too() -> None:
    result = await LocalRunner(run_as=other_user()).run(["dispatch-no-such-program"])
    assert result.returncode == 127


@pytest.mark.parametrize("argv", [
    pytest.param([], id="empty"),
    pytest.param(["echo", "a\0b"], id="nul-in-arg"),
    pytest.param(["ec\0ho"], id="nul-in-program"),
    pytest.param([""], id="empty-program"),
    pytest.param(["A=B", "echo"], id="assignment-as-program"),
    pytest.param("echo hi", id="string-not-list"),
])
async def test_invalid_argv(argv: list[str]) -> None:
    with pytest.raises(ErrInvalid) as info:
        await LocalRunner().run(argv)
    assert info.value.field == "argv"


@pytest.mark.parametrize("env", [
    pytest.param({"A=B": "x"}, id="equals-in-name"),
    pytest.param({"": "x"}, id="empty-name"),
    pytest.param({"1X": "x"}, id="leading-digit"),
    pytest.param({"X": "a\0b"}, id="nul-in-value"),
])
async def test_invalid_env(env: dict[str, str]) -> None:
    with pytest.raises(ErrInvalid):
        await LocalRunner().run(["true"], env=env)


@pytest.mark.parametrize("timeout", [0, -1, float("nan"), float("inf")])
async def test_invalid_timeout(timeout: float) -> None:
    with pytest.raises(ErrInvalid):
        await LocalRunner().run(["true"], timeout=timeout)


async def test_observer_sees_name_duration_and_outcome() -> None:
    seen: list[tuple[str, float, bool]] = []
    runner = LocalRunner(observer=lambda name, d, ok: seen.append((name, d, ok)))
    await runner.run(["/bin/true"])
    await runner.run(["false"])
    with pytest.raises(TransientError):
        await runner.run(["sleep", "5"], timeout=0.1)
    await runner.run_script("exit 0")
    assert [(n, ok) for n, _, ok in seen] == [
        ("true", True), ("false", False), ("sleep", False), ("sh", True)]
    assert all(d >= 0 for _, d, _ in seen)
    assert seen[2][1] >= 0.1


async def test_a_failing_observer_does_not_lose_the_result(
        caplog: pytest.LogCaptureFixture) -> None:
    def broken(name: str, duration: float, ok: bool) -> None:
        raise RuntimeError("metrics bug")

    result = await LocalRunner(observer=broken).run(["echo", "hi"])
    assert result.stdout == "hi\n"
    assert "runner observer failed" in caplog.text


class FakeTime:
    """A clock that moves only when the code under test sleeps."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        await asyncio.sleep(0)


async def test_rate_limiter_allows_a_burst_then_the_rate() -> None:
    t = FakeTime()
    limiter = RateLimiter(10, burst=3, clock=t.clock, sleep=t.sleep)
    for _ in range(3):
        await limiter.acquire()
    assert t.sleeps == []
    for _ in range(4):
        await limiter.acquire()
    assert t.sleeps == pytest.approx([0.1] * 4)
    t.now += 60  # a long idle refills only up to the burst
    for _ in range(3):
        await limiter.acquire()
    assert len(t.sleeps) == 4
    await limiter.acquire()
    assert len(t.sleeps) == 5


async def test_rate_limiter_serves_waiters_in_order() -> None:
    limiter = RateLimiter(100, burst=1)  # the real clock: 10 ms per token
    order: list[int] = []

    async def take(i: int) -> None:
        await limiter.acquire()
        order.append(i)

    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await asyncio.gather(*(take(i) for i in range(5)))
    assert order == [0, 1, 2, 3, 4]
    assert 0.035 <= loop.time() - t0 < 0.5


async def test_rate_limiter_cancelled_waiter_returns_its_token() -> None:
    t = FakeTime()
    limiter = RateLimiter(1, burst=1, clock=t.clock, sleep=asyncio.sleep)
    await limiter.acquire()
    waiter = asyncio.create_task(limiter.acquire())
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    t.now += 1.0  # one token's worth of time: exactly one acquire is free again
    await asyncio.wait_for(limiter.acquire(), 0.5)


@pytest.mark.parametrize("rate, burst", [(0, 1), (-1, 1), (float("nan"), 1), (1, 0)])
def test_rate_limiter_rejects_bad_settings(rate: float, burst: int) -> None:
    with pytest.raises(ErrInvalid):
        RateLimiter(rate, burst=burst)


async def test_runner_takes_a_token_per_command() -> None:
    t = FakeTime()
    limiter = RateLimiter(2, burst=1, clock=t.clock, sleep=t.sleep)
    runner = LocalRunner(limiter=limiter)
    for _ in range(3):
        await runner.run(["true"])
    await runner.run_script("true")
    assert t.sleeps == pytest.approx([0.5, 0.5, 0.5])


def test_a_local_daemon_never_loads_asyncssh() -> None:
    """asyncssh and cryptography cost a process 15 MB (bench/tick's peak RSS at 100k jobs
    went from 199 to 185 MB without them): the CLI, the wiring and the runner package
    load them only when an SSH transport is built (or an SSH name is asked for)."""
    code = ("import sys; import controller.cli.app, controller.cli.daemon, controller.wiring, "
            "controller.runner; "
            "assert 'asyncssh' not in sys.modules, 'loaded'; "
            "from controller.runner import SSHRunner; "
            "assert 'asyncssh' in sys.modules and SSHRunner.__name__ == 'SSHRunner'")
    done = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parent.parent,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
