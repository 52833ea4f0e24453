"""Prometheus metrics of the controller, fed from its own state and its tick.

Nothing here calls Slurm: the tick and the runner observer push figures in, and
the job-phase gauges are refreshed from the database after each tick. One
``Metrics`` object owns one ``CollectorRegistry`` (isolated per test). No per-job
labels; base units; counters end in ``_total``.
"""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

PHASES = ("pending", "running", "held", "succeeded", "failed", "cancelled", "rejected")
OBJECT_STATES = ("gated", "held", "pending", "running", "suspended", "ended", "unknown")


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.jobs = Gauge("dispatch_jobs", "Dispatch jobs by phase.", ["phase"],
                          registry=r)
        self.objects = Gauge("dispatch_job_objects", "Current Slurm objects of non-terminal "
                             "dispatch jobs by observed state.", ["state"], registry=r)
        self.queued = Gauge("dispatch_jobs_queued", "Dispatch jobs whose Slurm job is queued "
                            "(pending, gated or held).", registry=r)
        self.running = Gauge("dispatch_jobs_running", "Dispatch jobs whose Slurm job runs.",
                             registry=r)
        self.stale = Gauge("dispatch_jobs_stale", "Jobs Slurm reports running past their time "
                           "limit or on a down node.", registry=r)
        self.oldest_pending = Gauge("dispatch_oldest_pending_seconds", "Age of the oldest "
                                    "queued dispatch job.", registry=r)
        self.submissions = Counter("dispatch_submissions_total", "sbatch submissions made.",
                                   registry=r)
        self.resubmissions = Counter("dispatch_resubmissions_total",
                                     "Resubmissions decided by the recovery policy, by cause.",
                                     ["cause"], registry=r)
        self.endings = Counter("dispatch_job_endings_total", "Dispatch jobs that reached a "
                               "terminal phase, by phase and cause.", ["phase", "cause"],
                               registry=r)
        self.duplicates = Counter("dispatch_duplicates_cancelled_total",
                                  "Extra Slurm jobs of one dispatch job cancelled.", registry=r)
        self.action_errors = Counter("dispatch_action_errors_total", "Slurm actions that "
                                     "failed, by action.", ["action"], registry=r)
        self.tick_duration = Histogram("dispatch_tick_duration_seconds", "Reconcile tick "
                                       "duration.", buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5,
                                                              10, 30, 60), registry=r)
        self.last_tick = Gauge("dispatch_last_successful_tick_timestamp_seconds",
                               "Unix time the last tick completed.", registry=r)
        self.ticks = Counter("dispatch_ticks_total", "Reconcile ticks by result.", ["result"],
                             registry=r)
        self.slurm_commands = Counter("dispatch_slurm_commands_total", "Slurm commands run, "
                                      "by command.", ["command"], registry=r)
        self.slurm_errors = Counter("dispatch_slurm_command_errors_total", "Slurm commands "
                                    "that failed or timed out, by command.", ["command"],
                                    registry=r)
        self.slurm_duration = Histogram("dispatch_slurm_command_duration_seconds",
                                        "Slurm command duration, by command.", ["command"],
                                        buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30),
                                        registry=r)
        self.slurm_up = Gauge("dispatch_slurm_up", "1 when the last Slurm read succeeded.",
                              registry=r)
        self.accounting_up = Gauge("dispatch_slurm_accounting_up", "1 when the last sacct read "
                                   "succeeded (or none was needed).", registry=r)
        self.leader = Gauge("dispatch_leader", "1 when this daemon holds the leader lease.",
                            registry=r)
        self.leader_epoch = Gauge("dispatch_leader_epoch", "The lease epoch this daemon "
                                  "holds (0 when it stands by).", registry=r)
        self.leader_info = Gauge("dispatch_leader_info", "1 for the lease holder and epoch "
                                 "this daemon last saw in the database.",
                                 ["holder", "epoch"], registry=r)
        self.cluster_running = Gauge("dispatch_cluster_jobs_running", "Running jobs on the "
                                     "whole cluster (all users).", registry=r)
        self.cluster_pending = Gauge("dispatch_cluster_jobs_pending", "Pending jobs on the "
                                     "whole cluster (all users).", registry=r)
        self.queue_wait = Gauge("dispatch_queue_estimated_wait_seconds", "Estimated queue wait, "
                                "by method.", ["method"], registry=r)
        self.tracked = Gauge("dispatch_tracked_jobs", "Non-terminal jobs the controller "
                             "reconciles each tick.", registry=r)
        for phase in PHASES:
            self.jobs.labels(phase=phase)
        for state in OBJECT_STATES:
            self.objects.labels(state=state)
        for label in ("estimate", "observed"):
            self.queue_wait.labels(method=label)
        for result in ("ok", "slurm-unreachable", "error"):
            self.ticks.labels(result=result)

    def observe_command(self, command: str, duration_s: float, ok: bool) -> None:
        """Runner observer hook: one Slurm command finished."""
        self.slurm_commands.labels(command=command).inc()
        self.slurm_duration.labels(command=command).observe(duration_s)
        if not ok:
            self.slurm_errors.labels(command=command).inc()

    def set_leader(self, *, held: bool, epoch: int | None, holder: str | None,
                   seen_epoch: int | None) -> None:
        """This daemon's part in the lease, and the holder it last saw."""
        self.leader.set(1 if held else 0)
        self.leader_epoch.set(epoch if held and epoch is not None else 0)
        self.leader_info.clear()
        if holder is not None and seen_epoch is not None:
            self.leader_info.labels(holder=holder, epoch=str(seen_epoch)).set(1)

    def set_phase_counts(self, counts: Mapping[str, int]) -> None:
        for phase in PHASES:
            self.jobs.labels(phase=phase).set(counts.get(phase, 0))

    def set_object_counts(self, counts: Mapping[str, int]) -> None:
        for state in OBJECT_STATES:
            self.objects.labels(state=state).set(counts.get(state, 0))
        self.queued.set(sum(counts.get(s, 0) for s in ("pending", "gated", "held")))
        self.running.set(sum(counts.get(s, 0) for s in ("running", "suspended")))
