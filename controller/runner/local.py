"""``LocalRunner``: run commands on this host with ``asyncio.create_subprocess_exec``.

Owns the child process from spawn to reap: a clean, controlled environment,
the working directory, ``runuser`` when commands must run as another user,
and killing the whole process group on timeout or cancellation.

A missing program is reported the way a shell (and the SSH transport, where
``env`` execs it) reports it: a result with exit status 127 and
``<name>: command not found`` on stderr, or 126 when the file exists but cannot
be executed. It is not raised, so both transports behave the same, and so a
missing ``sbatch`` looks the same whether ``run`` or a ``run_script`` script
hit it; the caller classifies 126/127 as a configuration error.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import pwd
import shutil
import signal
import time
from asyncio import subprocess as aio_subprocess
from collections.abc import Mapping, Sequence

from controller.errors import ErrInvalid, TransientError
from controller.runner.base import (
    DEFAULT_COMMAND_TIMEOUT_S,
    FIXED_ENV,
    Clock,
    CommandResult,
    Observer,
    RateLimiter,
    check_timeout,
    command_name,
    notify,
    validate_argv,
    validate_env,
)

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SCRIPT_ARGV = ("/bin/sh", "-s")


class LocalRunner:
    """Runs argv lists and sh scripts as local child processes.

    The child's environment is built from scratch: ``PATH`` (``DEFAULT_PATH``),
    ``HOME``/``USER``/``LOGNAME`` of the user it runs as, ``LANG=C.UTF-8`` and
    ``TZ=UTC``, then ``env`` (constructor), then ``env`` (per call). Nothing of
    the controller's own environment leaks through. The working directory is
    that user's home directory (``/`` if it does not exist), as it is over SSH.

    ``run_as``: when set and different from the current user, each command is
    prefixed with ``runuser -u <user> --`` (needs root; meant for tests, where
    the controller runs as root; production runs as the submit user directly).
    """

    def __init__(self, *, run_as: str | None = None,
                 default_timeout: float = DEFAULT_COMMAND_TIMEOUT_S,
                 env: Mapping[str, str] | None = None, observer: Observer | None = None,
                 limiter: RateLimiter | None = None, clock: Clock = time.monotonic) -> None:
        self._default_timeout = check_timeout(default_timeout, field="default_timeout")
        self._observer = observer
        self._limiter = limiter
        self._clock = clock
        current = pwd.getpwuid(os.geteuid())
        if run_as is None or run_as == current.pw_name:
            user = current
            self._prefix: tuple[str, ...] = ()
        else:
            try:
                user = pwd.getpwnam(run_as)
            except KeyError:
                raise ErrInvalid(f"no such user {run_as!r}", field="run_as") from None
            if os.geteuid() != 0:
                raise ErrInvalid(f"running commands as {run_as!r} needs root", field="run_as")
            runuser = shutil.which("runuser", path=DEFAULT_PATH)
            if runuser is None:
                raise ErrInvalid("runuser is not installed", field="run_as")
            self._prefix = (runuser, "-u", user.pw_name, "--")
        self.user = user.pw_name
        self._env: dict[str, str] = {
            "PATH": DEFAULT_PATH,
            "HOME": user.pw_dir,
            "USER": user.pw_name,
            "LOGNAME": user.pw_name,
            **FIXED_ENV,
            **validate_env(env),
        }
        self._cwd = user.pw_dir if os.path.isdir(user.pw_dir) else "/"

    async def run(self, argv: Sequence[str], *, stdin: str | None = None,
                  timeout: float | None = None,
                  env: Mapping[str, str] | None = None) -> CommandResult:
        args = validate_argv(argv)
        child_env = {**self._env, **validate_env(env)}
        limit = self._default_timeout if timeout is None else check_timeout(timeout)
        return await self._execute(args, stdin=stdin, timeout=limit, env=child_env)

    async def run_script(self, script: str, *, timeout: float | None = None) -> CommandResult:
        limit = self._default_timeout if timeout is None else check_timeout(timeout)
        return await self._execute(SCRIPT_ARGV, stdin=script, timeout=limit, env=self._env)

    async def close(self) -> None:
        """Nothing to release: every child is reaped before its call returns."""

    async def _execute(self, argv: tuple[str, ...], *, stdin: str | None, timeout: float,
                       env: dict[str, str]) -> CommandResult:
        if self._limiter is not None:
            await self._limiter.acquire()
        start = self._clock()
        ok = False
        try:
            result = await self._spawn(argv, stdin=stdin, timeout=timeout, env=env, start=start)
            ok = result.returncode == 0
            return result
        finally:
            notify(self._observer, command_name(argv), self._clock() - start, ok)

    async def _spawn(self, argv: tuple[str, ...], *, stdin: str | None, timeout: float,
                     env: dict[str, str], start: float) -> CommandResult:
        name = command_name(argv)
        missing = _not_executable(argv[0], path=env.get("PATH", ""), cwd=self._cwd)
        if missing is not None:
            return CommandResult(argv, missing, "", f"{argv[0]}: {_MISSING[missing]}\n",
                                 self._clock() - start)
        try:
            proc = await asyncio.create_subprocess_exec(
                *self._prefix, *argv,
                stdin=aio_subprocess.DEVNULL if stdin is None else aio_subprocess.PIPE,
                stdout=aio_subprocess.PIPE, stderr=aio_subprocess.PIPE,
                env=env, cwd=self._cwd, start_new_session=True,
            )
        except FileNotFoundError:
            return CommandResult(argv, 127, "", f"{argv[0]}: {_MISSING[127]}\n",
                                 self._clock() - start)
        except PermissionError:
            return CommandResult(argv, 126, "", f"{argv[0]}: {_MISSING[126]}\n",
                                 self._clock() - start)
        except OSError as exc:
            if exc.errno == errno.ENOEXEC:
                return CommandResult(argv, 126, "", f"{argv[0]}: {exc.strerror}\n",
                                     self._clock() - start)
            if exc.errno == errno.E2BIG:
                raise ErrInvalid("the command line is too long", field="argv") from exc
            raise TransientError(f"cannot start {name}: {exc}") from exc

        data = None if stdin is None else stdin.encode("utf-8")
        try:
            out, err = await asyncio.wait_for(proc.communicate(data), timeout)
        except TimeoutError:
            await _kill_group(proc)
            raise TransientError(
                f"command {name} timed out after {timeout:g}s and was killed;"
                " its outcome is unknown") from None
        except BaseException:  # cancelled: leave nothing running behind the caller
            await _kill_group(proc)
            raise
        assert proc.returncode is not None  # communicate() returns after wait()
        return CommandResult(argv, proc.returncode, out.decode("utf-8", "replace"),
                             err.decode("utf-8", "replace"), self._clock() - start)


_MISSING = {127: "command not found", 126: "permission denied"}


def _not_executable(program: str, *, path: str, cwd: str) -> int | None:
    """126/127 as a shell would exit for ``program``, or None if it can be executed.

    Checked here because ``runuser`` exits 1 for both, indistinguishable from
    the program's own failure. A relative path is looked up from the child's
    working directory, as exec will.
    """
    if "/" in program:
        program = os.path.join(cwd, program)
    if shutil.which(program, path=path) is not None:
        return None
    return 126 if "/" in program and os.path.exists(program) else 127


async def _kill_group(proc: aio_subprocess.Process) -> None:
    """SIGKILL the child's whole process group (it leads a session of its own), then reap it.

    Killed even if the child itself has exited: a grandchild may still hold the
    output pipes open.
    """
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    await proc.wait()
