"""The store on real SQLite and real PostgreSQL: migrations match the models, rows round-trip,
bad rows written by plain SQL are rejected with a reason, a Start's ref is recorded only
while its submission is current (one ref or a batch of them), submission rows follow
their rules."""

from __future__ import annotations

import json
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import select, text

from controller.errors import ErrInvalid
from controller.model.job import Current, Desired, JobState, Phase, SubmissionUpdate
from controller.model.obs import Cause, ObjectObs, ObjectRef, Source, State
from controller.model.setting import redact_url
from controller.store import repo
from controller.store.db import Store
from controller.store.models import Base, JobStatus, Submission

DOC = {"command": ["echo", "hi"], "workdir": "/tmp", "labels": {"wf": "a"}}
JOB = "01JZ8Q2N5V0000000000000000"


def test_migrations_match_models(any_store: Store) -> None:
    with any_store.engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True})
        diff = compare_metadata(ctx, Base.metadata)
    assert diff == []
    assert any_store.current_revision() == "0008"


def test_migrate_is_idempotent(any_store: Store) -> None:
    any_store.migrate()
    assert any_store.current_revision() == "0008"


def test_insert_and_load_round_trip(any_store: Store) -> None:
    with any_store.transaction() as tx:
        repo.insert_job(tx, job_id=JOB, document=DOC, now=100)
    with any_store.transaction() as tx:
        (loaded,) = repo.load_tracked(tx, "lab")
    assert loaded.state.spec is not None and loaded.state.spec.command == ("echo", "hi")
    assert loaded.state.desired == Desired.RUN and not loaded.has_status
    with any_store.transaction() as tx:
        (view,) = repo.list_jobs(tx, selector={"wf": "a"})
    assert view.phase == "pending" and view.id == JOB


def test_bad_rows_from_plain_sql_are_rejected_with_reason(any_store: Store) -> None:
    with any_store.engine.begin() as conn:
        conn.execute(text("INSERT INTO jobs (id, spec) VALUES (:id, :spec)"),
                     {"id": "01JZ8Q2N5V0000000000000001",
                      "spec": json.dumps({"command": ["x"], "workdir": "relative"})})
        conn.execute(text("INSERT INTO jobs (id, spec) VALUES (:id, :spec)"),
                     {"id": "not-a-ulid", "spec": json.dumps(DOC)})
        conn.execute(text("INSERT INTO jobs (id, spec) VALUES (:id, :spec)"),
                     {"id": "01JZ8Q2N5V0000000000000002", "spec": "{not json"})
        conn.execute(text("INSERT INTO jobs (id, spec) VALUES (:id, :spec)"),
                     {"id": "01JZ8Q2N5V0000000000000003", "spec": json.dumps(DOC)})
    with any_store.transaction() as tx:
        loaded = {j.state.job_id: j for j in repo.load_tracked(tx, "lab")}
    assert loaded["01JZ8Q2N5V0000000000000001"].state.phase == Phase.REJECTED
    assert "workdir" in loaded["01JZ8Q2N5V0000000000000001"].reject_reason
    assert "id" in loaded["not-a-ulid"].reject_reason
    assert "spec" in loaded["01JZ8Q2N5V0000000000000002"].reject_reason
    assert loaded["01JZ8Q2N5V0000000000000003"].state.spec is not None


def test_insert_job_validates_before_writing(any_store: Store) -> None:
    with pytest.raises(ErrInvalid, match=r"resources\.nodes"), any_store.transaction() as tx:
        repo.insert_job(tx, job_id=JOB, document={**DOC, "resources": {"nodes": 0}}, now=1)
    with any_store.transaction() as tx:
        assert repo.list_jobs(tx) == []


def test_selector_parsing() -> None:
    assert repo.parse_selector("a=b, c==d") == {"a": "b", "c": "d"}
    with pytest.raises(ErrInvalid):
        repo.parse_selector("novalue")


def test_redact_url_hides_password() -> None:
    assert "s3cret" not in redact_url("postgresql://u:s3cret@h/db")


# ---------------------------------------------------------------- recording refs (issue 13)

# Each case: the job's submission row and status row before a ref is recorded, the ref
# recorded, and whether it is recorded. ``sub``: (status, slurm_job_id) of submission 1,
# or None for no row; ``status``: (phase, current_submission, slurm_job_id).
RECORD_CASES = [
    pytest.param(("intent", None), ("held", 1, None), 7, True, id="intent"),
    pytest.param(("submitted", 7), ("held", 1, 7), 7, True, id="same-ref-again"),
    pytest.param(("submitted", 8), ("held", 1, 8), 9, False, id="other-ref-recorded"),
    pytest.param(("abandoned", None), ("pending", None, None), 7, False, id="abandoned"),
    pytest.param(("ended", None), ("held", 1, None), 7, False, id="ended"),
    pytest.param(("intent", None), ("held", 2, None), 7, False, id="replaced"),
    pytest.param(("intent", None), ("failed", 1, None), 7, False, id="terminal"),
    pytest.param(("intent", None), ("held", 1, 6), 7, False, id="status-holds-another"),
    pytest.param(None, ("held", 1, None), 7, False, id="no-submission-row"),
]


def _job_id(i: int) -> str:
    return f"01JZ8Q2N5V00000000000001{i:02d}"


def _ref(slurm_id: int, i: int) -> ObjectRef:
    return ObjectRef("lab", "dj-" + _job_id(i), slurm_id, 1000 + slurm_id)


def _situation(store: Store, cases: list[Any]) -> None:
    """The rows of each case (job i = case i)."""
    with store.transaction() as tx:
        for i, (sub, (phase, current, status_ref), _, _) in enumerate(cases):
            job_id = _job_id(i)
            repo.insert_job(tx, job_id=job_id, document=DOC, now=1)
            state = JobState(job_id=job_id, generation=1, desired=Desired.HELD, spec=None,
                             phase=Phase(phase), submission=1,
                             current=None if current is None else Current(
                                 current, 0, 1, None if status_ref is None
                                 else _ref(status_ref, i)))
            repo.save_status(tx, state, exists=False, now=1)
            if sub is not None:
                repo.save_submissions(tx, [(SubmissionUpdate(job_id, 1, "intent"), 0)],
                                      now=1, epoch=3)
    with store.engine.begin() as conn:
        for i, (sub, _, _, _) in enumerate(cases):
            if sub is not None:
                conn.execute(text("UPDATE submissions SET status = :s, slurm_job_id = :r "
                                  "WHERE job_id = :j"), {"s": sub[0], "r": sub[1],
                                                         "j": _job_id(i)})


def _refs_held(store: Store, n: int) -> list[tuple[Any, Any]]:
    """(submission row's slurm_job_id, status row's slurm_job_id) of jobs 0..n-1."""
    with store.transaction() as tx:
        subs = dict(tx.execute(select(Submission.job_id, Submission.slurm_job_id)).all())
        statuses = dict(tx.execute(select(JobStatus.job_id, JobStatus.slurm_job_id)).all())
    return [(subs.get(_job_id(i)), statuses.get(_job_id(i))) for i in range(n)]


@pytest.mark.parametrize(("sub", "status", "slurm_id", "recorded"), RECORD_CASES)
def test_record_submitted_is_a_compare_and_set(any_store: Store, sub: Any, status: Any,
                                               slurm_id: int, recorded: bool) -> None:
    cases = [(sub, status, slurm_id, recorded)]
    _situation(any_store, cases)
    before = _refs_held(any_store, 1)
    with any_store.transaction() as tx:
        assert repo.record_submitted(tx, _job_id(0), 1, _ref(slurm_id, 0)) is recorded
    if recorded:
        assert _refs_held(any_store, 1) == [(slurm_id, slurm_id)]
    elif sub is not None and sub[0] in ("intent", "submitted") and sub[1] in (None, slurm_id):
        # the submission row matched and the status row did not: as ever, the caller
        # treats the object as a duplicate (the submission row names it)
        assert _refs_held(any_store, 1) == [(slurm_id, before[0][1])]
    else:
        assert _refs_held(any_store, 1) == before


def test_record_submitted_many_answers_each_ref_as_one_at_a_time(any_store: Store) -> None:
    """One batch over every case gives each ref the answer it gets alone, and writes each
    job's rows as recording it alone does; the same submission twice with two refs: the
    first is recorded, the second is not."""
    cases = [p.values for p in RECORD_CASES]
    _situation(any_store, cases)
    refs = [(_job_id(i), 1, _ref(slurm_id, i)) for i, (_, _, slurm_id, _) in enumerate(cases)]
    refs.append((_job_id(0), 1, _ref(99, 0)))  # a second ref for job 0's submission 1
    with any_store.transaction() as tx:
        got = repo.record_submitted_many(tx, refs)
    assert got == [recorded for _, _, _, recorded in cases] + [False]
    held = _refs_held(any_store, len(cases))
    assert held[0] == (7, 7)  # the first ref of job 0 stands
    assert [h for h, (_, _, _, ok) in zip(held, cases, strict=True) if ok] == [
        (slurm_id, slurm_id) for _, _, slurm_id, ok in cases if ok]


def test_save_submissions_writes_intents_then_observations(any_store: Store) -> None:
    """An intent, then what was observed of it, then a late 'submitted' that must not step
    an ended row back: one row per submission, each column as the rules say."""
    job_id = _job_id(0)
    with any_store.transaction() as tx:
        repo.insert_job(tx, job_id=job_id, document=DOC, now=1)
        repo.save_submissions(tx, [(SubmissionUpdate(job_id, 1, "intent"), 2)], now=5,
                              epoch=4)
    obs = ObjectObs(ref=_ref(7, 0), state=State.RUNNING, cause=Cause(), submission=1,
                    attempt=2, foreign=False, restart_count=1, hold_instance=None,
                    requeued=False, exit_code=None, nodes=("n1", "n2"), reason="",
                    submit=1007, start=1010, end=None, source=Source.LIVE, observed_at=1011)
    with any_store.transaction() as tx:
        repo.save_submissions(tx, [(SubmissionUpdate(job_id, 1, "submitted", obs), 2),
                                   (SubmissionUpdate(job_id, 1, "ended"), 2),
                                   (SubmissionUpdate(job_id, 1, "submitted"), 2),
                                   (SubmissionUpdate(job_id, 2, "intent"), 3)], now=9)
    with any_store.transaction() as tx:
        rows = repo.list_submissions(tx, job_id)
        got = [(r.submission, r.attempt, r.status, r.slurm_job_id, r.slurm_submit, r.state,
                r.nodes, r.restart_count, r.started_at, r.created_at, r.epoch) for r in rows]
    assert got == [(1, 2, "ended", 7, 1007, "running", "n1,n2", 1, 1010, 5, 4),
                   (2, 3, "intent", None, None, None, "", 0, None, 9, None)]


def test_placed_elsewhere_counts_unfinished_jobs_off_the_configured_clusters(
        any_store: Store) -> None:
    from controller.model.ids import new_job_id

    placed = {"a": 3, "lab": 2, "b": 1, "old": 2, "zz": 1, "0": 1, "lab2": 1, None: 2}
    with any_store.transaction() as tx:
        for cluster, count in placed.items():
            for _ in range(count):
                job_id = new_job_id()
                repo.insert_job(tx, job_id=job_id, document=DOC, now=100)
                tx.add(JobStatus(job_id=job_id, phase="running", cluster=cluster,
                                 updated_at=100))
        for phase in ("succeeded", "failed", "cancelled", "rejected"):  # finished: not counted
            job_id = new_job_id()
            repo.insert_job(tx, job_id=job_id, document=DOC, now=100)
            tx.add(JobStatus(job_id=job_id, phase=phase, cluster="gone", updated_at=100))
    with any_store.transaction() as tx:
        assert repo.placed_elsewhere(tx, ["lab", "a", "b"]) == {
            "old": 2, "zz": 1, "0": 1, "lab2": 1}
        assert repo.placed_elsewhere(tx, ["lab", "a", "b", "old", "zz", "0", "lab2"]) == {}
        assert repo.placed_elsewhere(tx, ["zz"]) == {
            "a": 3, "lab": 2, "b": 1, "old": 2, "0": 1, "lab2": 1}
        assert repo.placed_elsewhere(tx, []) == {
            "a": 3, "lab": 2, "b": 1, "old": 2, "zz": 1, "0": 1, "lab2": 1}


@pytest.mark.parametrize("count", ["placed_elsewhere", "phase_counts"])
def test_the_counts_read_the_cluster_phase_index(any_store: Store, count: str) -> None:
    """``placed_elsewhere`` and a shard's ``phase_counts`` read ranges of
    ``ix_job_status_cluster_phase``, not every status row (the planner may prefer a scan
    of a small table: on PostgreSQL scans are turned off to ask whether the index can
    serve the statement at all)."""
    query = (repo.placed_elsewhere_query(["c0", "c1", "lab"]) if count == "placed_elsewhere"
             else repo.phase_counts_query("lab", unplaced=True))
    with any_store.engine.connect() as conn:
        sql = str(query.compile(dialect=conn.dialect, compile_kwargs={"literal_binds": True}))
        if conn.dialect.name == "sqlite":
            plan = " ".join(str(row[-1]) for row in conn.execute(
                text(f"EXPLAIN QUERY PLAN {sql}")))
        else:
            conn.execute(text("SET LOCAL enable_seqscan = off"))
            plan = " ".join(str(row[0]) for row in conn.execute(text(f"EXPLAIN {sql}")))
    assert "ix_job_status_cluster_phase" in plan, plan
    assert "SCAN job_status" not in plan.replace("USING COVERING INDEX", "") \
        and "Seq Scan" not in plan, plan
