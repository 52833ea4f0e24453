"""The store on real SQLite and real PostgreSQL: migrations match the models, rows round-trip,
bad rows written by plain SQL are rejected with a reason."""

from __future__ import annotations

import json

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import text

from controller.errors import ErrInvalid
from controller.model.job import Desired, Phase
from controller.model.setting import redact_url
from controller.store import repo
from controller.store.db import Store
from controller.store.models import Base

DOC = {"command": ["echo", "hi"], "workdir": "/tmp", "labels": {"wf": "a"}}
JOB = "01JZ8Q2N5V0000000000000000"


def test_migrations_match_models(any_store: Store) -> None:
    with any_store.engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True})
        diff = compare_metadata(ctx, Base.metadata)
    assert diff == []
    assert any_store.current_revision() == "0004"


def test_migrate_is_idempotent(any_store: Store) -> None:
    any_store.migrate()
    assert any_store.current_revision() == "0004"


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
