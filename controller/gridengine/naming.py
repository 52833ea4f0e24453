"""Identity text on the Grid Engine side: the job name is the discovery name ``dj-<ULID>``
(``controller.slurm.naming``, shared), and the submission and attempt travel in the
account string (``qsub -A``), which the accounting file keeps (field 7).

Grid Engine refuses ``:`` (and ``/``, ``@``) in ``-A`` ("Colon (':') not allowed in
objectname", testdata/gridengine/NOTES.md), so the account string is Slurm's comment
with ``;`` for the colon: ``dispatch;s=<N>;a=<attempt>``; the same strict, canonical
parse. Pure.
"""

from __future__ import annotations

import re
from typing import Final

from controller.slurm.naming import check_attempt, check_submission

ACCOUNT_PREFIX: Final = "dispatch;"
# the context variable (``qalter -ac``) that carries a dispatch hold's instance
HOLD_CONTEXT: Final = "dispatch_hold"

_ACCOUNT_RE = re.compile(r"dispatch;s=([1-9][0-9]{0,5});a=(0|[1-9][0-9]*)")
_HOLD_RE = re.compile(r"[1-9][0-9]{0,9}")


def format_account(submission: int, attempt: int) -> str:
    """``dispatch;s=<N>;a=<attempt>``; refuses values outside the allowed ranges."""
    check_submission(submission)
    check_attempt(attempt)
    return f"dispatch;s={submission};a={attempt}"


def parse_account(text: str | None) -> tuple[int, int] | None:
    """(submission, attempt) from an account string, or None when it is not exactly ours."""
    if text is None:
        return None
    match = _ACCOUNT_RE.fullmatch(text)
    if match is None:
        return None
    return int(match.group(1)), int(match.group(2))


def parse_hold_instance(text: str | None) -> int | None:
    """A dispatch hold's instance from the context value, or None (1 .. 4,294,967,295)."""
    if text is None or _HOLD_RE.fullmatch(text) is None:
        return None
    value = int(text)
    return value if value <= 4_294_967_295 else None
