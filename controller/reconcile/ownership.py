"""Ownership and the sweep (SPEC §6.2): what the tick does with our-format ``dj-`` Slurm
jobs that no job of the tick owned.

The planner decides (``plan.sweep``) from what the database knows, asked at the sweep
(not at the tick's start: a row written again meanwhile is tracked, and its plan adopts
its object): an id of a finished row or of a tombstone (a deleted row) is this
deployment's, and its live job is cancelled behind the adapter's identity check; an id
the database never had is a neighbouring deployment's on the same Slurm account --
counted (``dispatch_unowned_jobs``), listed in ``unowned_objects`` (``dispatchctl get
--unowned``) and never written. Expired tombstones are pruned here too.

``Owner`` keeps the other half of ownership: that no other database acts on this
deployment's jobs. Two databases with one deployment id (a backup restored while its
deployment runs) both know the same ids; the marker ``<output.dir>/.owners/<id>@<cluster>``
on the cluster tells them apart (``plan.claim``): every takeover writes a new token to the
database and then to the marker, every ``owner_check_s`` the leader reads it, and a
marker neither of its tokens is another database's -- the leader refuses to act
(``OwnershipConflict``, ``dispatch_ownership_conflict``, ``/readyz``, ``dispatchctl
owner``) until an operator stops one of the two and takes the cluster back
(``dispatchctl owner --take``)."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Container, Sequence
from contextlib import AbstractContextManager
from typing import Any

from controller.errors import DispatchError, LeaseLost, OwnershipConflict
from controller.metrics import Metrics
from controller.model.obs import ObjectObs
from controller.reconcile.plan import Cancel, ClaimStep, claim, sweep
from controller.reconcile.ports import SchedulerPort
from controller.reconcile.report import TickReport
from controller.reconcile.settings import ReconcileConfig
from controller.store import repo
from controller.store.db import Store

log = logging.getLogger("dispatch.tick")

PRUNE_EVERY_S = 3600  # expired tombstones are dropped at most this often

Write = Callable[[], AbstractContextManager[Any]]  # a fenced write transaction


class Sweeper:
    """One shard's sweep; remembers what it last listed of unowned jobs."""

    def __init__(self, store: Store, adapter: SchedulerPort, *, metrics: Metrics,
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


def new_token() -> str:
    """A fresh random token (hex): a deployment id, or a marker's token."""
    return os.urandom(16).hex()


class Owner:
    """One shard's claim on its cluster's ownership marker (module docstring)."""

    def __init__(self, store: Store, adapter: SchedulerPort, *, metrics: Metrics,
                 settings: ReconcileConfig, token: Callable[[], str] = new_token) -> None:
        self.store = store
        self.adapter = adapter
        self.metrics = metrics
        self.settings = settings
        self._token = token
        self._checked_at: int | None = None  # None: not claimed in this leadership
        self.conflict: str | None = None  # what the last check found, while it stands

    def forget(self) -> None:
        """A new leadership: the next tick claims the marker anew (a new token)."""
        self._checked_at = None

    async def ensure(self, *, now: int, write: Write) -> None:
        """Claim the marker at a takeover, check it every ``owner_check_s`` (and every
        tick while a conflict stands); ``OwnershipConflict`` when another database
        with this deployment's id wrote it."""
        takeover = self._checked_at is None
        if not takeover and self.conflict is None and \
                now - (self._checked_at or 0) < self.settings.owner_check_s:
            return
        cluster = self.adapter.cluster
        with self.store.transaction() as tx:
            deployment = repo.read_deployment_id(tx)
            row = repo.read_claim(tx, cluster)
        if deployment is None:
            with write() as tx:
                deployment = repo.deployment_id(tx, new=self._token(), now=now)
        marker = await self.adapter.owner_marker(deployment)
        step = claim(marker, row.token if row else None, row.previous if row else None,
                     takeover=takeover)
        if step is ClaimStep.CONFLICT:
            self._refuse(cluster, deployment, marker, row, write)
        if step is ClaimStep.MARK or step is ClaimStep.ROTATE:
            token = self._token() if row is None or step is ClaimStep.ROTATE else row.token
            previous = row.token if row is not None and step is ClaimStep.ROTATE else (
                row.previous if row is not None else None)
            with write() as tx:  # the database first: a marker is never ahead of it
                repo.save_claim(tx, cluster, token=token, previous=previous, now=now)
            await self.adapter.set_owner_marker(deployment, token)
        elif step is ClaimStep.RESUME:
            assert row is not None
            await self.adapter.set_owner_marker(deployment, row.token)
        if row is not None and row.conflict and step is ClaimStep.KEEP:
            with write() as tx:
                repo.note_conflict(tx, cluster, "")
        if self.conflict is not None:
            log.warning("ownership marker is this database's again: acting",
                        extra={"cluster": cluster})
        self.conflict = None
        self.metrics.ownership_conflict.set(0)
        self._checked_at = now

    def _refuse(self, cluster: str, deployment: str, marker: str | None,
                row: repo.ClaimRow | None, write: Write) -> None:
        message = (f"cluster {cluster}: another database with this deployment's id "
                   f"({deployment}) acts on it (marker {marker}, this database's "
                   f"{row.token if row else 'none'}): a backup restored while its "
                   "deployment runs? Not acting. Stop one of the two, then "
                   "`dispatchctl owner --take` where the jobs belong")
        if self.conflict is None:
            log.error("ownership conflict: not acting", extra={
                "cluster": cluster, "deployment": deployment, "marker": marker,
                "token": row.token if row else None})
        self.conflict = message
        self.metrics.ownership_conflict.set(1)
        if row is not None and row.conflict != message:
            try:
                with write() as tx:
                    repo.note_conflict(tx, cluster, message)
            except DispatchError as exc:
                log.warning("could not record the conflict", extra={"error": str(exc)})
        raise OwnershipConflict(message)
