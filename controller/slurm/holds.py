"""Holds as a far-future start time (SPEC §5).

A hold with instance h sets a pending job's start (begin) time to
``submit + HOLD_BASE + h``; it decodes only against the job's *current* submit time.
"""

from __future__ import annotations

from controller.errors import ErrInvalid

HOLD_BASE = 315_576_000  # ten Julian years, in seconds
MAX_HOLD_INSTANCE = 4_294_967_295


def encode_hold(submit: int, instance: int) -> int:
    """The start time that carries hold ``instance`` for a job submitted at ``submit``."""
    if isinstance(instance, bool) or not isinstance(instance, int) or not (
            1 <= instance <= MAX_HOLD_INSTANCE):
        raise ErrInvalid(f"must be between 1 and {MAX_HOLD_INSTANCE}", field="hold_instance")
    if isinstance(submit, bool) or not isinstance(submit, int) or submit <= 0:
        raise ErrInvalid("must be a positive epoch time", field="submit")
    return submit + HOLD_BASE + instance


def decode_hold(start: int, submit: int) -> int | None:
    """The hold instance ``start`` carries against ``submit``, or None if it is no hold."""
    instance = start - submit - HOLD_BASE
    if 1 <= instance <= MAX_HOLD_INSTANCE:
        return instance
    return None
