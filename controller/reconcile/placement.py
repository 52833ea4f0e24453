"""Placement over many clusters: which shard plans a job, and where it goes next. Pure.

A configuration names its clusters in order (``[[clusters]]``; the first is the default).
A job's document names one cluster, a list of acceptable ones in order of preference, or
none (the default). Each cluster is a shard: one reconciler, one lease, one batched read.

* A job is *placed* on one cluster (``JobState.cluster``, the column
  ``job_status.cluster``) by the first plan of the shard it belongs to; from then on that
  shard alone plans it (``owner``), and only that shard's plan moves it elsewhere.
* An unplaced job belongs to the first of its acceptable clusters. A row that is invalid,
  or names a cluster the configuration does not know, belongs to the default cluster's
  shard, which reports it (and keeps it unplaced, so it is picked up again once the
  configuration gains that cluster).
* A job never moves silently: sbatch refused on one cluster sends it to the next
  acceptable one (``after_refusal``); a resubmission stays on its cluster unless the
  policy's ``other_cluster_on`` names the cause (``for_resubmission``). Every move is
  an event, and each submission row records its cluster.
"""

from __future__ import annotations

from dataclasses import dataclass

from controller.model.job import JobState
from controller.model.obs import CauseKind
from controller.model.spec import JobSpec


@dataclass(frozen=True, slots=True)
class Clusters:
    """The configured clusters, in order (the first is the default), and the one this
    shard drives."""

    names: tuple[str, ...]
    here: str

    def __post_init__(self) -> None:
        if not self.names or self.here not in self.names:
            raise ValueError(f"placement: {self.here!r} is not one of {self.names!r}")

    @property
    def default(self) -> str:
        return self.names[0]


def acceptable(spec: JobSpec, clusters: Clusters) -> tuple[str, ...]:
    """The clusters a job may run on, in order of preference."""
    return spec.clusters or (clusters.default,)


def unknown(spec: JobSpec, clusters: Clusters) -> tuple[str, ...]:
    """The clusters a job names that the configuration does not know."""
    return tuple(name for name in spec.clusters if name not in clusters.names)


def owner(job: JobState, clusters: Clusters) -> str:
    """The shard that plans ``job`` (module docstring)."""
    if job.cluster is not None:
        return job.cluster
    if job.spec is None or unknown(job.spec, clusters):
        return clusters.default
    return acceptable(job.spec, clusters)[0]


def after_refusal(spec: JobSpec, clusters: Clusters) -> str | None:
    """Where a job goes when this shard's sbatch refused it: the next acceptable cluster
    after this one, or None when this one was the last (the job fails)."""
    order = acceptable(spec, clusters)
    if clusters.here not in order:
        return None
    rest = order[order.index(clusters.here) + 1:]
    return rest[0] if rest else None


def for_resubmission(spec: JobSpec, other_cluster_on: frozenset[CauseKind],
                     cause: CauseKind, clusters: Clusters) -> str:
    """Where a resubmission for ``cause`` goes: this cluster, unless the policy asks for
    another cluster on that cause and the job accepts another (the next one in its
    order, wrapping around), or the job no longer accepts this one (its first known)."""
    order = acceptable(spec, clusters)
    if clusters.here not in order:  # the client changed the list since: its first
        known = [name for name in order if name in clusters.names]
        return known[0] if known else clusters.here
    if cause not in other_cluster_on or len(order) < 2:
        return clusters.here
    return order[(order.index(clusters.here) + 1) % len(order)]


__all__ = ["Clusters", "acceptable", "after_refusal", "for_resubmission", "owner", "unknown"]
