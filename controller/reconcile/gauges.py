"""The gauges a tick publishes from what it remembers of its jobs: object states, stale
jobs, the oldest pending job (from each job's share, ``job_gauge``), and the phase counts
of the shard (one query, now and then)."""

from __future__ import annotations

from collections import Counter as CountOf
from collections.abc import Iterable
from dataclasses import dataclass

from controller.metrics import Metrics
from controller.model.job import TERMINAL_PHASES, JobState
from controller.model.obs import State
from controller.reconcile.placement import Clusters
from controller.store import repo
from controller.store.db import Store

# one job's share of the gauges: (object state label, stale, pending since)
Gauge = tuple[str | None, bool, int | None]


def job_gauge(st: JobState) -> Gauge | None:
    """One job's share of the object-state, stale and oldest-pending gauges."""
    if st.phase in TERMINAL_PHASES:
        return None
    label = None
    if st.object_state is not None:
        label = st.object_state.value
    elif st.current is not None:
        label = "unknown" if st.unknown_since else "pending"
    stale = any(c.type == "Stale" and c.status for c in st.conditions)
    if st.object_state in (State.PENDING, State.GATED, State.HELD) and st.current:
        return label, stale, st.current.created_at
    return _shared_gauge(label, stale)


# the few gauge tuples most jobs share (a job keeps a reference, not a copy): immutable
# values, the same for every reconciler
_SHARED: dict[tuple[str | None, bool], Gauge] = {}


def _shared_gauge(label: str | None, stale: bool) -> Gauge:
    gauge = _SHARED.get((label, stale))
    if gauge is None:
        gauge = _SHARED[(label, stale)] = (label, stale, None)
    return gauge


@dataclass(frozen=True, slots=True)
class Summary:
    """What the gauges take from every tracked job's share (``summarize``)."""

    states: dict[str, int]
    stale: int
    pending_since: int | None


def summarize(gauges: Iterable[Gauge | None]) -> Summary:
    """Count each tracked job's share of the gauges (``job_gauge``)."""
    states: CountOf[str] = CountOf()
    stale = 0
    pending_since: int | None = None
    # most jobs share one of a few gauge tuples: count those first
    for (label, is_stale, since), count in CountOf(
            g for g in gauges if g is not None).items():
        if label is not None:
            states[label] += count
        if is_stale:
            stale += count
        if since is not None and (pending_since is None or since < pending_since):
            pending_since = since
    return Summary(dict(states), stale, pending_since)


def refresh(metrics: Metrics, summary: Summary, *, store: Store,
            here: str | None, clusters: Clusters | None, now: int,
            phases: bool = True) -> None:
    """Publish the gauges of a shard's jobs (``summary``: of each tracked job's share;
    the tick summarizes again only when its memory changed); the phase counts too with
    ``phases`` (every status row of the cluster, an index range: the tick asks for them
    when rows changed, and every ``reconcile.phase_counts_s``)."""
    states, stale, pending_since = summary.states, summary.stale, summary.pending_since
    metrics.set_object_counts(states)
    metrics.stale.set(stale)
    metrics.oldest_pending.set(max(0, now - pending_since) if pending_since is not None else 0)
    if not phases:
        return
    with store.transaction() as tx:
        metrics.set_phase_counts(repo.phase_counts(
            tx, here, unplaced=clusters is None or clusters.default == here))
