"""Ownership and the sweep (SPEC §6.2): what the tick does with our-format ``dj-`` Slurm
jobs that no job of the tick owned.

The planner decides (``plan.sweep``) from what the database knows, asked at the sweep
(not at the tick's start: a row written again meanwhile is tracked, and its plan adopts
its object): an id of a finished row or of a tombstone (a deleted row) is this
deployment's, and its live job is cancelled behind the adapter's identity check; an id
the database never had is a neighbouring deployment's on the same Slurm account --
counted (``dispatch_unowned_jobs``), listed in ``unowned_objects`` (``dispatchctl get
--unowned``) and never written. Expired tombstones are pruned here too."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Container, Sequence
from contextlib import AbstractContextManager
from typing import Any

from controller.errors import DispatchError, LeaseLost
from controller.metrics import Metrics
from controller.model.obs import ObjectObs
from controller.reconcile.plan import Cancel, sweep
from controller.reconcile.ports import SlurmPort
from controller.reconcile.report import TickReport
from controller.reconcile.settings import ReconcileConfig
from controller.store import repo
from controller.store.db import Store

log = logging.getLogger("dispatch.tick")

PRUNE_EVERY_S = 3600  # expired tombstones are dropped at most this often

Write = Callable[[], AbstractContextManager[Any]]  # a fenced write transaction


class Sweeper:
    """One shard's sweep; remembers what it last listed of unowned jobs."""

    def __init__(self, store: Store, adapter: SlurmPort, *, metrics: Metrics,
                 settings: ReconcileConfig) -> None:
        self.store = store
        self.adapter = adapter
        self.metrics = metrics
        self.settings = settings
        self._unowned: frozenset[tuple[str, int]] | None = None  # as last saved
        self._pruned_at = 0

    def forget(self) -> None:
        """A new leadership: the unowned jobs are saved again at its first sweep."""
        self._unowned = None

    async def run(self, strays: dict[str, list[ObjectObs]], owned: Container[str], *,
                  report: TickReport, now: int, write: Write, guard: Callable[[], None],
                  record_event: Callable[[str, str, str], None]) -> None:
        """Sweep ``strays`` (the tick's read of our-format jobs of no job in ``owned``,
        the jobs this tick tracked)."""
        ids = [job_id for job_id in strays if job_id not in owned]
        tracked: set[str] = set()
        known: set[str] = set()
        if ids:
            with self.store.transaction() as tx:
                tracked, known = repo.ownership(tx, ids)
        decided = sweep({job_id: strays[job_id] for job_id in ids}, tracked=tracked,
                        known=known)
        self._save_unowned(decided.unowned, now, write)
        self._prune(now, write)
        gate = asyncio.Semaphore(self.settings.action_concurrency)

        async def cancel(action: Cancel) -> None:
            async with gate:
                try:
                    guard()
                    await self.adapter.stop(action.ref)
                except LeaseLost:
                    raise
                except DispatchError as exc:
                    report.errors.append(f"{action.job_id}: sweep: {exc}")
                    self.metrics.action_errors.labels(action="sweep").inc()
                    return
                report.actions["sweep"] += 1
                self.metrics.duplicates.inc()
                log.info("cancelled a Slurm job of a finished or deleted record",
                         extra={"job": action.job_id, "slurm_id": action.ref.id})
                record_event(action.job_id, "OrphanCancelled",
                             f"Slurm job {action.ref.id} belongs to no tracked "
                             "submission: cancelled")

        await asyncio.gather(*(cancel(c) for c in decided.cancels))

    def _save_unowned(self, unowned: Sequence[ObjectObs], now: int, write: Write) -> None:
        """Count the neighbours' jobs, and list them in the database when the set
        changed."""
        self.metrics.unowned.set(len(unowned))
        key = frozenset((o.ref.uid, o.ref.id) for o in unowned)
        if key == self._unowned:
            return
        if unowned and not self._unowned:
            log.warning("dj- Slurm jobs of ids this database never had: a neighbouring "
                        "deployment's on the same Slurm account; never written",
                        extra={"count": len(unowned),
                               "slurm_ids": [o.ref.id for o in unowned[:20]]})
        try:
            with write() as tx:
                repo.save_unowned(tx, self.adapter.cluster, unowned, now=now)
        except LeaseLost:
            raise
        except DispatchError as exc:
            log.warning("could not save the unowned jobs", extra={"error": str(exc)})
            return
        self._unowned = key

    def _prune(self, now: int, write: Write) -> None:
        """Drop expired tombstones, at most every ``PRUNE_EVERY_S``."""
        if now - self._pruned_at < PRUNE_EVERY_S:
            return
        self._pruned_at = now
        try:
            with write() as tx:
                repo.prune_tombstones(tx, ttl_s=self.settings.tombstone_ttl_s)
        except LeaseLost:
            raise
        except DispatchError as exc:
            log.warning("could not prune tombstones", extra={"error": str(exc)})
