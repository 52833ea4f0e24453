"""How a command reaches the Slurm host: the only package that runs commands.

Nothing else in dispatch-controller starts a process or opens an SSH channel
(an import-linter contract enforces it). Callers hand a ``Runner`` an argv list
or a POSIX sh script and get a ``CommandResult`` back:

* ``LocalRunner`` runs it on this host with ``asyncio.create_subprocess_exec``;
* ``SSHRunner`` runs it on the Slurm host over one reused asyncssh connection.

A non-zero exit status is a result, not an error: the caller classifies it.
Timeouts and transport failures raise ``TransientError`` (outcome unknown);
malformed argv raises ``ErrInvalid``.

The SSH names are imported on first use: asyncssh and cryptography cost a process 15 MB
of memory, which a daemon on the local transport never needs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from controller.runner.base import CommandResult, Observer, RateLimiter, Runner
from controller.runner.local import LocalRunner

if TYPE_CHECKING:
    from controller.runner.ssh import HostKeyError, SSHAuthError, SSHRunner, SSHSetupError

_SSH_NAMES = frozenset({"HostKeyError", "SSHAuthError", "SSHRunner", "SSHSetupError"})


def __getattr__(name: str) -> object:
    if name in _SSH_NAMES:
        return getattr(importlib.import_module("controller.runner.ssh"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CommandResult",
    "HostKeyError",
    "LocalRunner",
    "Observer",
    "RateLimiter",
    "Runner",
    "SSHAuthError",
    "SSHRunner",
    "SSHSetupError",
]
