"""A small Python client for workflow backends: submit, get, wait, cancel, hold, release.

It talks to the controller's database only (the daemon does the Slurm side), so it
works from any process that can reach the database. ``dispatchctl`` reads and writes
the database through it alone. A database that cannot be reached raises
``TransientError`` (``database unavailable: ...``) from any method.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from controller.errors import ErrInvalid, ErrNotFound
from controller.model.ids import new_job_id, parse_job_id
from controller.model.job import TERMINAL_PHASES, Desired
from controller.model.spec import JobDocument
from controller.store import repo
from controller.store.db import Store
from controller.store.lease import LeaseInfo, read_lease, read_leases
from controller.store.models import Event, Submission

TERMINAL = frozenset(p.value for p in TERMINAL_PHASES)


@dataclass(frozen=True, slots=True)
class Description:
    """The leader lease and, when a job was asked for, its view, submissions and events."""

    leader: LeaseInfo | None
    job: repo.JobView | None = None
    submissions: tuple[Submission, ...] = ()
    events: tuple[Event, ...] = ()
    leases: tuple[LeaseInfo, ...] = ()  # every shard's lease (``leader``: the default's)
    unowned: int = 0  # neighbours' dj- jobs the leaders last saw (``Client.unowned``)


class Client:
    def __init__(self, database_url: str, *, clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.store = Store(database_url)
        self.clock = clock
        self.sleep = sleep

    def close(self) -> None:
        self.store.dispose()

    def schema_revision(self) -> str | None:
        """The database schema's revision; None before ``dispatchctl migrate``."""
        return self.store.current_revision()

    def require_schema(self) -> None:
        """ErrInvalid unless the schema exists (``dispatchctl migrate`` creates it)."""
        if self.schema_revision() is None:
            raise ErrInvalid("the database has no schema yet: run 'dispatchctl migrate' first",
                             field="database")

    def migrate(self, revision: str = "head") -> str | None:
        """Create or upgrade the schema; returns the revision it is at."""
        self.store.migrate(revision)
        return self.schema_revision()

    def submit(self, document: Mapping[str, Any] | JobDocument, *, job_id: str | None = None,
               policy: Mapping[str, Any] | None = None, held: bool = False) -> str:
        """Write a desired job record; returns its id. Validation errors raise ErrInvalid
        (a ``JobDocument`` is not validated again)."""
        jid = parse_job_id(job_id) if job_id else new_job_id()
        with self.store.transaction() as tx:
            repo.insert_job(tx, job_id=jid, document=document,
                            desired="held" if held else "run", policy=policy,
                            now=int(self.clock()))
        return jid

    def get(self, job_id: str) -> dict[str, Any]:
        (view,) = self.views(job_id=job_id)
        return view.to_json()

    def list_jobs(self, selector: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
        return [v.to_json() for v in self.views(selector=selector)]

    def views(self, *, job_id: str | None = None,
              selector: Mapping[str, str] | None = None) -> list[repo.JobView]:
        """One job (ErrNotFound if there is none) or every job whose labels match."""
        with self.store.transaction() as tx:
            return repo.list_jobs(tx, job_id=job_id, selector=selector)

    def views_by_ids(self, job_ids: Sequence[str]) -> dict[str, repo.JobView]:
        """The views of the jobs among ``job_ids`` that exist, by id, read in one
        transaction (one statement per 500 ids); ids of no job are left out."""
        if not job_ids:
            return {}
        with self.store.transaction() as tx:
            return {v.id: v for v in repo.list_jobs_by_ids(tx, job_ids)}

    def unowned(self, cluster: str | None = None) -> list[dict[str, Any]]:
        """The ``dj-`` Slurm jobs whose id this database never had (a neighbouring
        deployment's on the same Slurm account), as each cluster's leader last saw
        them: never written by this deployment."""
        with self.store.transaction() as tx:
            return [u.to_json() for u in repo.list_unowned(tx, cluster)]

    def claims(self) -> tuple[str | None, list[repo.ClaimRow]]:
        """This database's deployment id (None before a leader first claimed a cluster)
        and its claim of each cluster's ownership marker."""
        with self.store.transaction() as tx:
            return repo.read_deployment_id(tx), repo.list_claims(tx)

    def take_claim(self, cluster: str, token: str) -> str:
        """Record ``token`` as the marker this database wrote to ``cluster`` (the
        operator's ``dispatchctl owner --take``, which writes the marker next); the
        deployment id."""
        now = int(self.clock())
        with self.store.transaction() as tx:
            deployment = repo.deployment_id(tx, new=os.urandom(16).hex(), now=now)
            row = repo.read_claim(tx, cluster)
            repo.save_claim(tx, cluster, token=token,
                            previous=row.token if row is not None else None, now=now)
        return deployment

    def describe(self, job_id: str | None = None) -> Description:
        """The leader lease and (with ``job_id``) the job's submissions and events, read
        in one transaction."""
        with self.store.transaction() as tx:
            leader = read_lease(tx)
            leases = tuple(read_leases(tx))
            if job_id is None:
                return Description(leader, leases=leases,
                                   unowned=len(repo.list_unowned(tx)))
            (view,) = repo.list_jobs(tx, job_id=job_id)
            return Description(leader, view, tuple(repo.list_submissions(tx, job_id)),
                               tuple(repo.list_events(tx, job_id)), leases=leases)

    def _set(self, job_ids: list[str], desired: Desired) -> int:
        with self.store.transaction() as tx:
            changed = repo.set_desired(tx, job_ids, desired, now=int(self.clock()))
        if changed == 0 and job_ids:
            raise ErrNotFound(f"no job {job_ids[0]}" if len(job_ids) == 1 else "no such jobs")
        return changed

    def set_desired(self, job_id: str, desired: Desired) -> None:
        """Run, hold or stop one job (ErrNotFound if there is none)."""
        self._set([parse_job_id(job_id, field="id")], desired)

    def set_desired_selector(self, selector: Mapping[str, str], desired: Desired) -> int:
        """Run, hold or stop every job whose labels match; returns how many changed."""
        if not selector:
            raise ErrInvalid("an empty selector would match every job", field="selector")
        with self.store.transaction() as tx:
            ids = repo.job_ids_by_selector(tx, selector)
            return repo.set_desired(tx, ids, desired, now=int(self.clock()))

    def cancel(self, job_id: str) -> None:
        self._set([job_id], Desired.STOPPED)

    def hold(self, job_id: str) -> None:
        self._set([job_id], Desired.HELD)

    def release(self, job_id: str) -> None:
        self._set([job_id], Desired.RUN)

    def cancel_selector(self, selector: Mapping[str, str]) -> int:
        """Bulk stop: every job whose labels match (a whole workflow)."""
        return self.set_desired_selector(selector, Desired.STOPPED)

    def wait(self, job_id: str, *, timeout: float | None = None, poll_s: float = 1.0,
             on_change: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
        """Block until the job reaches a terminal phase (or ``timeout``: TimeoutError).
        The view's ``warning`` tells a failure under ``on_exhausted: warn`` (the workflow
        may go on) from any other failure."""
        deadline = None if timeout is None else self.clock() + timeout
        last: tuple[Any, ...] | None = None
        while True:
            view = self.get(job_id)
            key = (view["phase"], view["object_state"], view["attempt"], view["slurm_job_id"])
            if key != last and on_change is not None:
                on_change(view)
            last = key
            if view["phase"] in TERMINAL:
                return view
            if deadline is not None and self.clock() >= deadline:
                raise TimeoutError(f"job {job_id} is still {view['phase']}")
            self.sleep(poll_s)


def dumps(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=True)
