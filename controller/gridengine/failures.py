"""Error mapping: the one place that reads Grid Engine's messages. ``ge_failure`` turns
a failed command's exit status and text into the ``controller.errors`` exception that
means it, from one table of patterns (first match wins; NOTES.md has the messages as
recorded on 8.1.9).
"""

from __future__ import annotations

import re
from typing import Final

from controller.errors import (
    CommandFailed,
    DispatchError,
    ErrBackPressure,
    ErrConflict,
    ErrInvalid,
    ErrNotFound,
    ErrUnsupported,
    TransientError,
)
from controller.runner.base import CommandResult

# Reaching qmaster first: "unable to contact qmaster" is about the connection, whatever
# the request was. A per-user or global job limit frees itself as jobs leave:
# back-pressure. "denied" without "does not exist" is a permission (an operator hold
# released by its owner: exit 10).
_TABLE: Final[tuple[tuple[re.Pattern[str], type[DispatchError]], ...]] = tuple(
    (re.compile(pattern, re.IGNORECASE), kind) for pattern, kind in (
        (r"unable to contact qmaster|commlib error|unable to send message to qmaster"
         r"|failed receiving gdi request|got no connection|can't connect|"
         r"cell directory .* doesn't exist", TransientError),
        (r"only [0-9]+ jobs are allowed per user|max_u_jobs|max_jobs|"
         r"exceeds .*limit", ErrBackPressure),
        (r"unable to run job|not a valid object name|not allowed in objectname|"
         r"must not contain|unknown queue|parallel environment|lower than minimum "
         r"(?:user|group) id|no script in your request|invalid option|unknown resource",
         ErrInvalid),
        (r"does not exist|following jobs do not exist", ErrNotFound),
        (r"must be (?:operator|manager)|denied", ErrConflict),
    ))


def ge_failure(result: CommandResult, *, operation: str) -> DispatchError:
    """The exception that a failed Grid Engine command means (module docstring)."""
    text = " ".join((result.stderr + " " + result.stdout).split())[:500]
    message = f"{operation}: {text or f'exit status {result.returncode}'}"
    if result.returncode in (126, 127):
        return ErrUnsupported(f"{operation}: a Grid Engine command is missing on the "
                              f"host: {text[:200]}")
    for pattern, kind in _TABLE:
        if pattern.search(text):
            if kind is TransientError:
                return TransientError(message, retry_after=5.0)
            if kind is ErrBackPressure:
                return ErrBackPressure(message, retry_after=30.0)
            return kind(message)
    return CommandFailed(message, argv=result.argv, returncode=result.returncode,
                         stderr=result.stderr)
