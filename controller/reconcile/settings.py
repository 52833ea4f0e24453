"""The ``[reconcile]`` settings: the one definition of the planner's and the tick's knobs.

``controller.config`` decodes this group like every other (``Config.reconcile``); the
tick takes it as ``TickSettings`` and builds each ``PlanContext`` from it, and the
planner's own defaults are read from it. Pure data.
"""

from __future__ import annotations

from dataclasses import dataclass

from controller.model.setting import setting

_HUNDRED_YEARS_S = 100 * 365 * 24 * 3600


@dataclass(frozen=True, slots=True)
class ReconcileConfig:
    """How the reconciler decides: time windows, the safety net, batching."""

    adopt_window_s: int = setting(
        180, unit="s", minimum=1, maximum=_HUNDRED_YEARS_S,
        doc="an intent whose Slurm job has not appeared after this long is abandoned "
            "(a late job of it stays gated and is cancelled)")
    unknown_grace_s: int = setting(
        300, unit="s", minimum=0, maximum=_HUNDRED_YEARS_S,
        doc="a job missing from squeue and sacct this long ends with cause unknown "
            "(a job's policy may set its own)")
    sacct_window_s: int = setting(
        7 * 24 * 3600, unit="s", minimum=1, maximum=_HUNDRED_YEARS_S,
        doc="how far back sacct looks (sacct -S)")
    replan_s: int = setting(
        600, unit="s", minimum=1, maximum=_HUNDRED_YEARS_S,
        doc="every job is planned again within replan_s..2*replan_s, whatever the skip "
            "analysis says (the safety net)")
    plan_chunk: int = setting(
        2000, minimum=1, maximum=10_000_000,
        doc="jobs loaded, planned and committed in one transaction")
    action_concurrency: int = setting(
        128, minimum=1, maximum=10_000,
        doc="Slurm actions of one wave run this many at a time, and a wave holds this "
            "many Submits (concurrent Starts, identity reads, releases and cancels are "
            "joined into shared commands: 128 fills two Start batches of 64); a tick "
            "keeps at most two waves in flight, planning the next while one runs")
    submit_slice: int = setting(
        256, minimum=1, maximum=1_000_000,
        doc="Submits one tick starts at most (in waves of action_concurrency); the rest "
            "of a burst waits for the next tick, which follows at once, so reads, "
            "cancels and new rows are acted on between slices (new rows first)")

    tombstone_ttl_s: int = setting(
        7 * 24 * 3600, unit="s", minimum=60, maximum=_HUNDRED_YEARS_S,
        doc="how long the database remembers a deleted job row (its tombstone): its live "
            "Slurm jobs are stopped as this deployment's, and its id written again is "
            "read before it is submitted, for this long")

    owner_check_s: int = setting(
        60, unit="s", minimum=1, maximum=_HUNDRED_YEARS_S,
        doc="how often a leader reads its deployment's ownership marker on the cluster "
            "(besides at every takeover): a database restored from a backup while its "
            "deployment runs is found within this long, and refused")

    phase_counts_s: int = setting(
        60, unit="s", minimum=0, maximum=_HUNDRED_YEARS_S,
        doc="dispatch_jobs (the jobs per phase: every status row of the shard's cluster, "
            "finished ones included, from an index) is counted again on a tick that saw rows "
            "change or made plans, and at least this often; 0: every tick")


DEFAULTS = ReconcileConfig()
