"""Identity text on the Slurm side (SPEC §2): the discovery name and the strict comment."""

from __future__ import annotations

import re

from controller.errors import ErrInvalid
from controller.model.ids import is_job_id, parse_job_id

NAME_PREFIX = "dj-"
MAX_SUBMISSION = 999_999
EPOCH_BOUND = 1_000_000  # exclusive bound on submission N and restart count R

# canonical decimals: no sign, no leading zeros ("0" alone allowed for the attempt)
_COMMENT_RE = re.compile(r"dispatch:s=([1-9][0-9]{0,5});a=(0|[1-9][0-9]*)")


def discovery_name(job_id: str) -> str:
    """The Slurm job name of every submission of ``job_id``: ``dj-<ULID>``."""
    return NAME_PREFIX + parse_job_id(job_id, field="job_id")


def job_id_of_name(name: str) -> str | None:
    """The ULID a discovery name carries, or None when ``name`` is not exactly ``dj-<ULID>``."""
    if not name.startswith(NAME_PREFIX):
        return None
    rest = name[len(NAME_PREFIX):]
    return rest if is_job_id(rest) else None


def check_submission(submission: int) -> None:
    if isinstance(submission, bool) or not isinstance(submission, int) or not (
            1 <= submission <= MAX_SUBMISSION):
        raise ErrInvalid(f"must be between 1 and {MAX_SUBMISSION}", field="submission")


def check_attempt(attempt: int) -> None:
    if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 0:
        raise ErrInvalid("must be a non-negative integer", field="attempt")


def format_comment(submission: int, attempt: int) -> str:
    """``dispatch:s=<N>;a=<attempt>``; refuses values outside the allowed ranges."""
    check_submission(submission)
    check_attempt(attempt)
    return f"dispatch:s={submission};a={attempt}"


def parse_comment(text: str | None) -> tuple[int, int] | None:
    """(submission, attempt) from a comment, or None when it is not exactly our shape."""
    if text is None:
        return None
    match = _COMMENT_RE.fullmatch(text)
    if match is None:
        return None
    return int(match.group(1)), int(match.group(2))
