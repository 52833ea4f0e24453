"""SSHRunner against a real SSH server: asyncssh in-process on a random loopback port,
and (marked ``slurm``) the OpenSSH sshd that scripts/slurm-up starts.

Host-key checking is on in every test: the client only trusts what the test
writes into its known_hosts file.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncssh
import pytest

from controller.errors import ErrInvalid, TransientError
from controller.runner import (
    CommandResult,
    HostKeyError,
    Runner,
    SSHAuthError,
    SSHRunner,
)
from controller.runner.ssh import command_line

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
    pytest.param(["#comment", "a#b", "!", "!!", "%s", "%n", "A=B"], id="misc"),
]


# ---------------------------------------------------------------- keys and server


@dataclass(frozen=True)
class Keys:
    host_key: Path
    host_public: str  # "ssh-ed25519 AAAA..."
    impostor_public: str  # another ed25519 key, for a mismatching known_hosts entry
    other_type_public: str  # an ECDSA key: the server has no host key of that type
    client_key: Path
    client_public: str
    stranger_key: Path  # a client key the server does not authorize


def _public(key: asyncssh.SSHKey) -> str:
    return " ".join(key.export_public_key("openssh").decode().split()[:2])


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Keys:
    d = tmp_path_factory.mktemp("sshkeys")
    made: dict[str, asyncssh.SSHKey] = {}
    for name, alg in [("host", "ssh-ed25519"), ("impostor", "ssh-ed25519"),
                      ("other", "ecdsa-sha2-nistp256"), ("client", "ssh-ed25519"),
                      ("stranger", "ssh-ed25519")]:
        made[name] = asyncssh.generate_private_key(alg)
        made[name].write_private_key(str(d / name))
    return Keys(host_key=d / "host", host_public=_public(made["host"]),
                impostor_public=_public(made["impostor"]),
                other_type_public=_public(made["other"]),
                client_key=d / "client", client_public=_public(made["client"]),
                stranger_key=d / "stranger")


@dataclass
class FakeSSHD:
    """An asyncssh server on 127.0.0.1 that runs each exec request with /bin/sh -c.

    It kills a command's process group when the client closes the channel, or
    sends a signal, and records what it saw so tests can prove what happened.
    """

    keys: Keys
    port: int = 0
    commands: list[str] = field(default_factory=list)
    connections: list[asyncssh.SSHServerConnection] = field(default_factory=list)
    active: int = 0
    peak: int = 0
    command_started: asyncio.Event = field(default_factory=asyncio.Event)
    _acceptor: Any = None

    async def start(self, port: int = 0) -> None:
        authorized = asyncssh.import_authorized_keys(self.keys.client_public + "\n")
        sshd = self

        class Server(asyncssh.SSHServer):
            def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
                sshd.connections.append(conn)

        self._acceptor = await asyncssh.create_server(
            Server, "127.0.0.1", port, server_host_keys=[str(self.keys.host_key)],
            authorized_client_keys=authorized, process_factory=self._handle,
            encoding=None, keepalive_interval=0)
        self.port = self._acceptor.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        self.drop_all()
        if self._acceptor is not None:
            self._acceptor.close()
            await self._acceptor.wait_closed()

    def drop_all(self) -> None:
        """Cut every client connection, as a crashed server or a lost network would."""
        for conn in self.connections:
            conn.abort()

    async def _handle(self, process: asyncssh.SSHServerProcess[bytes]) -> None:
        self.commands.append(process.command or "")
        self.active += 1
        self.peak = max(self.peak, self.active)
        try:
            await self._run(process)
        finally:
            self.active -= 1

    async def _run(self, process: asyncssh.SSHServerProcess[bytes]) -> None:
        proc = await asyncio.create_subprocess_exec(
            "/bin/sh", "-c", process.command or "", stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            start_new_session=True)
        self.command_started.set()
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None

        def kill(sig: int = signal.SIGKILL) -> None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)

        async def feed(dst: asyncio.StreamWriter) -> None:
            try:
                while chunk := await process.stdin.read(65536):
                    dst.write(chunk)
                    await dst.drain()
            except asyncssh.SignalReceived as exc:
                kill(signal.Signals[f"SIG{exc.signal}"])
            except (OSError, asyncssh.Error):
                pass
            finally:
                dst.close()

        async def pump(src: asyncio.StreamReader, dst: asyncssh.SSHWriter[bytes]) -> None:
            while chunk := await src.read(65536):
                with contextlib.suppress(OSError, asyncssh.Error):
                    dst.write(chunk)

        work: asyncio.Future[Any] = asyncio.gather(
            feed(proc.stdin), pump(proc.stdout, process.stdout),
            pump(proc.stderr, process.stderr), proc.wait())
        closed: asyncio.Future[Any] = asyncio.ensure_future(process.wait_closed())
        await asyncio.wait({work, closed}, return_when=asyncio.FIRST_COMPLETED)
        if not work.done():  # the client went away: leave nothing running
            kill()
            await proc.wait()
            work.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await work
            return
        closed.cancel()
        rc = proc.returncode
        assert rc is not None
        with contextlib.suppress(OSError, asyncssh.Error):
            if rc >= 0:
                process.exit(rc)
            else:
                process.exit_with_signal(signal.Signals(-rc).name[3:])

    def known_hosts_line(self, public: str | None = None) -> str:
        return f"[127.0.0.1]:{self.port} {public or self.keys.host_public}\n"


@pytest.fixture
async def sshd(keys: Keys) -> AsyncIterator[FakeSSHD]:
    server = FakeSSHD(keys)
    await server.start()
    yield server
    await server.stop()


def write_known_hosts(tmp_path: Path, text: str) -> str:
    path = tmp_path / "known_hosts"
    path.write_text(text)
    return str(path)


@pytest.fixture
def make_runner(sshd: FakeSSHD, keys: Keys,
                tmp_path: Path) -> Iterator[Any]:
    made: list[SSHRunner] = []

    def make(known_hosts: str | None = None, **kwargs: Any) -> SSHRunner:
        kwargs.setdefault("client_keys", [str(keys.client_key)])
        runner = SSHRunner(
            "127.0.0.1", port=kwargs.pop("port", sshd.port), username="tester",
            known_hosts=known_hosts or write_known_hosts(tmp_path, sshd.known_hosts_line()),
            **kwargs)
        made.append(runner)
        return runner

    yield make
    for runner in made:  # sync teardown: the connections die with the server
        conn = runner._conn
        if conn is not None:
            conn.abort()


@pytest.fixture
def runner(make_runner: Any) -> SSHRunner:
    r: SSHRunner = make_runner()
    return r


# ---------------------------------------------------------------- quoting


@pytest.mark.parametrize("argv, env, line", [
    pytest.param(["squeue", "--me"], None, "env -- TZ=UTC LANG=C.UTF-8 squeue --me", id="plain"),
    pytest.param(["scontrol", "update", "JobId=42", "StartTime=2036-01-01T00:00:00"], None,
                 "env -- TZ=UTC LANG=C.UTF-8 scontrol update JobId=42"
                 " StartTime=2036-01-01T00:00:00", id="assignments-as-args"),
    pytest.param(["echo", "a b", "$(id)", "it's", ""], None,
                 "env -- TZ=UTC LANG=C.UTF-8 echo 'a b' '$(id)' 'it'\"'\"'s' ''", id="quoted"),
    pytest.param(["-x", "--"], None, "env -- TZ=UTC LANG=C.UTF-8 -x --", id="dash-program"),
    pytest.param(["squeue"], {"SQUEUE_FORMAT": "%i %j", "TZ": "Europe/Paris"},
                 "env -- TZ=Europe/Paris LANG=C.UTF-8 'SQUEUE_FORMAT=%i %j' squeue",
                 id="env-added-and-overridden"),
])
def test_command_line(argv: list[str], env: dict[str, str] | None, line: str) -> None:
    assert command_line(argv, env) == line


@pytest.mark.parametrize("argv", [[], ["a\0"], ["X=1", "y"], [""]])
def test_command_line_refuses_what_env_or_sh_would_misread(argv: list[str]) -> None:
    with pytest.raises(ErrInvalid):
        command_line(argv)


def test_is_a_runner(runner: SSHRunner) -> None:
    assert isinstance(runner, Runner)


@pytest.mark.parametrize("kwargs", [
    pytest.param({"known_hosts": ""}, id="no-known-hosts"),
    pytest.param({"client_keys": []}, id="no-client-keys"),
    pytest.param({"client_keys": "/a/key"}, id="client-keys-as-string"),
    pytest.param({"username": ""}, id="no-username"),
    pytest.param({"max_sessions": 0}, id="no-sessions"),
])
def test_invalid_settings(kwargs: dict[str, Any]) -> None:
    settings: dict[str, Any] = {"username": "u", "client_keys": ["/k"], "known_hosts": "/kh"}
    with pytest.raises(ErrInvalid):
        SSHRunner("127.0.0.1", **{**settings, **kwargs})


# ---------------------------------------------------------------- commands


@pytest.mark.parametrize("args", NASTY_ARGS)
async def test_argv_reaches_program_verbatim(runner: SSHRunner, args: list[str]) -> None:
    result = await runner.run([*ECHO_ARGV, *args])
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == args
    assert not Path("/tmp/dispatch-pwned").exists()


async def test_many_commands_share_one_connection(runner: SSHRunner, sshd: FakeSSHD) -> None:
    for i in range(30):
        result = await runner.run(["echo", str(i)])
        assert result.stdout == f"{i}\n"
    assert runner.connections_opened == 1
    assert len(sshd.connections) == 1
    assert len(sshd.commands) == 30


async def test_concurrent_commands_share_one_connection(runner: SSHRunner,
                                                        sshd: FakeSSHD) -> None:
    results = await asyncio.gather(
        *(runner.run(["sh", "-c", 'sleep 0.05; echo "$1"', "sh", f"n{i}"]) for i in range(20)))
    assert [r.stdout for r in results] == [f"n{i}\n" for i in range(20)]
    assert runner.connections_opened == 1
    assert len(sshd.connections) == 1
    assert sshd.peak > 1  # they really overlapped


async def test_sessions_per_connection_are_capped(make_runner: Any, sshd: FakeSSHD) -> None:
    runner: SSHRunner = make_runner(max_sessions=3)
    await asyncio.gather(*(runner.run(["sleep", "0.05"]) for i in range(9)))
    assert sshd.peak == 3
    assert runner.connections_opened == 1


async def test_stdin_and_env(runner: SSHRunner) -> None:
    text = "line\n$(not expanded) 'q'\nümlaut\n" * 20000  # ~0.5 MB through flow control
    assert (await runner.run(["cat"], stdin=text)).stdout == text
    assert (await runner.run(["cat"], timeout=5)).stdout == ""  # no stdin: EOF at once
    result = await runner.run(["sh", "-c", 'echo "$TZ|$LANG|$EXTRA"'], env={"EXTRA": "a b'c"})
    assert result.stdout == "UTC|C.UTF-8|a b'c\n"
    utc = await runner.run(["date", "-d", "@0", "+%H:%M %z"])
    assert utc.stdout == "00:00 +0000\n"


async def test_nonzero_exit_and_signal_are_results(runner: SSHRunner) -> None:
    result = await runner.run(["sh", "-c", "echo out; echo err >&2; exit 7"])
    assert result == CommandResult(("sh", "-c", "echo out; echo err >&2; exit 7"), 7,
                                   "out\n", "err\n", result.duration_s)
    # -15 if the remote login shell execs the command, 128+15 if it forks it.
    assert (await runner.run(["sh", "-c", "kill -TERM $$"])).returncode in (-15, 143)
    missing = await runner.run(["dispatch-no-such-program"])
    assert missing.returncode == 127  # as LocalRunner reports it


async def test_run_script_runs_sh_with_the_script_on_stdin(runner: SSHRunner,
                                                           sshd: FakeSSHD) -> None:
    script = (
        "set -eu\n"
        "printf '%s\\n' \"$TZ\"\n"
        "cat <<'EOF'\n"
        "$(not expanded) 'it''s'\n"
        "EOF\n"
        "exit 3\n"
    )
    result = await runner.run_script(script)
    assert result.argv == ("sh", "-s")
    assert result.returncode == 3
    assert result.stdout == "UTC\n$(not expanded) 'it''s'\n"
    assert sshd.commands == ["env -- TZ=UTC LANG=C.UTF-8 sh -s"]


async def test_timeout_raises_transient_and_keeps_the_connection(
        runner: SSHRunner, sshd: FakeSSHD, tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    with pytest.raises(TransientError) as info:
        await runner.run(["sh", "-c", f"echo $$ > {pidfile}; sleep 30"], timeout=0.3)
    assert loop.time() - t0 < 2
    assert "timed out" in str(info.value)
    assert "unknown" in str(info.value)
    assert (await runner.run(["echo", "after"])).stdout == "after\n"
    assert runner.connections_opened == 1
    await _wait_gone(int(pidfile.read_text()))  # the channel close reached the server


async def test_connection_dropped_mid_command(runner: SSHRunner, sshd: FakeSSHD) -> None:
    await runner.run(["true"])
    sshd.command_started.clear()
    task = asyncio.create_task(runner.run(["sleep", "10"], timeout=5))
    await asyncio.wait_for(sshd.command_started.wait(), 2)
    sshd.drop_all()
    with pytest.raises(TransientError) as info:
        await asyncio.wait_for(task, 2)
    assert "unknown" in str(info.value)
    result = await runner.run(["echo", "again"])
    assert result.stdout == "again\n"
    assert runner.connections_opened == 2


async def test_cancelled_command_closes_its_channel(runner: SSHRunner, sshd: FakeSSHD,
                                                    tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    task = asyncio.create_task(runner.run(["sh", "-c", f"echo $$ > {pidfile}; sleep 30"]))
    while not pidfile.exists() or not pidfile.read_text().strip():
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await _wait_gone(int(pidfile.read_text()))
    assert (await runner.run(["true"])).returncode == 0
    assert runner.connections_opened == 1


async def test_close_then_reconnect(runner: SSHRunner) -> None:
    await runner.run(["true"])
    await runner.close()
    await runner.run(["true"])
    assert runner.connections_opened == 2


async def test_observer(make_runner: Any) -> None:
    seen: list[tuple[str, bool]] = []
    runner: SSHRunner = make_runner(observer=lambda name, d, ok: seen.append((name, ok)))
    await runner.run(["/bin/true"])
    await runner.run(["false"])
    with pytest.raises(TransientError):
        await runner.run(["sleep", "5"], timeout=0.1)
    await runner.run_script("exit 0")
    assert seen == [("true", True), ("false", False), ("sleep", False), ("sh", True)]


# ---------------------------------------------------------------- host keys, auth


@pytest.mark.parametrize("entry, says", [
    pytest.param("unknown", "is not in known_hosts", id="unknown-host"),
    pytest.param("impostor", "does not match known_hosts", id="mismatch"),
    pytest.param("other-type", "offers no host key of the types", id="mismatch-key-type"),
    pytest.param("wrong-port", "is not in known_hosts", id="entry-for-other-port"),
    pytest.param("missing-file", "cannot read known_hosts", id="no-file"),
])
async def test_host_key_refused_and_never_retried(make_runner: Any, sshd: FakeSSHD, keys: Keys,
                                                  tmp_path: Path, entry: str, says: str) -> None:
    text = {
        "unknown": "[127.0.0.1]:1 " + keys.host_public + "\n",
        "impostor": sshd.known_hosts_line(keys.impostor_public),
        "other-type": sshd.known_hosts_line(keys.other_type_public),
        "wrong-port": f"[127.0.0.1]:{sshd.port + 1} {keys.host_public}\n",
        "missing-file": None,
    }[entry]
    path = str(tmp_path / "absent") if text is None else write_known_hosts(tmp_path, text)
    runner: SSHRunner = make_runner(known_hosts=path)
    with pytest.raises(HostKeyError) as info:
        await runner.run(["touch", str(tmp_path / "ran")])
    assert says in str(info.value)
    assert f"127.0.0.1:{sshd.port}" in str(info.value)
    assert not (tmp_path / "ran").exists()
    assert sshd.commands == []
    assert runner.connections_opened == 0
    assert len(sshd.connections) <= 1  # one attempt at most: never retried


async def test_refused_client_key_is_permanent(make_runner: Any, sshd: FakeSSHD,
                                               keys: Keys) -> None:
    runner: SSHRunner = make_runner(client_keys=[str(keys.stranger_key)])
    with pytest.raises(SSHAuthError, match="refused public-key authentication"):
        await runner.run(["true"])
    assert len(sshd.connections) == 1
    assert sshd.commands == []


async def test_unreadable_client_key_is_permanent(make_runner: Any, tmp_path: Path) -> None:
    runner: SSHRunner = make_runner(client_keys=[str(tmp_path / "no-such-key")])
    with pytest.raises(SSHAuthError, match="cannot load client key"):
        await runner.run(["true"])


# ---------------------------------------------------------------- reconnect and backoff


class FakeTime:
    """A clock that moves only when the runner sleeps; optionally acts on each sleep."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []
        self.on_sleep: Any = None

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        if self.on_sleep is not None:
            await self.on_sleep()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def test_cannot_connect_backs_off_then_gives_up(make_runner: Any) -> None:
    t = FakeTime()
    runner: SSHRunner = make_runner(port=free_port(), connect_attempts=4, clock=t.clock,
                                    sleep=t.sleep, rng=random.Random(7), backoff_initial=0.5,
                                    backoff_max=1.5)
    with pytest.raises(TransientError) as info:
        await runner.run(["true"], timeout=60)
    assert "cannot connect to 127.0.0.1" in str(info.value)
    assert "4 attempt(s)" in str(info.value)
    assert len(t.sleeps) == 3
    for got, full in zip(t.sleeps, [0.5, 1.0, 1.5], strict=True):  # doubling, capped
        assert full / 2 <= got <= full
    assert 0.75 <= info.value.retry_after <= 1.5
    # The backoff carries over to the next call: too soon for a short timeout ...
    with pytest.raises(TransientError, match="backing off") as again:
        await runner.run(["true"], timeout=0.5)
    assert again.value.retry_after == pytest.approx(info.value.retry_after)
    assert len(t.sleeps) == 3  # ... which did not even try
    assert runner.connections_opened == 0


async def test_reconnects_when_the_server_comes_back(keys: Keys, tmp_path: Path) -> None:
    port = free_port()
    server = FakeSSHD(keys)
    server.port = port
    t = FakeTime()

    async def start_server_once() -> None:
        if server._acceptor is None:
            await server.start(port)

    t.on_sleep = start_server_once
    runner = SSHRunner("127.0.0.1", port=port, username="tester",
                       client_keys=[str(keys.client_key)],
                       known_hosts=write_known_hosts(tmp_path, server.known_hosts_line()),
                       clock=t.clock, sleep=t.sleep, rng=random.Random(1))
    try:
        result = await runner.run(["echo", "up"])
        assert result.stdout == "up\n"
        assert len(t.sleeps) == 1  # one failed attempt, one backoff, then connected
        assert runner.connections_opened == 1
        server.drop_all()
        await asyncio.sleep(0.05)
        assert (await runner.run(["echo", "again"])).stdout == "again\n"
        assert len(t.sleeps) == 1  # a fresh loss reconnects at once
        assert runner.connections_opened == 2
    finally:
        await runner.close()
        await server.stop()


async def _wait_gone(pid: int, within: float = 3.0) -> None:
    end = time.monotonic() + within
    while True:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except (FileNotFoundError, ProcessLookupError):  # ESRCH: it went while being read
            return
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            return
        assert time.monotonic() < end, f"pid {pid} still running"
        await asyncio.sleep(0.02)


# ---------------------------------------------------------------- the real sshd

SLURM_ENV = Path("/var/lib/dispatch-slurm/env")


def slurm_env() -> dict[str, str]:
    if not SLURM_ENV.exists():  # the test command starts the cluster; never skip silently
        subprocess.run(["scripts/slurm-up"], check=True, cwd=Path(__file__).parent.parent)
    env: dict[str, str] = {}
    for line in SLURM_ENV.read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep and not key.startswith("#"):
            env[key.strip()] = value.strip().strip("'\"")
    return env


def real_runner(env: dict[str, str], known_hosts: str | None = None) -> SSHRunner:
    return SSHRunner("127.0.0.1", port=int(env["SSH_PORT"]), username=env["SUBMIT_USER"],
                     client_keys=[env["SSH_KEY"]],
                     known_hosts=known_hosts or env["SSH_KNOWN_HOSTS"])


@pytest.mark.slurm
async def test_real_sshd(tmp_path: Path) -> None:
    env = slurm_env()
    runner = real_runner(env)
    try:
        who = await runner.run(["id", "-un"])
        assert (who.returncode, who.stdout) == (0, env["SUBMIT_USER"] + "\n")
        args = ["a b", "$(id)", "'", '"', "\n", "", "*", "~", "-n", "ümlaut"]
        echoed = await runner.run(["printf", "%s\\0", *args])
        assert echoed.stdout.split("\0")[:-1] == args
        results = await asyncio.gather(*(runner.run(["echo", str(i)]) for i in range(20)))
        assert [r.stdout for r in results] == [f"{i}\n" for i in range(20)]
        script = await runner.run_script("set -eu\nprintf '%s|' \"$TZ\" \"$LANG\"\nexit 5\n")
        assert (script.returncode, script.stdout) == (5, "UTC|C.UTF-8|")
        pidfile = f"/tmp/dispatch-runner-test-{os.getpid()}.pid"
        with pytest.raises(TransientError, match="timed out"):
            await runner.run(["sh", "-c", f"echo $$ > {pidfile}; exec sleep 30"], timeout=0.5)
        await _wait_gone(int(Path(pidfile).read_text()))  # sshd delivered the KILL
        Path(pidfile).unlink()
        assert runner.connections_opened == 1
    finally:
        await runner.close()

    public = " ".join(asyncssh.generate_private_key("ssh-ed25519")
                      .export_public_key("openssh").decode().split()[:2])
    wrong = write_known_hosts(tmp_path, f"[127.0.0.1]:{env['SSH_PORT']} {public}\n")
    impostor = real_runner(env, known_hosts=wrong)
    with pytest.raises(HostKeyError, match="does not match known_hosts"):
        await impostor.run(["touch", f"/tmp/dispatch-runner-test-{os.getpid()}.ran"])
    assert not Path(f"/tmp/dispatch-runner-test-{os.getpid()}.ran").exists()
    assert impostor.connections_opened == 0
