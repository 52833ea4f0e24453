"""How a command reaches the Slurm host: the only package that runs commands.

Nothing else in dispatch-controller starts a process or opens an SSH channel
(an import-linter contract enforces it). Callers hand a ``Runner`` an argv list
or a POSIX sh script and get a ``CommandResult`` back:

* ``LocalRunner`` runs it on this host with ``asyncio.create_subprocess_exec``;
* ``SSHRunner`` runs it on the Slurm host over one reused asyncssh connection.

A non-zero exit status is a result, not an error: the caller classifies it.
Timeouts and transport failures raise ``TransientError`` (outcome unknown);
malformed argv raises ``ErrInvalid``.
"""

from controller.runner.base import CommandResult, Observer, RateLimiter, Runner
from controller.runner.local import LocalRunner
from controller.runner.ssh import HostKeyError, SSHAuthError, SSHRunner, SSHSetupError

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
