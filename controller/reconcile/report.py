"""What one tick did (``TickReport``): counts, errors, phase timings, and whether the next
tick should follow at once. Pure data, filled in by the tick and its parts."""

from __future__ import annotations

from collections import Counter as CountOf
from dataclasses import dataclass, field


@dataclass(slots=True)
class TickReport:
    tracked: int = 0
    planned: int = 0
    skipped: int = 0  # tracked jobs whose unchanged, quiet plan was not made again
    reloaded: int = 0  # rows read in full this tick (every row on a full load)
    full_load: bool = False
    # version triples read: every tracked job's on a full load, else the change feed's ids
    changed_rows: int = 0
    actions: CountOf[str] = field(default_factory=CountOf)
    errors: list[str] = field(default_factory=list)
    slurm_ok: bool = True
    accounting_ok: bool = True
    duration_s: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)
    # action outcomes (sbatch refused/deferred, outputs checked) wait for the next plan of
    # their jobs, or work was left for the next tick (``deferred``): tick again at once
    # rather than after the full interval
    replan_soon: bool = False
    # jobs left unplanned for the next tick: past the submit slice or the time budget
    deferred: int = 0
    # the clusters this tick's plans moved jobs to (their shards should tick soon)
    moved_to: set[str] = field(default_factory=set)
