"""Repository functions over the job tables. Each takes a Session; none commits.

Loading turns rows into the planner's ``JobState`` (validating rows that other
services wrote straight into ``jobs``); saving writes only what a plan changed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from controller.errors import DispatchError, ErrInvalid, ErrNotFound
from controller.model.ids import parse_job_id
from controller.model.obs import Cause, CauseKind, ObjectObs, ObjectRef, Provenance, State
from controller.model.spec import JobSpec, parse_job_document
from controller.reconcile.plan import (
    TERMINAL_PHASES,
    Condition,
    Current,
    Desired,
    JobState,
    Phase,
    PlannedEvent,
    SubmissionUpdate,
)
from controller.reconcile.policy import parse_policy
from controller.store.models import Event, Job, JobStatus, Submission

TERMINAL = tuple(p.value for p in TERMINAL_PHASES)


# ---------------------------------------------------------------- client side


def insert_job(tx: Session, *, job_id: str, document: Mapping[str, Any], desired: str = "run",
               policy: Mapping[str, Any] | None = None, now: int) -> None:
    """Write a new desired job record (validated first, so clients get errors at once)."""
    parse_job_id(job_id)
    parse_job_document(document)
    Desired(desired)
    if policy is not None:
        parse_policy(policy)
    labels = document.get("labels", {})
    tx.add(Job(id=job_id, spec=json.dumps(document, sort_keys=True),
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

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id, "phase": self.phase, "desired": self.desired,
            "generation": self.generation, "labels": self.labels, "attempt": self.attempt,
            "submission": self.submission, "slurm_job_id": self.slurm_job_id,
            "cause": self.cause, "cause_detail": self.cause_detail, "exit_code": self.exit_code,
            "object_state": self.object_state, "reason": self.reason, "nodes": self.nodes,
            "conditions": self.conditions, "created_at": self.created_at,
            "updated_at": self.updated_at,
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


def list_submissions(tx: Session, job_id: str) -> list[Submission]:
    return list(tx.scalars(select(Submission).where(Submission.job_id == job_id)
                           .order_by(Submission.submission)))


def list_events(tx: Session, job_id: str, *, limit: int = 200) -> list[Event]:
    rows = tx.scalars(select(Event).where(Event.job_id == job_id).order_by(Event.id.desc())
                      .limit(limit))
    return list(reversed(list(rows)))


def phase_counts(tx: Session) -> dict[str, int]:
    rows = tx.execute(select(JobStatus.phase, func.count()).select_from(Job)
                      .outerjoin(JobStatus, JobStatus.job_id == Job.id)
                      .group_by(JobStatus.phase)).all()
    counts: dict[str, int] = {}
    for phase, count in rows:
        key = str(phase) if phase is not None else Phase.PENDING.value
        counts[key] = counts.get(key, 0) + int(count)
    return counts


# ---------------------------------------------------------------- controller side


@dataclass(frozen=True, slots=True)
class LoadedJob:
    state: JobState
    reject_reason: str = ""
    has_status: bool = True
    previous: dict[str, Any] | None = None  # the status row as loaded, for no-op detection


def _decode_conditions(text: str) -> tuple[Condition, ...]:
    try:
        raw = json.loads(text or "[]")
        return tuple(Condition(c["type"], bool(c["status"]), c["reason"], c["message"],
                               int(c["since"]), int(c["observed_generation"])) for c in raw)
    except (json.JSONDecodeError, KeyError, TypeError, ValueError):
        return ()


def encode_conditions(conditions: Iterable[Condition]) -> str:
    return json.dumps([{"type": c.type, "status": c.status, "reason": c.reason,
                        "message": c.message, "since": c.since,
                        "observed_generation": c.observed_generation} for c in conditions])


SpecCache = dict[str, tuple[tuple[str, str | None, str], Any]]


def _validate_row(job_id: str, spec_text: str, policy_text: str | None,
                  desired_text: str) -> tuple[JobSpec, Any, Desired]:
    parse_job_id(job_id, field="id")
    try:
        doc = json.loads(spec_text)
    except (json.JSONDecodeError, TypeError) as exc:
        raise ErrInvalid(f"not JSON: {exc}", field="spec") from None
    spec = parse_job_document(doc)
    policy = parse_policy(policy_text)
    try:
        desired = Desired(desired_text)
    except ValueError:
        raise ErrInvalid("must be run, held or stopped", field="desired") from None
    return spec, policy, desired


def _validated(cache: SpecCache | None, job_id: str, spec_text: str, policy_text: str | None,
               desired_text: str) -> tuple[JobSpec, Any, Desired] | DispatchError:
    """Validate a row, reusing the result for an unchanged row (the tick's hot path)."""
    key = (spec_text, policy_text, desired_text)
    if cache is not None:
        hit = cache.get(job_id)
        if hit is not None and hit[0] == key:
            return hit[1]  # type: ignore[no-any-return]
    try:
        result: tuple[JobSpec, Any, Desired] | DispatchError = _validate_row(
            job_id, spec_text, policy_text, desired_text)
    except DispatchError as exc:
        result = exc
    if cache is not None:
        cache[job_id] = (key, result)
    return result


def _int_map(text: str) -> dict[str, int]:
    try:
        raw = json.loads(text or "{}")
        return {str(k): int(v) for k, v in raw.items()}
    except (json.JSONDecodeError, AttributeError, TypeError, ValueError):
        return {}


_STATUS_COLUMNS = [c for c in JobStatus.__table__.columns if c.name != "job_id"]


def load_tracked(tx: Session, cluster: str, *,
                 cache: SpecCache | None = None) -> list[LoadedJob]:
    """Every job the controller still has to reconcile (no status yet, or not terminal).

    ``cache`` (owned by the caller, kept across ticks) skips re-validating rows whose
    spec, policy and desired state did not change.
    """
    rows = tx.execute(
        select(Job.id, Job.spec, Job.policy, Job.desired, Job.generation,
               JobStatus.job_id.label("has_status"), *_STATUS_COLUMNS)
        .outerjoin(JobStatus, JobStatus.job_id == Job.id)
        .where((JobStatus.job_id.is_(None)) | (JobStatus.phase.not_in(TERMINAL)))
    ).all()
    out: list[LoadedJob] = []
    for row in rows:
        job_id = row.id
        checked = _validated(cache, job_id, row.spec, row.policy, row.desired)
        if isinstance(checked, DispatchError):
            out.append(LoadedJob(JobState(job_id=job_id, generation=row.generation or 0,
                                          desired=Desired.RUN, spec=None,
                                          phase=Phase.REJECTED), reject_reason=str(checked),
                                 has_status=row.has_status is not None))
            continue
        spec, policy, desired = checked
        if row.has_status is None:
            out.append(LoadedJob(JobState(job_id=job_id, generation=row.generation,
                                          desired=desired, spec=spec, policy=policy),
                                 has_status=False))
            continue
        current = None
        if row.current_submission is not None:
            ref = None
            if row.slurm_job_id is not None and row.slurm_submit is not None:
                ref = ObjectRef(row.cluster or cluster, "dj-" + job_id, row.slurm_job_id,
                                row.slurm_submit)
            current = Current(row.current_submission, row.attempt, row.current_since or 0, ref)
        previous = {c.name: getattr(row, c.name) for c in _STATUS_COLUMNS
                    if c.name != "updated_at"}
        out.append(LoadedJob(JobState(
            job_id=job_id, generation=row.generation, desired=desired, spec=spec,
            policy=policy, phase=Phase(row.phase), submission=row.submission,
            attempt=row.attempt, current=current,
            object_state=State(row.object_state) if row.object_state else None,
            cause=Cause(CauseKind(row.cause) if row.cause else CauseKind.NONE,
                        Provenance.UNKNOWN, row.cause_detail),
            exit_code=row.exit_code, reason=row.reason,
            nodes=tuple(filter(None, row.nodes.split(","))),
            budgets_used=_int_map(row.budgets_used),
            excluded_nodes=_int_map(row.excluded_nodes), not_before=row.not_before,
            unknown_since=row.unknown_since, hold_instance=row.hold_instance,
            started_at=row.started_at, ended_at=row.ended_at,
            observed_generation=row.observed_generation,
            conditions=_decode_conditions(row.conditions),
            outputs_verified=bool(row.outputs_verified),
        ), previous=previous))
    return out


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
        "cluster": ref.cluster if ref else None,
        "object_state": state.object_state.value if state.object_state else None,
        "cause": state.cause.kind.value if state.phase != Phase.REJECTED else "invalid",
        "cause_detail": reject_reason if state.phase == Phase.REJECTED else state.cause.detail,
        "exit_code": state.exit_code,
        "reason": state.reason,
        "budgets_used": json.dumps(dict(sorted(state.budgets_used.items()))),
        "excluded_nodes": json.dumps(dict(sorted(state.excluded_nodes.items()))),
        "conditions": encode_conditions(state.conditions),
        "not_before": state.not_before,
        "unknown_since": state.unknown_since,
        "hold_instance": state.hold_instance,
        "nodes": ",".join(state.nodes),
        "started_at": state.started_at,
        "ended_at": state.ended_at,
        "outputs_verified": state.outputs_verified,
    }


def save_status(tx: Session, state: JobState, *, exists: bool, now: int,
                reject_reason: str = "", previous: Mapping[str, Any] | None = None) -> bool:
    """Write the status row if anything changed; returns whether it wrote."""
    values = status_row_values(state, reject_reason=reject_reason)
    if previous is not None and previous == values:
        return False
    values["updated_at"] = now
    if exists:
        tx.execute(update(JobStatus).where(JobStatus.job_id == state.job_id).values(**values))
    else:
        tx.add(JobStatus(job_id=state.job_id, **values))
    return True


def save_submission(tx: Session, upd: SubmissionUpdate, *, attempt: int, now: int) -> None:
    """Insert an intent, or record what was observed of a submission row."""
    row = tx.scalars(select(Submission).where(Submission.job_id == upd.job_id,
                                              Submission.submission == upd.submission)).first()
    if row is None:
        row = Submission(job_id=upd.job_id, submission=upd.submission, attempt=attempt,
                         status=upd.status, created_at=now, cause_detail="", nodes="",
                         restart_count=0)
        tx.add(row)
    elif row.status in ("abandoned", "duplicate", "ended") and upd.status in ("submitted",):
        pass  # never step a row back
    else:
        row.status = upd.status
    obs = upd.obs
    if obs is not None:
        row.cluster = obs.ref.cluster
        row.slurm_job_id = obs.ref.id
        row.slurm_submit = row.slurm_submit or obs.ref.submit
        row.state = obs.state.value
        row.cause = obs.cause.kind.value
        row.cause_detail = obs.cause.detail
        row.exit_code = obs.exit_code
        row.nodes = ",".join(obs.nodes) or row.nodes
        if obs.restart_count is not None:
            row.restart_count = obs.restart_count
        row.started_at = obs.start or row.started_at
        row.ended_at = obs.end or row.ended_at
        if obs.attempt is not None:
            row.attempt = obs.attempt


def record_submitted(tx: Session, job_id: str, submission: int, ref: ObjectRef) -> None:
    """Start returned a ref: record it on the submission row and the status."""
    tx.execute(update(Submission).where(Submission.job_id == job_id,
                                        Submission.submission == submission)
               .values(status="submitted", cluster=ref.cluster, slurm_job_id=ref.id,
                       slurm_submit=ref.submit))
    tx.execute(update(JobStatus).where(JobStatus.job_id == job_id,
                                       JobStatus.current_submission == submission)
               .values(slurm_job_id=ref.id, slurm_submit=ref.submit, cluster=ref.cluster))


def add_events(tx: Session, events: Iterable[PlannedEvent], *, now: int) -> None:
    tx.add_all([Event(job_id=e.job_id, at=now, kind=e.kind, message=e.message, data="{}")
                for e in events])


def add_event(tx: Session, job_id: str, kind: str, message: str, *, now: int) -> None:
    tx.add(Event(job_id=job_id, at=now, kind=kind, message=message, data="{}"))


def observation_summary(obs: ObjectObs) -> str:
    return f"{obs.ref.id}:{obs.state.value}/{obs.cause.kind.value}"


def delete_job(tx: Session, job_id: str) -> None:
    tx.execute(delete(Job).where(Job.id == job_id))
