"""Repository functions over the job tables. Each takes a Session; none commits.

Loading turns rows into the planner's ``JobState`` (validating rows that other
services wrote straight into ``jobs``); saving writes only what a plan changed.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import pairwise
from types import MappingProxyType
from typing import Any, NamedTuple

from sqlalchemy import (
    ARRAY,
    String,
    and_,
    any_,
    bindparam,
    delete,
    func,
    insert,
    literal,
    literal_column,
    or_,
    select,
    text,
    union,
    union_all,
    update,
)
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import ColumnElement

from controller.errors import DispatchError, ErrConflict, ErrInvalid, ErrNotFound
from controller.model.ids import parse_job_id
from controller.model.job import (
    TERMINAL_PHASES,
    Condition,
    Current,
    Desired,
    JobState,
    Phase,
    PlannedEvent,
    SubmissionUpdate,
)
from controller.model.obs import Cause, CauseKind, ObjectObs, ObjectRef, Provenance, State
from controller.model.policy import DEFAULT_POLICY, RecoveryPolicy, parse_policy
from controller.model.spec import JobDocument, JobSpec, parse_job_document
from controller.store.models import (
    Claim,
    Deployment,
    Event,
    Job,
    JobStatus,
    Submission,
    Tombstone,
    UnownedObject,
)

TERMINAL = tuple(p.value for p in TERMINAL_PHASES)


# ---------------------------------------------------------------- client side


def insert_job(tx: Session, *, job_id: str, document: Mapping[str, Any] | JobDocument,
               desired: str = "run", policy: Mapping[str, Any] | None = None,
               now: int) -> None:
    """Write a new desired job record (validated first, so clients get errors at once;
    a ``JobDocument`` has been validated already)."""
    parse_job_id(job_id)
    if not isinstance(document, JobDocument):
        document = JobDocument.parse(document)
    Desired(desired)
    if policy is not None:
        parse_policy(policy)
    labels = document.document.get("labels", {})
    tx.add(Job(id=job_id, spec=json.dumps(document.document, sort_keys=True),
               labels=json.dumps(labels, sort_keys=True), desired=desired,
               policy=None if policy is None else json.dumps(policy, sort_keys=True),
               generation=1, created_at=now, updated_at=now))


def set_desired(tx: Session, job_ids: Sequence[str], desired: Desired, *, now: int) -> int:
    """Change the desired state of jobs; returns how many rows changed."""
    if not job_ids:
        return 0
    result = tx.execute(update(Job).where(Job.id.in_(list(job_ids)))
                        .values(desired=desired.value, updated_at=now))
    return int(result.rowcount or 0)  # type: ignore[attr-defined]


def selector_matches(labels: Mapping[str, str], selector: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def parse_selector(text: str) -> dict[str, str]:
    """``k=v,k2=v2`` -> dict. Equality only, like kubectl's simplest form."""
    out: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep or not key:
            raise ErrInvalid(f"selector terms are key=value: {part!r}", field="selector")
        out[key.strip()] = value.strip().lstrip("=")
    return out


def job_ids_by_selector(tx: Session, selector: Mapping[str, str]) -> list[str]:
    rows = tx.execute(select(Job.id, Job.labels)).all()
    out = []
    for job_id, labels in rows:
        try:
            decoded = json.loads(labels or "{}")
        except json.JSONDecodeError:
            continue
        if isinstance(decoded, dict) and selector_matches(decoded, selector):
            out.append(job_id)
    return sorted(out)


# ---------------------------------------------------------------- views for the CLI


@dataclass(frozen=True, slots=True)
class JobView:
    id: str
    desired: str
    generation: int
    labels: dict[str, str]
    phase: str
    attempt: int
    submission: int
    slurm_job_id: int | None
    cause: str | None
    cause_detail: str
    exit_code: int | None
    object_state: str | None
    reason: str
    nodes: str
    conditions: list[dict[str, Any]]
    created_at: int
    updated_at: int
    cluster: str | None = None  # where it is placed (None: not yet)

    @property
    def warning(self) -> bool:
        """Failed with a warning (the policy's ``on_exhausted: warn``): the recovery budget
        is spent, and the workflow may go on. Always False unless phase is failed."""
        return any(c.get("type") == "Warning" and c.get("status") for c in self.conditions)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id, "phase": self.phase, "desired": self.desired,
            "warning": self.warning,
            "generation": self.generation, "labels": self.labels, "attempt": self.attempt,
            "submission": self.submission, "slurm_job_id": self.slurm_job_id,
            "cause": self.cause, "cause_detail": self.cause_detail, "exit_code": self.exit_code,
            "object_state": self.object_state, "reason": self.reason, "nodes": self.nodes,
            "conditions": self.conditions, "created_at": self.created_at,
            "updated_at": self.updated_at, "cluster": self.cluster,
        }


def _view(job: Job, status: JobStatus | None) -> JobView:
    try:
        labels = json.loads(job.labels or "{}")
    except json.JSONDecodeError:
        labels = {}
    return JobView(
        id=job.id, desired=job.desired, generation=job.generation,
        labels=labels if isinstance(labels, dict) else {},
        phase=status.phase if status else Phase.PENDING.value,
        attempt=status.attempt if status else 0,
        submission=status.current_submission or status.submission if status else 0,
        slurm_job_id=status.slurm_job_id if status else None,
        cause=status.cause if status else None,
        cause_detail=status.cause_detail if status else "",
        exit_code=status.exit_code if status else None,
        object_state=status.object_state if status else None,
        reason=status.reason if status else "",
        nodes=status.nodes if status else "",
        conditions=json.loads(status.conditions) if status else [],
        created_at=job.created_at, updated_at=status.updated_at if status else job.updated_at,
        cluster=status.cluster if status else None,
    )


def list_jobs(tx: Session, *, job_id: str | None = None,
              selector: Mapping[str, str] | None = None) -> list[JobView]:
    query = select(Job, JobStatus).outerjoin(JobStatus, JobStatus.job_id == Job.id)
    if job_id is not None:
        query = query.where(Job.id == job_id)
    views = [_view(j, s) for j, s in tx.execute(query.order_by(Job.id)).all()]
    if job_id is not None and not views:
        raise ErrNotFound(f"no job {job_id}")
    if selector:
        views = [v for v in views if selector_matches(v.labels, selector)]
    return views


def list_jobs_by_ids(tx: Session, job_ids: Sequence[str]) -> list[JobView]:
    """The views of the jobs among ``job_ids`` that exist, in id order: one statement
    per ``_IN_CHUNK`` ids (a workflow backend's status cycle over its active jobs)."""
    query = select(Job, JobStatus).outerjoin(JobStatus, JobStatus.job_id == Job.id)
    rows = _by_ids(tx, query, Job.id, sorted(set(job_ids)))
    return sorted((_view(j, s) for j, s in rows), key=lambda v: v.id)


def list_submissions(tx: Session, job_id: str) -> list[Submission]:
    return list(tx.scalars(select(Submission).where(Submission.job_id == job_id)
                           .order_by(Submission.submission)))


def list_events(tx: Session, job_id: str, *, limit: int = 200) -> list[Event]:
    rows = tx.scalars(select(Event).where(Event.job_id == job_id).order_by(Event.id.desc())
                      .limit(limit))
    return list(reversed(list(rows)))


def phase_counts(tx: Session, cluster: str | None = None, *,
                 unplaced: bool = True) -> dict[str, int]:
    """Jobs per phase; a job with no status row yet is pending. With ``cluster``: the
    jobs placed on it, and (``unplaced``: the default cluster's count) those not placed
    on any cluster yet.

    Counts ``job_status`` (with ``cluster``: its range of the (cluster, phase) index, and
    that of the jobs not placed yet) and the numbers of jobs and of status rows:
    every status row belongs to a job (the foreign key cascades on PostgreSQL, and a
    trigger does on SQLite whatever the connection's ``foreign_keys``: migration 0002)."""
    counts = _added_up(tx.execute(phase_counts_query(cluster, unplaced=unplaced)))
    if unplaced:
        jobs = tx.scalar(select(func.count()).select_from(Job)) or 0
        with_status = tx.scalar(select(func.count()).select_from(JobStatus)) or 0
        if jobs > with_status:
            counts[Phase.PENDING.value] = (counts.get(Phase.PENDING.value, 0)
                                           + jobs - with_status)
    return counts


def phase_counts_query(cluster: str | None, *, unplaced: bool) -> Any:
    """``phase_counts``' statement over ``job_status``: with ``cluster``, its range of the
    (cluster, phase) index (migration 0008), and with ``unplaced`` that of the jobs not
    placed yet -- not every status row of every cluster."""
    by_phase = select(JobStatus.phase, func.count()).group_by(JobStatus.phase)
    if cluster is None:
        return by_phase
    here = by_phase.where(JobStatus.cluster == cluster)
    return union_all(here, by_phase.where(JobStatus.cluster.is_(None))) if unplaced else here


def placed_elsewhere(tx: Session, clusters: Sequence[str]) -> dict[str, int]:
    """Non-terminal jobs placed on a cluster that is not one of ``clusters``, by cluster:
    no shard of a replica configured with ``clusters`` plans them (the configuration
    dropped the cluster, or renamed it). Counts ``job_status`` alone."""
    return _added_up(tx.execute(placed_elsewhere_query(clusters)))


def _added_up(rows: Iterable[Any]) -> dict[str, int]:
    """(key, count) rows of a ``UNION ALL`` of counts, a key's counts added up."""
    counts: dict[str, int] = {}
    for key, count in rows:
        counts[str(key)] = counts.get(str(key), 0) + int(count)
    return counts


def placed_elsewhere_query(clusters: Sequence[str]) -> Any:
    """``placed_elsewhere``'s statement: one range of the (cluster, phase) index
    (migration 0008) per gap between the configured names, so what it reads is the rows
    of the clusters not named -- none, while every placed job is on a named cluster --
    however many jobs are placed on ``clusters``. (A cluster's rows may come in more than
    one row of counts: the caller adds them up.)"""
    column = JobStatus.cluster
    names = sorted(set(clusters))
    gaps: list[ColumnElement[bool]]
    if not names:
        gaps = [column.is_not(None)]
    else:
        gaps = [column < names[0], column > names[-1],
                *(and_(column > low, column < high) for low, high in pairwise(names))]
    counted = select(column, func.count()).where(JobStatus.phase.not_in(TERMINAL))
    return union_all(*(counted.where(gap).group_by(column) for gap in gaps))


# ---------------------------------------------------------------- controller side


@dataclass(frozen=True, slots=True)
class LoadedJob:
    state: JobState
    reject_reason: str = ""
    has_status: bool = True
    # the status row as loaded (its ``SAVED_COLUMNS`` values, in order), for no-op
    # detection: the plan's values are compared with it (a chunk's rows at a time)
    previous: tuple[Any, ...] | None = None
    version: int = 0  # jobs.version of the row loaded (see migration 0002)
    status_version: int | None = None  # job_status.version; None: no status row yet


def _decode_conditions(text: str) -> tuple[Condition, ...]:
    if not text or text == "[]":
        return ()
    try:
        raw = json.loads(text)
        # the same few types, reasons and messages on every job: shared, not copied
        return tuple(Condition(_shared(c["type"]), bool(c["status"]), _shared(c["reason"]),
                               _shared(c["message"]), int(c["since"]),
                               int(c["observed_generation"])) for c in raw)
    except (json.JSONDecodeError, KeyError, TypeError, ValueError):
        return ()


def _shared(value: Any) -> Any:
    """One copy of a text that many loaded jobs hold (memory at 100k jobs)."""
    return sys.intern(value) if type(value) is str else value


def _encode_int_map(values: Mapping[str, int]) -> str:
    """A budgets or excluded-nodes column (``_int_map`` reads it back)."""
    return json.dumps(dict(sorted(values.items()))) if values else "{}"


def encode_conditions(conditions: Iterable[Condition]) -> str:
    if conditions == ():
        return "[]"
    return json.dumps([{"type": c.type, "status": c.status, "reason": c.reason,
                        "message": c.message, "since": c.since,
                        "observed_generation": c.observed_generation} for c in conditions])


# job id -> (jobs.version, validated row): the version moves on every write of the row
SpecCache = dict[str, tuple[int, Any]]


def storable_text(text: str) -> str:
    """``text`` as every database can store it: a reason may quote a client's key, which
    may hold NUL (PostgreSQL refuses it) or a lone surrogate (no UTF-8 encoding)."""
    return text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")


def _validate_row(job_id: str, spec_text: str, policy_text: str | None,
                  desired_text: str) -> tuple[JobSpec, Any, Desired]:
    parse_job_id(job_id, field="id")
    try:
        doc = json.loads(spec_text)
    except (ValueError, TypeError, RecursionError) as exc:
        # JSONDecodeError, Python's int-digits limit, nesting past the recursion limit:
        # one broken row must never stop the tick for every other job
        raise ErrInvalid(f"not JSON: {str(exc)[:200]}", field="spec") from None
    spec = parse_job_document(doc)
    try:
        policy = parse_policy(policy_text)
    except (ValueError, RecursionError) as exc:  # ErrInvalid is no ValueError
        raise ErrInvalid(f"not JSON: {str(exc)[:200]}", field="policy") from None
    try:
        desired = Desired(desired_text)
    except ValueError:
        raise ErrInvalid("must be run, held or stopped", field="desired") from None
    return spec, policy, desired


def _validated(cache: SpecCache | None, row: Any) -> tuple[JobSpec, Any, Desired] | DispatchError:
    """Validate a ``load_tracked`` row, reusing the result for a row whose version did
    not move (a row reloaded because only its status changed)."""
    job_id = row.id
    if cache is not None:
        hit = cache.get(job_id)
        if hit is not None and hit[0] == row.version:
            return hit[1]  # type: ignore[no-any-return]
    try:
        result: tuple[JobSpec, Any, Desired] | DispatchError = _validate_row(
            job_id, row.spec, row.policy, row.desired)
    except DispatchError as exc:
        result = exc
    if cache is not None:
        cache[job_id] = (row.version, result)
    return result


_NO_ENTRIES: Mapping[str, int] = MappingProxyType({})  # shared, read-only


def _int_map(text: str) -> Mapping[str, int]:
    if not text or text == "{}":
        return _NO_ENTRIES
    try:
        raw = json.loads(text)
        return {str(k): int(v) for k, v in raw.items()}
    except (json.JSONDecodeError, AttributeError, TypeError, ValueError):
        return _NO_ENTRIES


# The status columns the controller writes, in ``status_row_values`` order (updated_at
# and version are not compared: the first moves with every write, the trigger owns the other).
SAVED_COLUMNS: tuple[str, ...] = (
    "phase", "observed_generation", "submission", "attempt", "current_submission",
    "current_since", "slurm_job_id", "slurm_submit", "cluster", "object_state", "cause",
    "cause_detail", "exit_code", "reason", "budgets_used", "excluded_nodes", "conditions",
    "not_before", "unknown_since", "hold_instance", "nodes", "started_at", "ended_at",
    "outputs_verified", "sluid",
)
_SAVED_FIRST = 8  # index of the first SAVED_COLUMNS column in a load_tracked row


class _FetchedRow(NamedTuple):
    """A ``fetch_tracked`` row as a plain tuple: a SQLAlchemy ``Row``'s attribute costs about
    ten times a tuple's, and building a new leader's 100k jobs reads ~40 of each row's. The
    status columns (``SAVED_COLUMNS``, in order) are None without a status row (outer join)."""

    id: str
    spec: str
    policy: str | None
    desired: str
    generation: int
    version: int
    has_status: str | None
    sv: int | None
    phase: Any
    observed_generation: Any
    submission: Any
    attempt: Any
    current_submission: Any
    current_since: Any
    slurm_job_id: Any
    slurm_submit: Any
    cluster: Any
    object_state: Any
    cause: Any
    cause_detail: Any
    exit_code: Any
    reason: Any
    budgets_used: Any
    excluded_nodes: Any
    conditions: Any
    not_before: Any
    unknown_since: Any
    hold_instance: Any
    nodes: Any
    started_at: Any
    ended_at: Any
    outputs_verified: Any
    sluid: Any


assert _FetchedRow._fields[_SAVED_FIRST:] == SAVED_COLUMNS
_IN_CHUNK = 500  # ids per IN (...) list: well under every SQLite's variable limit


def _by_ids(tx: Session, query: Any, column: Any, ids: Sequence[str]) -> list[Any]:
    """The rows of ``query`` whose ``column`` is one of ``ids``, one statement per
    ``_IN_CHUNK`` ids. On PostgreSQL the ids go as one array parameter (``= ANY``): the
    driver parses (and caches) one statement instead of one per list length."""
    postgres = tx.get_bind().dialect.name == "postgresql"
    return [row for start in range(0, len(ids), _IN_CHUNK)
            for row in tx.execute(query.where(
                column == any_(literal(ids[start:start + _IN_CHUNK], _ID_ARRAY)) if postgres
                else column.in_(ids[start:start + _IN_CHUNK]))).all()]  # (one fetchall)


_ID_ARRAY = ARRAY(String)


def _tracked() -> Any:
    """WHERE clause: jobs with no status yet, or a status that is not terminal."""
    return (JobStatus.job_id.is_(None)) | (JobStatus.phase.not_in(TERMINAL))


def _shard(cluster: str | None) -> Any:
    """WHERE clause: the tracked jobs the shard of ``cluster`` may plan -- those placed on
    it and those not placed yet (``controller.reconcile.placement``); None: every one."""
    if cluster is None:
        return _tracked()
    # (a job without a status row has no cluster either: the outer join's NULL)
    return _tracked() & ((JobStatus.cluster == cluster) | JobStatus.cluster.is_(None))


# (dialect, cluster) -> the versions query with its literals inlined (a cluster name is
# 1-64 of [A-Za-z0-9_.-]: nothing to quote)
_VERSIONS_SQL: dict[tuple[str, str | None], str] = {}


def tracked_versions(tx: Session, cluster: str | None = None, *,
                     ids: Collection[str] | None = None,
                     ) -> list[tuple[str, int, int | None]]:
    """(job id, jobs.version, job_status.version or None) of every tracked job (of the
    shard of ``cluster``: ``_shard``): the cheap read that tells the tick which rows
    changed since it loaded them; with ``ids``, of those of them that are tracked (a
    chunk of ids per statement). It runs on the driver's cursor: 100k plain tuples cost
    a fraction of 100k result rows."""
    conn = tx.connection()
    dialect = conn.dialect
    if ids is not None:
        rows: list[tuple[str, int, int | None]] = []
        wanted = list(ids)
        for start in range(0, len(wanted), _IDS_PER_STATEMENT):
            query = (select(Job.id, Job.version, JobStatus.version)
                     .outerjoin(JobStatus, JobStatus.job_id == Job.id)
                     .where(_shard(cluster),
                            Job.id.in_(wanted[start:start + _IDS_PER_STATEMENT])))
            rows.extend((row[0], row[1], row[2]) for row in conn.execute(query))
        return rows
    sql = _VERSIONS_SQL.get((dialect.name, cluster))
    if sql is None:
        query = (select(Job.id, Job.version, JobStatus.version)
                 .outerjoin(JobStatus, JobStatus.job_id == Job.id).where(_shard(cluster)))
        sql = _VERSIONS_SQL[(dialect.name, cluster)] = str(query.compile(
            dialect=dialect, compile_kwargs={"literal_binds": True}))
    cursor = conn.connection.cursor()
    try:
        cursor.execute(sql)
        rows = cursor.fetchall()  # type: ignore[assignment]  # (DBAPI rows: tuples)
    finally:
        cursor.close()
    return rows


_IDS_PER_STATEMENT = 5000  # ids bound in one IN list (SQLite allows 32766 variables)

@dataclass(frozen=True, slots=True)
class ChangeMark:
    """The change feed's mark (migration 0007): what a reader had seen when it took it.

    ``at``: every transaction that began after the mark has a stamp ``>= at`` (SQLite:
    the next counter value; PostgreSQL: the snapshot's ``xmax``). ``running``: the stamps
    of the transactions still running when it was taken (PostgreSQL: the snapshot's
    in-progress list; SQLite has one writer at a time: none). Every other stamp below
    ``at`` belongs to a transaction that had ended, whose rows the read after the mark
    saw. A long writing transaction anywhere on the server (transaction ids are the
    server's) is one stamp in ``running``: the rows committed around it are not read
    again tick after tick, and its own are read once it commits."""

    at: int
    running: tuple[int, ...] = ()

    def went_back(self, last: ChangeMark) -> bool:
        """The stamps went back since ``last`` (a database restored, another server):
        what the feed says since ``last`` cannot be trusted to be complete."""
        return self.at < last.at


_MARK_SQL = {
    "sqlite": "SELECT n + 1, '' FROM change_seq WHERE id = 1",
    "postgresql": "SELECT pg_snapshot_xmax(s)::text::bigint, "
                  "coalesce((SELECT string_agg(x::text, ',') FROM pg_snapshot_xip(s) x), '') "
                  "FROM pg_current_snapshot() s",
}


def change_mark(tx: Session) -> ChangeMark:
    """The change feed's mark now (migration 0007): every row written after this call,
    and every row of a transaction still running now, is read by ``changed_ids(since=
    mark)``. Take it before a read, and read ``changed_ids(since=mark)`` next time."""
    conn = tx.connection()
    row = conn.execute(text(_MARK_SQL[conn.dialect.name])).one()
    at = int(row[0] or 0)
    running = tuple(sorted(int(x) for x in str(row[1] or "").split(",") if x))
    return ChangeMark(at, running)


def changed_ids(tx: Session, *, since: ChangeMark) -> set[str]:
    """The ids of the jobs whose row or status row was written, or that were deleted,
    by a transaction not yet ended when ``since`` was taken (``change_mark``): index
    scans of each table (``changed >= at``, and one lookup per stamp still running
    then), whatever the number of jobs."""
    def written(column: Any) -> Any:
        if not since.running:
            return column >= since.at
        return or_(column >= since.at, column.in_(since.running))

    query = union(select(Job.id).where(written(Job.changed)),
                  select(JobStatus.job_id).where(written(JobStatus.changed)),
                  select(Tombstone.job_id).where(written(Tombstone.changed)))
    return set(tx.connection().execute(query).scalars())


def changed_after_status(tx: Session) -> set[str]:
    """Ids of the tracked jobs that a client wrote (``jobs.updated_at``: desired, spec)
    after their status was last written: where a new leader most likely has something to
    do (the tick plans them first; it plans every job anyway)."""
    query = (select(Job.id).join(JobStatus, JobStatus.job_id == Job.id)
             .where(JobStatus.phase.not_in(TERMINAL), Job.updated_at > JobStatus.updated_at))
    return set(tx.scalars(query))


# triggers of migrations 0002 and 0007, by dialect: without them versions never move
# and the change feed misses rows
_VERSION_TRIGGERS = {
    "sqlite": ("jobs_version_insert", "jobs_version_update", "job_status_version_insert",
               "job_status_version_update", "jobs_changed_update",
               "job_status_changed_update", "tombstones_changed_insert",
               "tombstones_changed_update", "job_status_deleted"),
    "postgresql": ("jobs_version", "job_status_version", "tombstones_changed",
                   "job_status_deleted"),
}


def row_versions_maintained(tx: Session) -> bool:
    """Whether the version and change-stamp triggers of migrations 0002 and 0007 are in
    place (and enabled)."""
    dialect = tx.get_bind().dialect.name
    names = _VERSION_TRIGGERS.get(dialect)
    if names is None:
        return False
    if dialect == "sqlite":
        query = text("SELECT count(*) FROM sqlite_master WHERE type = 'trigger' "
                     "AND name IN :names").bindparams(bindparam("names", expanding=True))
    else:
        query = text("SELECT count(*) FROM pg_trigger WHERE tgname IN :names "
                     "AND tgenabled <> 'D' AND NOT tgisinternal "
                     "AND tgrelid IN (to_regclass('jobs'), to_regclass('job_status'), "
                     "to_regclass('tombstones'))"
                     ).bindparams(bindparam("names", expanding=True))
    found = tx.execute(query, {"names": list(names)}).scalar()
    return int(found or 0) == len(names)


def load_tracked(tx: Session, cluster: str, *, cache: SpecCache | None = None,
                 ids: Collection[str] | None = None) -> list[LoadedJob]:
    """Every job the controller still has to reconcile (no status yet, or not terminal);
    with ``ids``, only those of them (``fetch_tracked``, then ``build_tracked``).

    ``cache`` (owned by the caller, kept across ticks) skips re-validating rows whose
    version did not move.
    """
    return build_tracked(fetch_tracked(tx, ids=ids), cluster, cache=cache)


@dataclass(frozen=True, slots=True)
class Fetched:
    """The rows of ``fetch_tracked``, not built yet: the transaction that read them may end
    before they are validated (a PostgreSQL session idle inside a transaction while the
    rows are built would meet ``idle_in_transaction_session_timeout`` on a loaded host)."""

    rows: list[Any]
    abandoned: dict[str, set[int]]


# the rows ``fetch_tracked`` reads: the columns of ``_FetchedRow``, in its order
_TRACKED_ROWS = (select(Job.id, Job.spec, Job.policy, Job.desired, Job.generation, Job.version,
                        JobStatus.job_id.label("has_status"), JobStatus.version.label("sv"),
                        *(JobStatus.__table__.c[name] for name in SAVED_COLUMNS))
                 .outerjoin(JobStatus, JobStatus.job_id == Job.id).where(_tracked()))
assert tuple(_TRACKED_ROWS.selected_columns.keys()) == _FetchedRow._fields


def fetch_tracked(tx: Session, *, ids: Collection[str] | None = None) -> Fetched:
    """The tracked jobs' rows (``load_tracked``) and their abandoned submissions: every
    statement at once, nothing built."""
    query = _TRACKED_ROWS
    found = tx.execute(query) if ids is None else _by_ids(tx, query, Job.id, list(ids))
    rows = [_FetchedRow._make(row) for row in found]
    with_status = [row.id for row in rows if row.has_status is not None]
    return Fetched(rows, _abandoned_of(tx, with_status, whole=ids is None))


def build_tracked(fetched: Fetched, cluster: str, *,
                  cache: SpecCache | None = None) -> list[LoadedJob]:
    """The ``LoadedJob`` of each fetched row (validated; ``cache`` as ``load_tracked``'s),
    outside any transaction."""
    rows = fetched.rows
    out: list[LoadedJob] = []
    end = _SAVED_FIRST + len(SAVED_COLUMNS)
    for row in rows:
        job_id = row.id
        checked = _validated(cache, row)
        if isinstance(checked, DispatchError):
            # rejected, but its status (the ref of a live Slurm job) is kept: the planner
            # stops that job as desired says, and the ref stays recorded (never orphaned)
            try:
                said = Desired(row.desired)
            except ValueError:
                said = Desired.STOPPED
            if row.has_status is None:
                bad = JobState(job_id=job_id, generation=row.generation or 0, desired=said,
                               spec=None, phase=Phase.REJECTED)
            else:
                bad = replace(_status_state(row, job_id, cluster, desired=said, spec=None,
                                            policy=DEFAULT_POLICY),
                              generation=row.generation or 0, phase=Phase.REJECTED)
            out.append(LoadedJob(bad, reject_reason=storable_text(str(checked)),
                                 has_status=row.has_status is not None,
                                 previous=None if row.has_status is None
                                 else tuple(row[_SAVED_FIRST:end]),
                                 version=row.version, status_version=row.sv))
            continue
        spec, policy, desired = checked
        if row.has_status is None:
            out.append(LoadedJob(JobState(job_id=job_id, generation=row.generation,
                                          desired=desired, spec=spec, policy=policy),
                                 has_status=False, version=row.version))
            continue
        out.append(LoadedJob(_status_state(row, job_id, cluster, desired=desired, spec=spec,
                                                policy=policy),
                             previous=tuple(row[_SAVED_FIRST:end]), version=row.version,
                             status_version=row.sv))
    found = fetched.abandoned
    if not found:
        return out
    return [replace(job, state=replace(job.state, abandoned=frozenset(found[job.state.job_id])))
            if job.state.job_id in found else job for job in out]


def _abandoned_of(tx: Session, with_status: list[str], *, whole: bool) -> dict[str, set[int]]:
    """``JobState.abandoned`` of each job: the submission numbers whose intent was abandoned
    (a late Slurm job of one is a duplicate, never adopted). Rare rows: one query over them
    all on a whole load, one per ``_IN_CHUNK`` ids otherwise."""
    found: dict[str, set[int]] = {}
    if not with_status:
        return found
    query = select(Submission.job_id, Submission.submission).where(
        Submission.status == "abandoned")
    if whole:
        parts: Iterable[Any] = tx.execute(query)
    else:
        parts = _by_ids(tx, query, Submission.job_id, with_status)
    wanted = set(with_status)
    for job_id, number in parts:
        if job_id in wanted:
            found.setdefault(job_id, set()).add(int(number))
    return found


def _status_state(row: Any, job_id: str, cluster: str, *, desired: Desired,
                  spec: JobSpec | None, policy: RecoveryPolicy) -> JobState:
    """The ``JobState`` of a ``load_tracked`` row that has a status row."""
    current = None
    if row.current_submission is not None:
        current = Current(row.current_submission, row.attempt, row.current_since or 0,
                          _current_ref(row, job_id, cluster))
    return JobState(
        job_id=job_id, generation=row.generation, desired=desired, spec=spec,
        policy=policy, phase=Phase(row.phase), submission=row.submission,
        attempt=row.attempt, current=current,
        object_state=State(row.object_state) if row.object_state else None,
        cause=_cause(row.cause, row.cause_detail),
        exit_code=row.exit_code, reason=_shared(row.reason),
        nodes=tuple(sys.intern(n) for n in row.nodes.split(",") if n),
        budgets_used=_int_map(row.budgets_used),
        excluded_nodes=_int_map(row.excluded_nodes), not_before=row.not_before,
        unknown_since=row.unknown_since, hold_instance=row.hold_instance,
        started_at=row.started_at, ended_at=row.ended_at,
        observed_generation=row.observed_generation,
        conditions=_decode_conditions(row.conditions),
        outputs_verified=bool(row.outputs_verified), cluster=_shared(row.cluster),
    )


def _current_ref(row: Any, job_id: str, cluster: str) -> ObjectRef | None:
    """The ref of the status row's current object (None: an intent not adopted yet)."""
    if row.slurm_job_id is None or row.slurm_submit is None:
        return None
    return ObjectRef(row.cluster or cluster, "dj-" + job_id, row.slurm_job_id,
                     row.slurm_submit, sluid=row.sluid)


def current_refs(tx: Session, cluster: str,
                 ids: Collection[str]) -> dict[str, ObjectRef | None]:
    """The current object's ref of each tracked job of ``ids``, exactly as
    ``load_tracked`` would put it in ``JobState.current`` (None: no current object, or an
    intent): what the tick needs before one accounting read, without loading the jobs."""
    query = (select(Job.id, JobStatus.current_submission, JobStatus.slurm_job_id,
                    JobStatus.slurm_submit, JobStatus.cluster, JobStatus.sluid)
             .outerjoin(JobStatus, JobStatus.job_id == Job.id).where(_tracked()))
    out: dict[str, ObjectRef | None] = {}
    for row in _by_ids(tx, query, Job.id, list(ids)):
        out[row.id] = (None if row.current_submission is None
                       else _current_ref(row, row.id, cluster))
    return out


_CAUSES: dict[str | None, Cause] = {}  # the detail-less causes, shared


def _cause(kind: str | None, detail: str) -> Cause:
    if not detail:
        cause = _CAUSES.get(kind)
        if cause is None:
            cause = _CAUSES[kind] = Cause(CauseKind(kind) if kind else CauseKind.NONE,
                                          Provenance.UNKNOWN, detail)
        return cause
    return Cause(CauseKind(kind) if kind else CauseKind.NONE, Provenance.UNKNOWN, detail)


def status_row_values(state: JobState, *, reject_reason: str = "") -> dict[str, Any]:
    cur = state.current
    ref = cur.ref if cur else None
    return {
        "phase": state.phase.value,
        "observed_generation": state.observed_generation,
        "submission": state.submission,
        "attempt": state.attempt,
        "current_submission": cur.submission if cur else None,
        "current_since": cur.created_at if cur else None,
        "slurm_job_id": ref.id if ref else None,
        "slurm_submit": ref.submit if ref else None,
        # where the job is placed (``placement``); unplaced: its current object's cluster
        "cluster": state.cluster if state.cluster is not None else (ref.cluster if ref
                                                                   else None),
        "object_state": state.object_state.value if state.object_state else None,
        "cause": state.cause.kind.value if state.phase != Phase.REJECTED else "invalid",
        "cause_detail": reject_reason if state.phase == Phase.REJECTED else state.cause.detail,
        "exit_code": state.exit_code,
        "reason": state.reason,
        "budgets_used": _encode_int_map(state.budgets_used),
        "excluded_nodes": _encode_int_map(state.excluded_nodes),
        "conditions": encode_conditions(state.conditions),
        "not_before": state.not_before,
        "unknown_since": state.unknown_since,
        "hold_instance": state.hold_instance,
        "nodes": ",".join(state.nodes),
        "started_at": state.started_at,
        "ended_at": state.ended_at,
        "outputs_verified": state.outputs_verified,
        "sluid": ref.sluid if ref else None,
    }


# the status row as loaded: its values in ``SAVED_COLUMNS`` order (``LoadedJob.previous``)
Previous = Sequence[Any]


def _unchanged(values: dict[str, Any], previous: Previous | None) -> bool:
    """Whether ``values`` are the row as loaded (``LoadedJob.previous``)."""
    if previous is None:
        return False
    return tuple(values.values()) == tuple(previous)


def save_status(tx: Session, state: JobState, *, exists: bool, now: int,
                reject_reason: str = "", previous: Previous | None = None) -> bool:
    """Write the status row if anything changed; returns whether it wrote."""
    values = status_row_values(state, reject_reason=reject_reason)
    if _unchanged(values, previous):
        return False
    values["updated_at"] = now
    if exists:
        tx.execute(update(JobStatus).where(JobStatus.job_id == state.job_id).values(**values))
    else:
        tx.add(JobStatus(job_id=state.job_id, **values))
    return True


@dataclass(frozen=True, slots=True)
class StatusWrite:
    """One status ``save_statuses`` may write (the arguments of ``save_status``)."""

    state: JobState
    exists: bool
    reject_reason: str = ""
    previous: Previous | None = None


_STATUS_TABLE: Any = JobStatus.__table__
_EVENT_TABLE: Any = Event.__table__
_STATUS_UPDATE = update(_STATUS_TABLE).where(_STATUS_TABLE.c.job_id == bindparam("key"))
# a shard writes only the status rows placed on its cluster, or not placed yet
_SHARD_STATUS_UPDATE = _STATUS_UPDATE.where(
    (_STATUS_TABLE.c.cluster == bindparam("shard")) | _STATUS_TABLE.c.cluster.is_(None))


def status_would_change(write: StatusWrite) -> bool:
    """Whether ``save_statuses`` would write this status row (a standby's dry plan asks:
    ``controller.reconcile.standby``)."""
    return not _unchanged(status_row_values(write.state, reject_reason=write.reject_reason),
                          write.previous)


def save_statuses(tx: Session, writes: Iterable[StatusWrite], *, now: int,
                  cluster: str | None = None) -> set[str]:
    """``save_status`` for many jobs, as one executemany UPDATE and one INSERT; returns
    the ids of the jobs whose status row was written. With ``cluster`` (a shard's), a
    row placed on another cluster meanwhile is not overwritten: ``ErrConflict``, and the
    caller's transaction rolls back (a new row another shard inserted first: the same)."""
    updates: list[dict[str, Any]] = []
    inserts: list[dict[str, Any]] = []
    written: set[str] = set()
    for w in writes:
        values = status_row_values(w.state, reject_reason=w.reject_reason)
        if _unchanged(values, w.previous):  # (``status_would_change``)
            continue
        values["updated_at"] = now
        if w.exists:
            values["key"] = w.state.job_id
            updates.append(values)
        else:
            values["job_id"] = w.state.job_id
            inserts.append(values)
        written.add(w.state.job_id)
    conn = tx.connection()
    if updates and cluster is not None:
        for values in updates:
            values["shard"] = cluster
        changed = conn.execute(_SHARD_STATUS_UPDATE, updates).rowcount
        if changed is not None and 0 <= changed != len(updates):
            raise ErrConflict(f"job_status: {len(updates) - changed} of {len(updates)} rows "
                              "were placed on another cluster meanwhile")
    elif updates:
        conn.execute(_STATUS_UPDATE, updates)
    if inserts:
        conn.execute(insert(_STATUS_TABLE), inserts)
    return written


_SUB_TABLE: Any = Submission.__table__
# the submission columns a SubmissionUpdate may change (``_record_submission``)
_SUB_MUTABLE = ("status", "cluster", "slurm_job_id", "slurm_submit", "sluid", "state", "cause",
                "cause_detail", "exit_code", "nodes", "restart_count", "started_at",
                "ended_at", "attempt")
_SUB_UPDATE = update(_SUB_TABLE).where(_SUB_TABLE.c.id == bindparam("key"))


def save_submissions(tx: Session, updates: Sequence[tuple[SubmissionUpdate, int]], *,
                     now: int, epoch: int | None = None) -> None:
    """Insert intents, or record what was observed of submission rows, for many
    (update, attempt) pairs, in order: the rows they touch
    are read with one query per ``_IN_CHUNK`` jobs, the updates applied to them in order,
    and the rows that changed written with one executemany UPDATE (by primary key), the
    new ones (intents, with ``epoch``) with one executemany INSERT."""
    if not updates:
        return
    tx.flush()  # the caller's pending ORM rows first (a job added in this transaction)
    conn = tx.connection()
    job_ids = sorted({upd.job_id for upd, _ in updates})
    rows: dict[tuple[str, int], dict[str, Any]] = {}
    loaded: dict[tuple[str, int], dict[str, Any]] = {}
    for found in _by_ids(tx, select(_SUB_TABLE), _SUB_TABLE.c.job_id, job_ids):
        key = (found.job_id, found.submission)
        if key not in rows:
            loaded[key] = dict(found._mapping)
            rows[key] = dict(loaded[key])
    new: list[dict[str, Any]] = []
    for upd, attempt in updates:
        key = (upd.job_id, upd.submission)
        row = rows.get(key)
        if row is None:
            rows[key] = row = _new_submission(upd, attempt=attempt, now=now, epoch=epoch)
            new.append(row)
        else:
            _record_submission(row, upd)
    changed = [{"key": row["id"], **{c: row[c] for c in _SUB_MUTABLE}}
               for key, row in rows.items()
               if key in loaded and any(row[c] != loaded[key][c] for c in _SUB_MUTABLE)]
    if changed:
        conn.execute(_SUB_UPDATE, changed)
    if new:
        conn.execute(insert(_SUB_TABLE), new)


def _new_submission(upd: SubmissionUpdate, *, attempt: int, now: int,
                    epoch: int | None) -> dict[str, Any]:
    row: dict[str, Any] = {
        "job_id": upd.job_id, "submission": upd.submission, "attempt": attempt,
        "status": upd.status, "cluster": upd.cluster, "slurm_job_id": None, "slurm_submit": None,
        "state": None, "cause": None, "cause_detail": "", "exit_code": None, "nodes": "",
        "restart_count": 0, "created_at": now, "started_at": None, "ended_at": None,
        "epoch": epoch, "sluid": None}
    _record_observation(row, upd)
    return row


def _record_submission(row: dict[str, Any], upd: SubmissionUpdate) -> None:
    if row["status"] in ("abandoned", "duplicate", "ended") and upd.status in ("submitted",):
        pass  # never step a row back
    else:
        row["status"] = upd.status
    _record_observation(row, upd)


def _record_observation(row: dict[str, Any], upd: SubmissionUpdate) -> None:
    obs = upd.obs
    if obs is not None:
        row["cluster"] = obs.ref.cluster
        row["slurm_job_id"] = obs.ref.id
        row["slurm_submit"] = row["slurm_submit"] or obs.ref.submit
        row["sluid"] = row["sluid"] or obs.ref.sluid  # live (26.05) or accounting (24.11)
        row["state"] = obs.state.value
        row["cause"] = obs.cause.kind.value
        row["cause_detail"] = obs.cause.detail
        row["exit_code"] = obs.exit_code
        row["nodes"] = ",".join(obs.nodes) or row["nodes"]
        if obs.restart_count is not None:
            row["restart_count"] = obs.restart_count
        row["started_at"] = obs.start or row["started_at"]
        row["ended_at"] = obs.end or row["ended_at"]
        if obs.attempt is not None:
            row["attempt"] = obs.attempt


# a Start's ref to record: (job id, submission number, the ref Start returned)
Recorded = tuple[str, int, ObjectRef]

_IN_FLIGHT = (_SUB_TABLE.c.status == literal_column("'intent'")) | (
    _SUB_TABLE.c.status == literal_column("'submitted'"))
_NOT_TERMINAL = _STATUS_TABLE.c.phase.not_in([literal_column(f"'{p}'") for p in TERMINAL])
# The compare-and-set of ``record_submitted_many``, one parameter set per ref (executemany).
_RECORD_SUBMISSION = update(_SUB_TABLE).where(
    _SUB_TABLE.c.job_id == bindparam("w_job"), _SUB_TABLE.c.submission == bindparam("w_n"),
    _IN_FLIGHT,
    _SUB_TABLE.c.slurm_job_id.is_(None) | (_SUB_TABLE.c.slurm_job_id == bindparam("w_id")),
).values(status=literal_column("'submitted'"), cluster=bindparam("v_cluster"),
         slurm_job_id=bindparam("v_id"), slurm_submit=bindparam("v_submit"),
         sluid=bindparam("v_sluid"))
_RECORD_STATUS = update(_STATUS_TABLE).where(
    _STATUS_TABLE.c.job_id == bindparam("w_job"),
    _STATUS_TABLE.c.current_submission == bindparam("w_n"), _NOT_TERMINAL,
    _STATUS_TABLE.c.slurm_job_id.is_(None) | (_STATUS_TABLE.c.slurm_job_id == bindparam("w_id")),
).values(slurm_job_id=bindparam("v_id"), slurm_submit=bindparam("v_submit"),
         cluster=bindparam("v_cluster"), sluid=bindparam("v_sluid"))
_MARK_DUPLICATE = update(_SUB_TABLE).where(
    _SUB_TABLE.c.job_id == bindparam("key_job"),
    _SUB_TABLE.c.submission == bindparam("key_n")).values(status=literal_column("'duplicate'"))
_SUBMISSIONS_OF = select(_SUB_TABLE.c.job_id, _SUB_TABLE.c.submission, _SUB_TABLE.c.status,
                         _SUB_TABLE.c.slurm_job_id)
_STATUSES_OF = select(_STATUS_TABLE.c.job_id, _STATUS_TABLE.c.current_submission,
                      _STATUS_TABLE.c.phase, _STATUS_TABLE.c.slurm_job_id)


def record_submitted(tx: Session, job_id: str, submission: int, ref: ObjectRef) -> bool:
    """Start returned a ref: record it on the submission row and the status, only while
    that submission is still the job's current intent (not abandoned, not replaced, no
    other ref recorded). Returns False when either row did not match: the caller must
    then treat the new object as a duplicate (cancel it, never release it) and roll back.
    The caller fences the transaction (``Lease.check``) for the epoch."""
    return record_submitted_many(tx, [(job_id, submission, ref)])[0]


def record_submitted_many(tx: Session, refs: Sequence[Recorded]) -> list[bool]:
    """``record_submitted`` for many refs, in order, with two executemany compare-and-set
    UPDATEs (submission rows, then the status rows of the refs whose submission row
    matched) instead of two statements per ref; one bool per ref.

    Each parameter set keeps the single-ref WHERE clause, so each ref changes at most its
    own row, and only while it is still current. Which refs matched is read back per row
    (an executemany reports only the total): a ref matched exactly when its row now holds
    it -- a row the UPDATE did not match holds another ref or another status, and a row
    it matched holds this one, locked until the commit. The total row count of each
    executemany must agree with those per-row answers; if it does not, ``ErrConflict``
    (the caller's transaction rolls back; nothing is recorded, nothing released)."""
    if not refs:
        return []
    tx.flush()  # the caller's pending ORM rows first, as a Session statement would
    conn = tx.connection()
    params = [{"w_job": job_id, "w_n": n, "w_id": ref.id, "v_cluster": ref.cluster,
               "v_id": ref.id, "v_submit": ref.submit, "v_sluid": ref.sluid}
              for job_id, n, ref in refs]
    job_ids = sorted({job_id for job_id, _, _ in refs})
    changed = conn.execute(_RECORD_SUBMISSION, params).rowcount
    rows = {(r.job_id, r.submission): r for r in _by_ids(tx, _SUBMISSIONS_OF,
                                                         _SUB_TABLE.c.job_id, job_ids)}
    sub_ok = [(row := rows.get((job_id, n))) is not None and row.status == "submitted"
              and row.slurm_job_id == ref.id for job_id, n, ref in refs]
    _check_count(changed, sum(sub_ok), "submissions")
    matched = [p for p, ok in zip(params, sub_ok, strict=True) if ok]
    if not matched:
        return sub_ok
    changed = conn.execute(_RECORD_STATUS, matched).rowcount
    statuses = {r.job_id: r for r in _by_ids(tx, _STATUSES_OF, _STATUS_TABLE.c.job_id,
                                             sorted({job_id for (job_id, _, _), ok
                                                     in zip(refs, sub_ok, strict=True) if ok}))}
    out = [ok and (st := statuses.get(job_id)) is not None and st.current_submission == n
           and st.phase not in TERMINAL and st.slurm_job_id == ref.id
           for (job_id, n, ref), ok in zip(refs, sub_ok, strict=True)]
    _check_count(changed, sum(out), "job_status")
    # a submission row that took its ref while its status did not: that object is a
    # duplicate (the caller cancels it, never releases it), and its row says so
    halves = [{"key_job": job_id, "key_n": n} for (job_id, n, _), ok, done
              in zip(refs, sub_ok, out, strict=True) if ok and not done]
    if halves:
        conn.execute(_MARK_DUPLICATE, halves)
    return out


def _check_count(changed: int | None, found: int, table: str) -> None:
    if changed is not None and changed >= 0 and changed != found:
        raise ErrConflict(f"{table}: {changed} rows recorded, {found} hold their ref")


def insert_events(tx: Session, events: Sequence[PlannedEvent], *, now: int) -> None:
    """Append many events at once (one executemany INSERT), in order."""
    if events:
        tx.connection().execute(insert(_EVENT_TABLE), [
            {"job_id": e.job_id, "at": now, "kind": e.kind, "message": e.message,
             "data": "{}"} for e in events])


def add_event(tx: Session, job_id: str, kind: str, message: str, *, now: int) -> None:
    tx.add(Event(job_id=job_id, at=now, kind=kind, message=message, data="{}"))


def observation_summary(obs: ObjectObs) -> str:
    return f"{obs.ref.id}:{obs.state.value}/{obs.cause.kind.value}"


def delete_job(tx: Session, job_id: str) -> None:
    tx.execute(delete(Job).where(Job.id == job_id))


# ---------------------------------------------------------------- ownership (SPEC §6.2)


def ownership(tx: Session, job_ids: Sequence[str]) -> tuple[set[str], set[str]]:
    """Of ``job_ids`` (the ids of ``dj-`` Slurm jobs no tracked job of the tick owned):
    those tracked now (a row with no status or one not terminal: written again since the
    tick read the versions), and those this database knows at all (any row, or a
    tombstone of a deleted one). An id in neither was never this database's."""
    ids = sorted(set(job_ids))
    if not ids:
        return set(), set()
    rows = _by_ids(tx, select(Job.id, JobStatus.phase).outerjoin(
        JobStatus, JobStatus.job_id == Job.id), Job.id, ids)
    tracked = {row[0] for row in rows if row[1] is None or row[1] not in TERMINAL}
    known = {row[0] for row in rows}
    known.update(row[0] for row in _by_ids(tx, select(Tombstone.job_id),
                                           Tombstone.job_id, ids))
    return tracked, known


def locked_versions(tx: Session, job_ids: Sequence[str]) -> dict[str, int]:
    """``jobs.version`` of each of ``job_ids`` that still has a row, those rows locked
    until the transaction ends (PostgreSQL: FOR UPDATE; on SQLite the fence's first
    statement took the database's write lock already): a plan made from a row is
    committed only while the row is the one it was made from."""
    query = select(Job.id, Job.version)
    if tx.get_bind().dialect.name == "postgresql":
        query = query.with_for_update()
    return {row[0]: int(row[1]) for row in _by_ids(tx, query, Job.id, sorted(set(job_ids)))}


def tombstoned(tx: Session, job_ids: Sequence[str]) -> set[str]:
    """The ids among ``job_ids`` whose row was deleted once (a tombstone)."""
    ids = sorted(set(job_ids))
    return {row[0] for row in _by_ids(tx, select(Tombstone.job_id), Tombstone.job_id, ids)}


# the database's own clock in milliseconds, as the tombstone trigger reads it (migration
# 0006): a tombstone's age is measured on the clock that stamped it, never the daemon's
_DB_NOW_MS = {
    "sqlite": "CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)",
    "postgresql": "(extract(epoch from clock_timestamp()) * 1000)::bigint",
}


def prune_tombstones(tx: Session, *, ttl_s: int) -> int:
    """Drop the tombstones older than ``ttl_s`` by the database's clock; how many."""
    now = _DB_NOW_MS[tx.get_bind().dialect.name]
    result = tx.execute(delete(Tombstone).where(
        Tombstone.deleted_at_ms < text(f"{now} - :ttl_ms").bindparams(ttl_ms=ttl_s * 1000)))
    return int(result.rowcount or 0)  # type: ignore[attr-defined]


def list_tombstones(tx: Session) -> list[Tombstone]:
    return list(tx.scalars(select(Tombstone).order_by(Tombstone.deleted_at_ms)))


@dataclass(frozen=True, slots=True)
class Unowned:
    """A ``dj-`` Slurm job whose id this database never had (a neighbour's)."""

    cluster: str
    slurm_job_id: int
    name: str
    state: str
    submit: int | None
    seen_at: int

    def to_json(self) -> dict[str, Any]:
        return {"cluster": self.cluster, "slurm_job_id": self.slurm_job_id,
                "name": self.name, "state": self.state, "submit": self.submit,
                "seen_at": self.seen_at}


def save_unowned(tx: Session, cluster: str, found: Sequence[ObjectObs], *, now: int,
                 limit: int = 1000) -> None:
    """Replace what the last complete read of ``cluster`` found of unowned jobs (at most
    ``limit`` rows kept; the gauge counts them all)."""
    tx.execute(delete(UnownedObject).where(UnownedObject.cluster == cluster))
    rows = {}
    for obs in found[:limit]:
        rows[obs.ref.id] = {"cluster": cluster, "slurm_job_id": obs.ref.id,
                            "name": obs.ref.uid, "state": obs.state.value,
                            "submit": obs.submit if obs.submit is not None else obs.ref.submit,
                            "seen_at": now}
    if rows:
        tx.execute(insert(UnownedObject), list(rows.values()))


def list_unowned(tx: Session, cluster: str | None = None) -> list[Unowned]:
    query = select(UnownedObject).order_by(UnownedObject.cluster, UnownedObject.slurm_job_id)
    if cluster is not None:
        query = query.where(UnownedObject.cluster == cluster)
    return [Unowned(r.cluster, r.slurm_job_id, r.name, r.state, r.submit, r.seen_at)
            for r in tx.scalars(query)]


# ---------------------------------------------------------------- claims (0006)


def deployment_id(tx: Session, *, new: str, now: int) -> str:
    """This database's deployment id; ``new`` becomes it when there is none yet."""
    found = tx.scalar(select(Deployment.id))
    if found is not None:
        return str(found)
    tx.execute(insert(Deployment).values(id=new, created_at=now))
    return new


def read_deployment_id(tx: Session) -> str | None:
    found = tx.scalar(select(Deployment.id))
    return None if found is None else str(found)


@dataclass(frozen=True, slots=True)
class ClaimRow:
    cluster: str
    token: str
    previous: str | None
    claimed_at: int
    conflict: str


def read_claim(tx: Session, cluster: str) -> ClaimRow | None:
    row = tx.get(Claim, cluster)
    return None if row is None else ClaimRow(row.cluster, row.token, row.previous,
                                             row.claimed_at, row.conflict)


def list_claims(tx: Session) -> list[ClaimRow]:
    return [ClaimRow(r.cluster, r.token, r.previous, r.claimed_at, r.conflict)
            for r in tx.scalars(select(Claim).order_by(Claim.cluster))]


def save_claim(tx: Session, cluster: str, *, token: str, previous: str | None, now: int,
               conflict: str = "") -> None:
    """Record the token written (or about to be written) to ``cluster``'s marker."""
    row = tx.get(Claim, cluster)
    if row is None:
        tx.add(Claim(cluster=cluster, token=token, previous=previous, claimed_at=now,
                     conflict=conflict))
    else:
        row.token, row.previous, row.claimed_at, row.conflict = token, previous, now, conflict


def note_conflict(tx: Session, cluster: str, conflict: str) -> None:
    tx.execute(update(Claim).where(Claim.cluster == cluster).values(conflict=conflict))
