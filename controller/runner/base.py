"""The runner seam: the ``Runner`` protocol, ``CommandResult``, and what every runner shares.

Owns the contract both transports honour (argv validation, the controlled
environment, timeouts, the observer hook) and the global ``RateLimiter``. Runs
nothing itself.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from controller.errors import CommandFailed, ErrInvalid

log = logging.getLogger(__name__)

# every Slurm command is killed after this; the one definition of the default of
# ``transport.command_timeout_s`` (controller.config), used by the runners and the adapter
DEFAULT_COMMAND_TIMEOUT_S = 30.0

Observer = Callable[[str, float, bool], None]
"""Called once per command with (argv[0] basename, duration in seconds, ok).

``ok`` is true only when the command ran to completion with exit status 0. The
observer must be cheap and must not raise; if it does, the error is logged and
swallowed, because losing a command's result to a metrics bug would turn a
known outcome into an unknown one.
"""

Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]

# Every command sees these, whatever the caller passes: Slurm's clients parse
# and print times in the local time zone (SPEC §5), and C.UTF-8 keeps their
# messages and number formats stable.
FIXED_ENV: Mapping[str, str] = {"TZ": "UTC", "LANG": "C.UTF-8"}

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


@dataclass(frozen=True, slots=True)
class CommandResult:
    """What a finished command produced; shaped like ``subprocess.CompletedProcess``.

    ``argv`` is the command as the caller asked for it (``("/bin/sh", "-s")`` or
    ``("sh", "-s")`` for a script), without transport prefixes such as
    ``runuser`` or ``env``. ``returncode`` is negative (-N) when the command was
    killed by signal N. Output is decoded as UTF-8 with undecodable bytes replaced.
    """

    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    duration_s: float

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def check_returncode(self) -> None:
        """Raise ``CommandFailed`` when the exit status is non-zero."""
        if self.returncode != 0:
            raise CommandFailed(
                f"{command_name(self.argv)} exited with status {self.returncode}",
                argv=self.argv, returncode=self.returncode, stderr=self.stderr,
            )


@runtime_checkable
class Runner(Protocol):
    """Runs one command or one POSIX sh script on the Slurm host.

    Does not raise on a non-zero exit status. Raises ``TransientError`` when the
    command timed out (it is killed; outcome unknown), when the host cannot be
    reached, or when the connection drops while the command runs (outcome
    unknown); ``ErrInvalid`` for an empty argv or one containing NUL.
    ``timeout=None`` means the runner's default timeout; it bounds the whole call
    (connecting included), not the wait for a rate-limiter token.
    """

    async def run(self, argv: Sequence[str], *, stdin: str | None = None,
                  timeout: float | None = None,
                  env: Mapping[str, str] | None = None) -> CommandResult: ...

    async def run_script(self, script: str, *, timeout: float | None = None) -> CommandResult: ...

    async def close(self) -> None: ...


class RateLimiter:
    """A token bucket: at most ``burst`` commands at once, ``rate`` per second sustained.

    One instance can be shared by every runner of the process to enforce one
    global budget over all Slurm commands.
    """

    def __init__(self, rate: float, *, burst: int = 1, clock: Clock = time.monotonic,
                 sleep: Sleep = asyncio.sleep) -> None:
        if not (math.isfinite(rate) and rate > 0):
            raise ErrInvalid(f"must be a positive number, got {rate!r}", field="rate")
        if burst < 1:
            raise ErrInvalid(f"must be at least 1, got {burst!r}", field="burst")
        self._rate = rate
        self._burst = float(burst)
        self._clock = clock
        self._sleep = sleep
        self._tokens = float(burst)
        self._updated = clock()

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self._burst, self._tokens + (now - self._updated) * self._rate)
        self._updated = now

    async def acquire(self) -> None:
        """Take a token, waiting until it is due.

        Each caller reserves its token at once (the bucket may go into debt) and
        sleeps until the debt is paid off, so waiters are served in arrival
        order without a lock held across the sleep. A cancelled waiter gives
        its token back.
        """
        self._refill()
        self._tokens -= 1.0
        if self._tokens >= 0:
            return
        try:
            await self._sleep(-self._tokens / self._rate)
        except asyncio.CancelledError:
            self._tokens = min(self._burst, self._tokens + 1.0)
            raise


def validate_argv(argv: Sequence[str]) -> tuple[str, ...]:
    """Return argv as a tuple, or raise ``ErrInvalid`` if no transport can run it.

    argv[0] must not contain ``=``: the SSH transport runs ``env NAME=VALUE...
    argv``, where ``env`` would read such a word as one more assignment.
    """
    if isinstance(argv, str):
        raise ErrInvalid("must be a sequence of strings, not a string", field="argv")
    args = tuple(argv)
    if not args:
        raise ErrInvalid("must not be empty", field="argv")
    for i, arg in enumerate(args):
        if not isinstance(arg, str):
            raise ErrInvalid(f"element {i} is {type(arg).__name__}, not str", field="argv")
        if "\0" in arg:
            raise ErrInvalid(f"element {i} contains a NUL character", field="argv")
    if not args[0]:
        raise ErrInvalid("the program name is empty", field="argv")
    if "=" in args[0]:
        raise ErrInvalid(f"the program name {args[0]!r} contains '='", field="argv")
    return args


def validate_env(env: Mapping[str, str] | None) -> dict[str, str]:
    """Return env as a dict, or raise ``ErrInvalid`` for names or values a shell cannot carry."""
    if env is None:
        return {}
    out: dict[str, str] = {}
    for name, value in env.items():
        if not _ENV_NAME.match(name):
            raise ErrInvalid(f"{name!r} is not a valid variable name", field="env")
        if "\0" in value:
            raise ErrInvalid(f"the value of {name} contains a NUL character", field="env")
        out[name] = value
    return out


def check_timeout(timeout: float, *, field: str = "timeout") -> float:
    if not (math.isfinite(timeout) and timeout > 0):
        raise ErrInvalid(f"must be a positive number of seconds, got {timeout!r}", field=field)
    return float(timeout)


def command_name(argv: Sequence[str]) -> str:
    """The name a command is reported under: the basename of argv[0]."""
    return os.path.basename(argv[0]) if argv else ""


def notify(observer: Observer | None, name: str, duration_s: float, ok: bool) -> None:
    """Call the observer, never letting its failure escape (see ``Observer``)."""
    if observer is None:
        return
    try:
        observer(name, duration_s, ok)
    except Exception:
        log.exception("runner observer failed", extra={"command": name})
