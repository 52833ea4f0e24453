"""ObjectRef, ObjectObs and the State/Cause vocabularies (SPEC §1, §4).

Enums encode as their text names (kebab-case) and refuse unknown names when decoded.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Self

from controller.errors import ErrInvalid
from controller.model.ids import JobID
from controller.model.spec import JobSpec


class _TextEnum(enum.Enum):
    """An enum whose wire form is its value; decoding refuses unknown names."""

    @classmethod
    def decode(cls, text: str) -> Self:
        try:
            return cls(text)
        except ValueError:
            raise ErrInvalid(f"unknown {cls.__name__} {text!r}") from None

    def __str__(self) -> str:
        return str(self.value)


class State(_TextEnum):
    """What an object is doing now."""

    GATED = "gated"
    HELD = "held"
    PENDING = "pending"
    RUNNING = "running"
    SUSPENDED = "suspended"
    ENDED = "ended"


class CauseKind(_TextEnum):
    """Why an object is in its state. The last six are the controller's alone."""

    NONE = "none"
    COMPLETED = "completed"
    NON_ZERO_EXIT = "non-zero-exit"
    SIGNALED = "signaled"
    TIMEOUT = "timeout"
    OUT_OF_MEMORY = "out-of-memory"
    NODE_LOST = "node-lost"
    PREEMPTED = "preempted"
    LAUNCH_FAILED = "launch-failed"
    BOOT_FAILED = "boot-failed"
    DEADLINE = "deadline"
    CANCELLED = "cancelled"
    REQUEUED = "requeued"
    UNRUNNABLE = "unrunnable"
    ADMIN_HOLD = "admin-hold"
    LOST = "lost"  # the cluster lost the job: acknowledged, then gone, or flushed by Slurm
    UNKNOWN = "unknown"
    # controller-only causes: the adapter never reports these
    NO_CAPACITY = "no-capacity"
    HELD = "held"
    RELEASED = "released"
    DUPLICATE = "duplicate"
    MISSING_OUTPUT = "missing-output"
    STALE = "stale"


CONTROLLER_ONLY_CAUSES = frozenset({
    CauseKind.NO_CAPACITY, CauseKind.HELD, CauseKind.RELEASED, CauseKind.DUPLICATE,
    CauseKind.MISSING_OUTPUT, CauseKind.STALE,
})


class Provenance(_TextEnum):
    """Who brought the cause about."""

    SLURM = "slurm"
    USER = "user"
    ADMIN = "admin"
    DISPATCH = "dispatch"
    UNKNOWN = "unknown"


class Source(_TextEnum):
    """Where an observation was read: slurmctld's memory or the accounting database."""

    LIVE = "live"
    ACCOUNTING = "accounting"


@dataclass(frozen=True, slots=True)
class Cause:
    kind: CauseKind = CauseKind.NONE
    provenance: Provenance = Provenance.UNKNOWN
    detail: str = ""


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """One Slurm job that belongs to a dispatch job. ``submit`` is the identity anchor.

    ``sluid``: Slurm's unique job id (``sE0HM8R59HN500``; never reused), when the cluster
    reports one (26.05 in squeue and sacct, 24.11 in sacct only). It is extra knowledge,
    not part of the ref's equality: a ref read before the SLUID was known names the
    same object as one read after.
    """

    cluster: str
    uid: str  # the discovery name, dj-<ULID>
    id: int  # Slurm job id
    submit: int  # submit time, epoch seconds
    sluid: str | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class ObjectObs:
    """One observation of an object (SPEC §4)."""

    ref: ObjectRef
    state: State
    cause: Cause
    submission: int | None  # None = unknown (foreign, or sacct without job_comment)
    attempt: int | None
    foreign: bool
    restart_count: int | None  # None from sacct
    hold_instance: int | None
    requeued: bool
    exit_code: int | None  # only with cause non-zero-exit
    nodes: tuple[str, ...]
    reason: str
    submit: int | None
    start: int | None
    end: int | None
    source: Source
    observed_at: int
    time_limit_s: int | None = None
    eligible: int | None = None


@dataclass(frozen=True, slots=True)
class StartRequest:
    """Everything Start needs to submit one Slurm job for one dispatch job."""

    job_id: JobID
    generation: int
    submission: int
    attempt: int
    spec: JobSpec
    gate: bool = False
    extra_exclude: tuple[str, ...] = field(default=())
