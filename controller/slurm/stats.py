"""Cluster statistics (``ClusterStats``): running and pending jobs of every user, nodes
that are down or drained, and how long jobs wait, from one squeue and one sinfo. Pure:
the argv of each command and the parsing of their text; the adapter runs them.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Sequence
from typing import Final

from controller.errors import ProtocolError
from controller.reconcile.ports import ClusterStats
from controller.slurm import dialects

RECENT_START_WINDOW_S: Final = 3600  # "started recently"
_WAITING_FOR_RESOURCES: Final = frozenset({
    "", "None", "Priority", "Resources", "ReqNodeNotAvail", "Reservation", "Licenses", "NodeDown",
    "PartitionDown", "PartitionInactive", "Constraints", "JobArrayTaskLimit",
})

# Every user's pending and running jobs; every node and its state.
QUEUE_ARGV: Final = ("squeue", "-h", "-a", "--states=PENDING,RUNNING",
                     "-O", "JobID:|,StateCompact:|,SubmitTime:|,StartTime:|,Reason:|")
NODES_ARGV: Final = ("sinfo", "-h", "-N", "-o", "%N|%T")


def parse_cluster_stats(queue: str, nodes: str, *, now: int) -> ClusterStats:
    """``ClusterStats`` from the stdout of ``QUEUE_ARGV`` and of ``NODES_ARGV``."""
    running = pending = 0
    estimates: list[float] = []
    recent: list[float] = []
    for line in queue.splitlines():
        fields = line.split("|", 4)
        if len(fields) != 5:
            continue
        _, compact, submit_text, start_text, reason = fields
        reason = re.split(r"[,:(]", reason.rstrip("|"), maxsplit=1)[0].strip()
        try:
            submit = dialects.parse_text_time(submit_text)
            start = dialects.parse_text_time(start_text)
        except ProtocolError:
            continue
        if compact == "PD":
            pending += 1
            if reason in _WAITING_FOR_RESOURCES and start is not None:
                estimates.append(float(max(0, start - now)))
        elif compact == "R":
            running += 1
            if (start is not None and submit is not None
                    and now - RECENT_START_WINDOW_S <= start <= now):
                recent.append(float(max(0, start - submit)))
    down: set[str] = set()
    for line in nodes.splitlines():
        name, _, state = line.partition("|")
        base = state.strip().lower().rstrip("*~#!%$@^-+")
        if name and (state.strip().endswith("*")
                     or base.startswith(("down", "drain", "fail", "no_respond"))):
            down.add(name.strip())
    return ClusterStats(
        running=running, pending=pending, down_nodes=frozenset(down),
        estimated_wait_s=_median(estimates), observed_wait_s=_median(recent),
        extra={"pending_with_estimate": str(len(estimates)),
               "recent_starts": str(len(recent))})


def _median(values: Sequence[float]) -> float | None:
    return float(statistics.median(values)) if values else None
