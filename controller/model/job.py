"""The job as every layer sees it: desired state, phase, conditions and the controller's
status memory (``JobState``), plus the records a plan asks the store to write.

Pure data: the store loads and saves these, the client and CLI read them, and the
planner (``controller.reconcile.plan``) computes the next one. Nothing here does I/O.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from controller.model.obs import Cause, ObjectObs, ObjectRef, State
from controller.model.policy import DEFAULT_POLICY, RecoveryPolicy
from controller.model.spec import JobSpec


class Desired(enum.Enum):
    RUN = "run"
    HELD = "held"
    STOPPED = "stopped"


class Phase(enum.Enum):
    PENDING = "pending"
    RUNNING = "running"
    HELD = "held"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    REJECTED = "rejected"


TERMINAL_PHASES = frozenset({Phase.SUCCEEDED, Phase.FAILED, Phase.CANCELLED, Phase.REJECTED})

# The phase a live object state shows, before desired state and causes are considered.
PHASE_OF_STATE: Mapping[State, Phase] = {
    State.GATED: Phase.PENDING,
    State.HELD: Phase.HELD,
    State.PENDING: Phase.PENDING,
    State.RUNNING: Phase.RUNNING,
    State.SUSPENDED: Phase.RUNNING,
}


@dataclass(frozen=True, slots=True)
class Condition:
    """A Kubernetes-style condition; ``since`` moves only when ``status`` flips."""

    type: str
    status: bool
    reason: str
    message: str
    since: int
    observed_generation: int


@dataclass(frozen=True, slots=True)
class Current:
    """The submission the controller considers current. ``ref`` is None for an intent
    written before sbatch ran, until the object is adopted."""

    submission: int
    attempt: int
    created_at: int
    ref: ObjectRef | None = None


@dataclass(frozen=True, slots=True)
class JobState:
    """One job: the client's desired record plus the controller's status memory."""

    job_id: str
    generation: int
    desired: Desired
    spec: JobSpec | None
    policy: RecoveryPolicy = DEFAULT_POLICY
    phase: Phase = Phase.PENDING
    submission: int = 0  # last submission number allocated
    attempt: int = 0
    current: Current | None = None
    object_state: State | None = None
    cause: Cause = field(default_factory=Cause)
    exit_code: int | None = None
    reason: str = ""
    nodes: tuple[str, ...] = ()
    budgets_used: Mapping[str, int] = field(default_factory=dict)
    excluded_nodes: Mapping[str, int] = field(default_factory=dict)  # node -> until
    not_before: int | None = None
    unknown_since: int | None = None
    hold_instance: int = 0
    started_at: int | None = None
    ended_at: int | None = None
    observed_generation: int = 0
    conditions: tuple[Condition, ...] = ()
    outputs_verified: bool = False
    # submission numbers whose intent was abandoned (submissions rows with status
    # "abandoned"): a late Slurm job of one is a duplicate, never adopted nor released
    abandoned: frozenset[int] = frozenset()
    # the cluster the job is placed on (``job_status.cluster``): the one shard that plans
    # it; None until the first plan places it (``controller.reconcile.placement``)
    cluster: str | None = None


@dataclass(frozen=True, slots=True)
class SubmissionUpdate:
    """Record what was observed (or decided) of one submission row."""

    job_id: str
    submission: int
    status: str  # submitted | ended | abandoned | duplicate
    obs: ObjectObs | None = None
    cluster: str | None = None  # an intent: the cluster it is submitted to


@dataclass(frozen=True, slots=True)
class PlannedEvent:
    job_id: str
    kind: str
    message: str
