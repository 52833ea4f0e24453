"""``Client.views_by_ids`` (``repo.list_jobs_by_ids``), the Snakemake plugin's status read:
the views of many jobs by id from one statement (per 500 ids), ids of no job left out,
on real SQLite and real PostgreSQL."""

from __future__ import annotations

from typing import Any

from sqlalchemy import event

from controller.client import Client
from controller.model.ids import new_job_id
from controller.store.db import Store

DOC = {"command": ["true"], "workdir": "/tmp", "labels": {"snakemake/run": "r1"}}


def test_views_by_ids_reads_many_jobs_in_one_statement(any_store: Store) -> None:
    client = Client(any_store.engine.url.render_as_string(hide_password=False))
    try:
        ids = [client.submit(DOC) for _ in range(3)]
        statements: list[str] = []

        def count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
            statements.append(statement)

        event.listen(client.store.engine, "before_cursor_execute", count)
        unknown = [new_job_id(), new_job_id()]
        views = client.views_by_ids([*ids, *unknown, ids[0]])
        assert sorted(views) == sorted(ids)
        assert all(v.phase == "pending" and v.labels == DOC["labels"] for v in views.values())
        assert [s.split()[0] for s in statements] == ["SELECT"], statements
        statements.clear()
        assert sorted(client.views_by_ids([*ids, *(new_job_id() for _ in range(600))])) == \
            sorted(ids)
        assert [s.split()[0] for s in statements] == ["SELECT", "SELECT"], statements
        statements.clear()
        assert client.views_by_ids([]) == {}
        assert statements == []
    finally:
        client.close()
