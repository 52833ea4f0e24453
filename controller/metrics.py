"""Prometheus metrics of the controller, fed from its own state and its ticks.

Nothing here calls Slurm: the tick and the runner observer push figures in, and
the job-phase gauges are refreshed from the database after each tick. One
``Families`` object creates every metric family once in one ``CollectorRegistry``
(isolated per test); a ``Metrics`` object is a view of those families bound to one
Slurm cluster (one shard), which fills in the ``cluster`` label, the first label of
every per-cluster family. ``cluster`` is bounded: one value per configured cluster.
Three process-level gauges (shards held, replicas seen live, and jobs placed on a
cluster this replica's configuration does not name: such a name is no bounded label
value) have no ``cluster`` label. No per-job labels; base units; counters end in ``_total``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Generic, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

PHASES = ("pending", "running", "held", "succeeded", "failed", "cancelled", "rejected")
OBJECT_STATES = ("gated", "held", "pending", "running", "suspended", "ended", "unknown")
QUEUE_WAIT_METHODS = ("estimate", "observed")
TICK_RESULTS = ("ok", "slurm-unreachable", "error")
DEFAULT_CLUSTER = "lab"

_M = TypeVar("_M", Counter, Gauge, Histogram)


class Bound(Generic[_M]):
    """A family with labels besides ``cluster``, bound to one cluster: ``.labels(**kw)``
    returns the child of ``cluster`` and ``kw``."""

    __slots__ = ("_cluster", "_family")
    _family: _M
    _cluster: str

    def __init__(self, family: _M, cluster: str) -> None:
        self._family = family
        self._cluster = cluster

    def labels(self, **labels: str) -> _M:
        return self._family.labels(cluster=self._cluster, **labels)


class Families:
    """Every metric family of one registry, created once; shared by the cluster views."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        c = ["cluster"]
        self.jobs = Gauge("dispatch_jobs", "Dispatch jobs by phase.", [*c, "phase"],
                          registry=r)
        self.objects = Gauge("dispatch_job_objects", "Current scheduler objects of non-terminal "
                             "dispatch jobs by observed state.", [*c, "state"], registry=r)
        self.queued = Gauge("dispatch_jobs_queued", "Dispatch jobs whose scheduler job is queued "
                            "(pending, gated or held).", c, registry=r)
        self.running = Gauge("dispatch_jobs_running", "Dispatch jobs whose scheduler job runs.",
                             c, registry=r)
        self.stale = Gauge("dispatch_jobs_stale", "Jobs the scheduler reports "
                           "running past their time limit or on a down node.", c, registry=r)
        self.oldest_pending = Gauge("dispatch_oldest_pending_seconds", "Age of the oldest "
                                    "queued dispatch job.", c, registry=r)
        self.submissions = Counter("dispatch_submissions_total", "Submissions made (sbatch, qsub).",
                                   c, registry=r)
        self.resubmissions = Counter("dispatch_resubmissions_total",
                                     "Resubmissions decided by the recovery policy, by cause.",
                                     [*c, "cause"], registry=r)
        self.endings = Counter("dispatch_job_endings_total", "Dispatch jobs that reached a "
                               "terminal phase, by phase and cause.", [*c, "phase", "cause"],
                               registry=r)
        self.duplicates = Counter("dispatch_duplicates_cancelled_total",
                                  "Extra scheduler jobs of one dispatch job cancelled.", c,
                                  registry=r)
        self.unowned = Gauge("dispatch_unowned_jobs", "Live dj- scheduler jobs of the submit user "
                             "whose id this database never had (a neighbouring "
                             "deployment's): never written.", c, registry=r)
        self.ownership_conflict = Gauge("dispatch_ownership_conflict", "1 when another "
                                        "database with this deployment's id acts on the "
                                        "cluster (a restored backup): the leader refuses "
                                        "to act.", c, registry=r)
        self.action_errors = Counter("dispatch_action_errors_total", "Scheduler actions that "
                                     "failed, by action.", [*c, "action"], registry=r)
        self.tick_duration = Histogram("dispatch_tick_duration_seconds", "Reconcile tick "
                                       "duration.", c, buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5,
                                                                5, 10, 30, 60), registry=r)
        self.last_tick = Gauge("dispatch_last_successful_tick_timestamp_seconds",
                               "Unix time the last tick completed.", c, registry=r)
        self.ticks = Counter("dispatch_ticks_total", "Reconcile ticks by result.",
                             [*c, "result"], registry=r)
        self.slurm_commands = Counter("dispatch_slurm_commands_total", "Scheduler commands "
                                      "run (Slurm's, Grid Engine's), by command.", [*c, "command"],
                                      registry=r)
        self.slurm_errors = Counter("dispatch_slurm_command_errors_total", "Scheduler commands "
                                    "that failed or timed out, by command.", [*c, "command"],
                                    registry=r)
        self.slurm_duration = Histogram("dispatch_slurm_command_duration_seconds",
                                        "Scheduler command duration, by command.", [*c, "command"],
                                        buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30),
                                        registry=r)
        self.slurm_up = Gauge("dispatch_slurm_up", "1 when the last live read "
                              "of the scheduler succeeded.",
                              c, registry=r)
        self.accounting_up = Gauge("dispatch_slurm_accounting_up", "1 when the last "
                                   "accounting read (sacct, the Grid Engine accounting "
                                   "file) succeeded (or none was needed).", c, registry=r)
        self.leader = Gauge("dispatch_leader", "1 when this daemon holds the cluster's shard "
                            "lease.", c, registry=r)
        self.leader_epoch = Gauge("dispatch_leader_epoch", "The shard lease epoch this daemon "
                                  "holds (0 when it does not hold it).", c, registry=r)
        self.leader_info = Gauge("dispatch_leader_info", "1 for the shard lease holder and "
                                 "epoch this daemon last saw in the database.",
                                 [*c, "holder", "epoch"], registry=r)
        self.cluster_running = Gauge("dispatch_cluster_jobs_running", "Running jobs on the "
                                     "whole cluster (all users).", c, registry=r)
        self.cluster_pending = Gauge("dispatch_cluster_jobs_pending", "Pending jobs on the "
                                     "whole cluster (all users).", c, registry=r)
        self.queue_wait = Gauge("dispatch_queue_estimated_wait_seconds", "Estimated queue wait, "
                                "by method.", [*c, "method"], registry=r)
        self.tracked = Gauge("dispatch_tracked_jobs", "Non-terminal jobs the controller "
                             "reconciles each tick.", c, registry=r)
        self.shards_held = Gauge("dispatch_shards_held", "Cluster shards this replica holds "
                                 "the lease of.", registry=r)
        self.replicas_live = Gauge("dispatch_replicas_live", "Live replicas this replica "
                                   "last saw in the database.", registry=r)
        self.unconfigured = Gauge("dispatch_jobs_unconfigured_cluster", "Non-terminal jobs "
                                  "placed on a cluster this replica's configuration does "
                                  "not name: no shard here reconciles them.", registry=r)
        # cluster -> (holder, epoch) of its dispatch_leader_info series, to remove it alone
        self.leader_seen: dict[str, tuple[str, str]] = {}

    def set_shards_held(self, n: int) -> None:
        self.shards_held.set(n)

    def set_replicas_live(self, n: int) -> None:
        self.replicas_live.set(n)


class Metrics:
    """A view of the metric families bound to one cluster label value."""

    def __init__(self, registry: CollectorRegistry | None = None, *,
                 cluster: str = DEFAULT_CLUSTER, families: Families | None = None) -> None:
        if not cluster:
            raise ValueError("cluster must be a non-empty label value")
        if families is None:
            families = Families(registry)
        elif registry is not None and registry is not families.registry:
            raise ValueError("registry and families.registry differ")
        self.families = f = families
        self.registry: CollectorRegistry = f.registry
        self.cluster = cluster
        self.jobs = Bound(f.jobs, cluster)
        self.objects = Bound(f.objects, cluster)
        self.queued = f.queued.labels(cluster=cluster)
        self.running = f.running.labels(cluster=cluster)
        self.stale = f.stale.labels(cluster=cluster)
        self.oldest_pending = f.oldest_pending.labels(cluster=cluster)
        self.submissions = f.submissions.labels(cluster=cluster)
        self.resubmissions = Bound(f.resubmissions, cluster)
        self.endings = Bound(f.endings, cluster)
        self.duplicates = f.duplicates.labels(cluster=cluster)
        self.unowned = f.unowned.labels(cluster=cluster)
        self.ownership_conflict = f.ownership_conflict.labels(cluster=cluster)
        self.action_errors = Bound(f.action_errors, cluster)
        self.tick_duration = f.tick_duration.labels(cluster=cluster)
        self.last_tick = f.last_tick.labels(cluster=cluster)
        self.ticks = Bound(f.ticks, cluster)
        self.slurm_commands = Bound(f.slurm_commands, cluster)
        self.slurm_errors = Bound(f.slurm_errors, cluster)
        self.slurm_duration = Bound(f.slurm_duration, cluster)
        self.slurm_up = f.slurm_up.labels(cluster=cluster)
        self.accounting_up = f.accounting_up.labels(cluster=cluster)
        self.leader = f.leader.labels(cluster=cluster)
        self.leader_epoch = f.leader_epoch.labels(cluster=cluster)
        self.cluster_running = f.cluster_running.labels(cluster=cluster)
        self.cluster_pending = f.cluster_pending.labels(cluster=cluster)
        self.queue_wait = Bound(f.queue_wait, cluster)
        self.tracked = f.tracked.labels(cluster=cluster)
        # the label sets dashboards read, at zero until first set
        for phase in PHASES:
            self.jobs.labels(phase=phase)
        for state in OBJECT_STATES:
            self.objects.labels(state=state)
        for method in QUEUE_WAIT_METHODS:
            self.queue_wait.labels(method=method)
        for result in TICK_RESULTS:
            self.ticks.labels(result=result)

    def for_cluster(self, name: str) -> Metrics:
        """Another view on the same families and registry, bound to cluster ``name``."""
        return Metrics(cluster=name, families=self.families)

    def observe_command(self, command: str, duration_s: float, ok: bool) -> None:
        """Runner observer hook: one Slurm command finished."""
        self.slurm_commands.labels(command=command).inc()
        self.slurm_duration.labels(command=command).observe(duration_s)
        if not ok:
            self.slurm_errors.labels(command=command).inc()

    def set_leader(self, *, held: bool, epoch: int | None, holder: str | None,
                   seen_epoch: int | None) -> None:
        """This daemon's part in this cluster's shard lease, and the holder it last saw."""
        self.leader.set(1 if held else 0)
        self.leader_epoch.set(epoch if held and epoch is not None else 0)
        seen = self.families.leader_seen
        info = self.families.leader_info
        previous = seen.pop(self.cluster, None)
        if previous is not None:
            info.remove(self.cluster, *previous)
        if holder is not None and seen_epoch is not None:
            seen[self.cluster] = (holder, str(seen_epoch))
            info.labels(cluster=self.cluster, holder=holder, epoch=str(seen_epoch)).set(1)

    def set_shards_held(self, n: int) -> None:
        """Process-level: the number of shards this replica holds (no cluster label)."""
        self.families.set_shards_held(n)

    def set_replicas_live(self, n: int) -> None:
        """Process-level: the live replicas this replica last saw (no cluster label)."""
        self.families.set_replicas_live(n)

    def set_unconfigured(self, n: int) -> None:
        """Process-level: jobs placed on clusters not configured here (no cluster label)."""
        self.families.unconfigured.set(n)

    def set_phase_counts(self, counts: Mapping[str, int]) -> None:
        for phase in PHASES:
            self.jobs.labels(phase=phase).set(counts.get(phase, 0))

    def set_object_counts(self, counts: Mapping[str, int]) -> None:
        for state in OBJECT_STATES:
            self.objects.labels(state=state).set(counts.get(state, 0))
        self.queued.set(sum(counts.get(s, 0) for s in ("pending", "gated", "held")))
        self.running.set(sum(counts.get(s, 0) for s in ("running", "suspended")))
