"""Dispatch job ids: ULIDs written as 26 upper-case Crockford base-32 characters."""

from __future__ import annotations

import re
from typing import NewType

from ulid import ULID

from controller.errors import ErrInvalid

JobID = NewType("JobID", str)

# Crockford base 32 without I, L, O, U; the first character is at most 7 (128 bits).
_ULID_RE = re.compile(r"[0-7][0-9A-HJKMNP-TV-Z]{25}")


def parse_job_id(text: object, *, field: str = "id") -> JobID:
    """Return ``text`` as a JobID, or raise ErrInvalid naming ``field``."""
    if not isinstance(text, str) or _ULID_RE.fullmatch(text) is None:
        raise ErrInvalid(f"not a ULID (26 upper-case Crockford characters): {text!r:.60}",
                         field=field)
    return JobID(text)


def is_job_id(text: str) -> bool:
    """True when ``text`` has the exact shape of a JobID."""
    return _ULID_RE.fullmatch(text) is not None


def new_job_id() -> JobID:
    """A fresh, time-ordered JobID."""
    return JobID(str(ULID()))
