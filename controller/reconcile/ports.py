"""The narrow interface the reconciler needs from a scheduler adapter (a Protocol seam).

``controller.slurm.adapter.SlurmAdapter`` implements it against a real Slurm cluster;
every scheduler kind has one adapter of this shape. Unit tests may pass a stateful fake.
Every write re-checks identity inside the adapter.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from controller.model.obs import ObjectObs, ObjectRef, StartRequest


@dataclass(frozen=True, slots=True)
class ClusterStats:
    """One cheap whole-cluster read, taken at its own slower interval."""

    running: int
    pending: int
    down_nodes: frozenset[str] = frozenset()
    estimated_wait_s: float | None = None  # from Slurm's own start estimates
    observed_wait_s: float | None = None  # median start - submit of recent starts
    extra: Mapping[str, str] = field(default_factory=dict)


class SchedulerPort(Protocol):
    """One cluster of one scheduler kind, as the reconciler drives it."""

    cluster: str

    async def start(self, request: StartRequest) -> ObjectRef: ...

    async def find_many(self, job_ids: Collection[str], *,
                        strays: dict[str, list[ObjectObs]] | None = None,
                        ) -> Mapping[str, Sequence[ObjectObs]]: ...

    async def inspect_many(self, refs: Sequence[ObjectRef], *,
                           since: int) -> dict[ObjectRef, ObjectObs]: ...

    async def stop(self, ref: ObjectRef) -> None: ...

    async def hold(self, ref: ObjectRef, instance: int) -> None: ...

    async def release(self, ref: ObjectRef) -> None: ...

    async def missing_paths(self, paths: Sequence[str]) -> list[str]: ...

    async def started_evidence(self, ref: ObjectRef, submission: int) -> bool: ...

    async def cluster_stats(self) -> ClusterStats: ...

    async def owner_marker(self, deployment: str) -> str | None: ...

    async def set_owner_marker(self, deployment: str, token: str) -> None: ...


class Fence(Protocol):
    """The leader lease as the tick sees it (``controller.store.lease.Lease``).

    ``pin()`` is the fence of one tick: the lease at the epoch held when the tick began
    (``controller.store.lease.Pinned``), which passes only while that epoch is held.
    ``check(tx)`` is the first statement of every write transaction (raises
    ``LeaseLost`` when the lease moved); ``guard()`` runs before every Slurm write (raises
    ``LeaseLost`` past the lease deadline minus the safety margin); ``epoch`` is the epoch
    held, recorded on the intents."""

    epoch: int | None

    def pin(self) -> Fence: ...

    def check(self, tx: Any) -> None: ...

    def guard(self) -> None: ...

    def refresh(self) -> None: ...


class NoFence:
    """For a controller that runs alone by construction (tests, one-shot tools)."""

    epoch: int | None = None

    def pin(self) -> NoFence:
        return self

    def check(self, tx: Any) -> None:
        return None

    def guard(self) -> None:
        return None

    def refresh(self) -> None:
        return None
