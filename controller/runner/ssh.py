"""``SSHRunner``: run commands on the Slurm host over one reused asyncssh connection.

Owns the connection's life (lazy open, host-key checking against a known_hosts
file, reconnect with jittered exponential backoff), one channel per command,
and the rendering of an argv list into the one command line SSH can carry.
``command_line`` is the single place where quoting happens for this transport.

The remote user's login shell parses that command line, so it must be a POSIX
shell (sh, dash, bash, zsh, ksh); csh-family shells and fish are not supported.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import shlex
import time
from collections.abc import Mapping, Sequence

import asyncssh

from controller.errors import DispatchError, ErrInvalid, TransientError
from controller.runner.base import (
    DEFAULT_COMMAND_TIMEOUT_S,
    FIXED_ENV,
    Clock,
    CommandResult,
    Observer,
    RateLimiter,
    Sleep,
    check_timeout,
    command_name,
    notify,
    validate_argv,
    validate_env,
)

log = logging.getLogger(__name__)

SCRIPT_ARGV = ("sh", "-s")


class SSHSetupError(DispatchError):
    """The SSH connection cannot be set up as configured; permanent, never retried."""


class HostKeyError(SSHSetupError):
    """The host is not in known_hosts, or its key does not match it."""

    def __init__(self, message: str, *, host: str, port: int, known_hosts: str) -> None:
        super().__init__(message)
        self.host = host
        self.port = port
        self.known_hosts = known_hosts


class SSHAuthError(SSHSetupError):
    """The server refused our client keys, or a client key cannot be loaded."""


def command_line(argv: Sequence[str], env: Mapping[str, str] | None = None) -> str:
    """Render argv as one POSIX sh command line: ``env -- TZ=UTC LANG=C.UTF-8 [K=V...] argv``.

    Every word is ``shlex.quote``d, so the remote shell hands each element of
    argv to the program verbatim. Per-call ``env`` entries override the fixed
    ones. ``--`` stops ``env`` reading a program name that starts with ``-`` as
    an option; ``validate_argv`` has already refused a program name with ``=``.
    """
    args = validate_argv(argv)
    assignments = {**FIXED_ENV, **validate_env(env)}
    words = ["env", "--", *(f"{k}={v}" for k, v in assignments.items()), *args]
    return " ".join(shlex.quote(w) for w in words)


class SSHRunner:
    """Runs argv lists and sh scripts on ``host`` over one multiplexed SSH connection.

    The connection is opened on first use and shared by every command, one
    channel each, at most ``max_sessions`` at once (OpenSSH's ``MaxSessions``
    defaults to 10; more would be refused). When it is found closed, the next
    call reconnects: up to ``connect_attempts`` attempts within that call's
    timeout, with jittered exponential backoff (``backoff_initial`` doubling up
    to ``backoff_max``) that carries over between calls until a connect succeeds.

    ``known_hosts`` is required and read on every connect: an unknown host or a
    mismatched key raises ``HostKeyError`` and is never retried. Only the given
    ``client_keys`` are offered; no agent, no ``~/.ssh/config``, no passwords.

    A call's timeout covers connecting, waiting for a free session and the
    command. On timeout the channel is signalled (KILL, if the server honours
    signal requests) and closed; the remote command may still be running.
    ``close()`` drops the connection; a later call opens a new one.
    """

    def __init__(self, host: str, *, port: int = 22, username: str,
                 client_keys: Sequence[str], known_hosts: str,
                 connect_timeout: float = 10.0, default_timeout: float = DEFAULT_COMMAND_TIMEOUT_S,
                 keepalive_interval: float = 15.0, keepalive_count_max: int = 3,
                 max_sessions: int = 10, connect_attempts: int = 4,
                 backoff_initial: float = 0.5, backoff_max: float = 30.0,
                 observer: Observer | None = None, limiter: RateLimiter | None = None,
                 clock: Clock = time.monotonic, sleep: Sleep = asyncio.sleep,
                 rng: random.Random | None = None) -> None:
        if not host:
            raise ErrInvalid("must not be empty", field="host")
        if not username:
            raise ErrInvalid("must not be empty", field="username")
        if not known_hosts:
            raise ErrInvalid("a known_hosts file is required", field="known_hosts")
        if isinstance(client_keys, str) or not client_keys:
            raise ErrInvalid("must be a non-empty list of key file paths", field="client_keys")
        if max_sessions < 1:
            raise ErrInvalid("must be at least 1", field="max_sessions")
        if connect_attempts < 1:
            raise ErrInvalid("must be at least 1", field="connect_attempts")
        self._host = host
        self._port = port
        self._target = f"{host}:{port}"
        self._username = username
        self._client_keys = tuple(client_keys)
        self._known_hosts = known_hosts
        self._connect_timeout = check_timeout(connect_timeout, field="connect_timeout")
        self._default_timeout = check_timeout(default_timeout, field="default_timeout")
        self._keepalive_interval = keepalive_interval
        self._keepalive_count_max = keepalive_count_max
        self._connect_attempts = connect_attempts
        self._backoff_initial = check_timeout(backoff_initial, field="backoff_initial")
        self._backoff_max = check_timeout(backoff_max, field="backoff_max")
        self._observer = observer
        self._limiter = limiter
        self._clock = clock
        self._sleep = sleep
        self._rng = rng if rng is not None else random.Random()
        self._conn: asyncssh.SSHClientConnection | None = None
        self._connect_lock = asyncio.Lock()
        self._sessions = asyncio.Semaphore(max_sessions)
        self._failures = 0  # consecutive failed connects
        self._retry_at = float("-inf")  # no connect attempt before this (clock time)
        self.connections_opened = 0

    async def run(self, argv: Sequence[str], *, stdin: str | None = None,
                  timeout: float | None = None,
                  env: Mapping[str, str] | None = None) -> CommandResult:
        args = validate_argv(argv)
        line = command_line(args, env)
        limit = self._default_timeout if timeout is None else check_timeout(timeout)
        return await self._execute(args, line, stdin=stdin, timeout=limit)

    async def run_script(self, script: str, *, timeout: float | None = None) -> CommandResult:
        limit = self._default_timeout if timeout is None else check_timeout(timeout)
        return await self._execute(SCRIPT_ARGV, command_line(SCRIPT_ARGV), stdin=script,
                                   timeout=limit)

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
            await conn.wait_closed()

    async def _execute(self, argv: tuple[str, ...], line: str, *, stdin: str | None,
                       timeout: float) -> CommandResult:
        if self._limiter is not None:
            await self._limiter.acquire()
        start = self._clock()
        ok = False
        try:
            result = await self._run_remote(argv, line, stdin=stdin, start=start,
                                            deadline=start + timeout)
            ok = result.returncode == 0
            return result
        finally:
            notify(self._observer, command_name(argv), self._clock() - start, ok)

    async def _run_remote(self, argv: tuple[str, ...], line: str, *, stdin: str | None,
                          start: float, deadline: float) -> CommandResult:
        name = command_name(argv)
        conn = await self._connection(deadline)
        try:
            async with asyncio.timeout(self._remaining(deadline)):
                await self._sessions.acquire()
        except TimeoutError:
            raise TransientError(
                f"timed out waiting for a free SSH session on {self._target} for {name};"
                " the command did not start") from None
        proc: asyncssh.SSHClientProcess[str] | None = None
        try:
            async with asyncio.timeout(self._remaining(deadline)):
                proc = await conn.create_process(line, encoding="utf-8", errors="replace")
                if stdin:
                    proc.stdin.write(stdin)
                proc.stdin.write_eof()
                done = await proc.wait()
        except TimeoutError:
            _abandon(proc)
            raise TransientError(
                f"command {name} on {self._target} timed out after {deadline - start:g}s"
                " and its channel was closed; its outcome is unknown") from None
        except asyncssh.ChannelOpenError as exc:
            raise TransientError(
                f"cannot open an SSH session on {self._target} for {name}: {exc.reason};"
                " the command did not start") from exc
        except (asyncssh.Error, OSError) as exc:
            _abandon(proc)
            raise TransientError(
                f"SSH connection to {self._target} failed while running {name}: {exc};"
                " its outcome is unknown") from exc
        except BaseException:  # cancelled: close the channel behind the caller
            _abandon(proc)
            raise
        finally:
            self._sessions.release()
        if done.returncode is None:  # channel closed without an exit status
            raise TransientError(
                f"SSH connection to {self._target} was lost while running {name};"
                " its outcome is unknown")
        return CommandResult(argv, done.returncode, _text(done.stdout), _text(done.stderr),
                             self._clock() - start)

    def _remaining(self, deadline: float) -> float:
        return max(0.0, deadline - self._clock())

    async def _connection(self, deadline: float) -> asyncssh.SSHClientConnection:
        conn = self._conn
        if conn is not None and not conn.is_closed():
            return conn
        try:
            async with asyncio.timeout(self._remaining(deadline)):
                await self._connect_lock.acquire()
        except TimeoutError:
            raise TransientError(f"timed out waiting to connect to {self._target}") from None
        try:
            conn = self._conn
            if conn is not None and not conn.is_closed():
                return conn  # another caller reconnected while we waited
            self._conn = conn = await self._reconnect(deadline)
            return conn
        finally:
            self._connect_lock.release()

    async def _reconnect(self, deadline: float) -> asyncssh.SSHClientConnection:
        attempt = 0
        while True:
            wait = self._retry_at - self._clock()
            if wait > 0:
                if self._clock() + wait >= deadline:
                    raise TransientError(
                        f"cannot connect to {self._target}: backing off after"
                        f" {self._failures} failed attempt(s)", retry_after=wait)
                await self._sleep(wait)
            remaining = deadline - self._clock()
            if remaining <= 0:
                raise TransientError(f"timed out connecting to {self._target}")
            attempt += 1
            try:
                conn = await self._open(min(self._connect_timeout, remaining))
            except SSHSetupError:
                raise
            except (OSError, asyncssh.Error, TimeoutError) as exc:
                self._failures += 1
                delay = self._backoff(self._failures)
                self._retry_at = self._clock() + delay
                log.warning("ssh connect failed", extra={
                    "target": self._target, "attempt": attempt, "error": str(exc),
                    "retry_in_s": round(delay, 3)})
                if attempt >= self._connect_attempts or self._retry_at >= deadline:
                    raise TransientError(
                        f"cannot connect to {self._target} after {attempt} attempt(s):"
                        f" {exc or type(exc).__name__}", retry_after=delay) from exc
                continue
            self._failures = 0
            self._retry_at = float("-inf")
            self.connections_opened += 1
            log.info("ssh connected", extra={
                "target": self._target, "connections_opened": self.connections_opened})
            return conn

    def _backoff(self, failures: int) -> float:
        """The delay before the next attempt: doubling, capped, jittered to [d/2, d]."""
        delay = min(self._backoff_max, self._backoff_initial * 2.0 ** min(failures - 1, 30))
        return delay * (0.5 + 0.5 * self._rng.random())

    async def _open(self, timeout: float) -> asyncssh.SSHClientConnection:
        """One connect attempt; host-key and authentication failures become SSHSetupError."""
        try:
            known = asyncssh.read_known_hosts(self._known_hosts)
        except (OSError, ValueError) as exc:
            raise HostKeyError(
                f"cannot verify the host key of {self._target}: cannot read known_hosts"
                f" {self._known_hosts}: {exc}", host=self._host,
                port=self._port, known_hosts=self._known_hosts) from exc
        keys = []
        for path in self._client_keys:
            try:
                keys.append(asyncssh.read_private_key(path))
            except (OSError, ValueError) as exc:
                raise SSHAuthError(f"cannot load client key {path}: {exc}") from exc
        try:
            async with asyncio.timeout(timeout):
                return await asyncssh.connect(
                    self._host, self._port, username=self._username, client_keys=keys,
                    known_hosts=known, config=[], agent_path=None,
                    preferred_auth="publickey", x509_trusted_certs=None,
                    keepalive_interval=self._keepalive_interval,
                    keepalive_count_max=self._keepalive_count_max)
        except asyncssh.HostKeyNotVerifiable as exc:
            raise self._host_key_error(known) from exc
        except asyncssh.KeyExchangeFailed as exc:
            if self._has_entry(known):  # asyncssh offers only the key types we trust
                raise HostKeyError(
                    f"host {self._target} offers no host key of the types known_hosts"
                    f" {self._known_hosts} holds for it ({exc.reason}); refusing to connect",
                    host=self._host, port=self._port, known_hosts=self._known_hosts) from exc
            raise SSHSetupError(f"key exchange with {self._target} failed: {exc.reason}") from exc
        except asyncssh.PermissionDenied as exc:
            raise SSHAuthError(
                f"{self._target} refused public-key authentication for {self._username!r}:"
                f" {exc.reason}") from exc

    def _has_entry(self, known: asyncssh.SSHKnownHosts) -> bool:
        trusted_keys, trusted_cas, *_ = known.match(self._host, "", self._port)
        return bool(trusted_keys or trusted_cas)

    def _host_key_error(self, known: asyncssh.SSHKnownHosts) -> HostKeyError:
        if self._has_entry(known):
            message = (f"host key for {self._target} does not match known_hosts"
                       f" {self._known_hosts}; refusing to connect (the key changed, or"
                       " this is not the expected host)")
        else:
            message = (f"host {self._target} is not in known_hosts {self._known_hosts};"
                       " refusing to connect to an unknown host")
        return HostKeyError(message, host=self._host, port=self._port,
                            known_hosts=self._known_hosts)


def _abandon(proc: asyncssh.SSHClientProcess[str] | None) -> None:
    """Ask the server to kill the command, then close its channel; best effort."""
    if proc is None:
        return
    with contextlib.suppress(OSError, asyncssh.Error):
        proc.send_signal("KILL")
    proc.close()


def _text(data: object) -> str:
    if data is None:
        return ""
    if isinstance(data, bytes):
        return data.decode("utf-8", "replace")
    return str(data)
