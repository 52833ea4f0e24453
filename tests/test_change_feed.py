"""The change feed of migration 0007 (``repo.change_mark``, ``repo.changed_ids``): every
write of a job row or its status row, and every delete, whoever makes it, is read by the
next ``changed_ids`` after a mark taken before it -- on SQLite and on PostgreSQL, also
when the transactions commit in another order than they began."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import text

from controller.store import repo
from controller.store.db import Store

DOC = json.dumps({"command": ["true"], "workdir": "/tmp"})
A, B, C = (f"01JZ8Q2N5V000000000000000{c}" for c in "ABC")


# a status row as the controller writes one (every column without a default)
STATUS = {"phase": "pending", "observed_generation": 1, "submission": 0, "attempt": 0,
          "cluster": "lab", "cause": "none", "cause_detail": "", "reason": "",
          "budgets_used": "{}", "excluded_nodes": "{}", "conditions": "[]",
          "hold_instance": 0, "nodes": "", "outputs_verified": False, "updated_at": 1}
insert_status = text(f"INSERT INTO job_status (job_id, {', '.join(STATUS)}) "
                     f"VALUES (:job_id, {', '.join(':' + k for k in STATUS)})")


def insert(conn: object, job_id: str) -> None:
    conn.execute(text("INSERT INTO jobs (id, spec) VALUES (:id, :spec)"),  # type: ignore[attr-defined]
                 {"id": job_id, "spec": DOC})


def mark(store: Store) -> repo.ChangeMark:
    with store.transaction() as tx:
        return repo.change_mark(tx)


def changed(store: Store, since: repo.ChangeMark) -> set[str]:
    with store.transaction() as tx:
        return repo.changed_ids(tx, since=since)


def test_every_kind_of_write_is_in_the_feed(any_store: Store) -> None:
    with any_store.engine.begin() as conn:
        insert(conn, A)
        insert(conn, B)
    m = mark(any_store)
    assert changed(any_store, m) == set()
    # a client's update of the job row (plain SQL)
    with any_store.engine.begin() as conn:
        conn.execute(text("UPDATE jobs SET desired = 'held' WHERE id = :id"), {"id": A})
    assert changed(any_store, m) == {A}
    # a status row inserted, then updated
    m = mark(any_store)
    with any_store.engine.begin() as conn:
        conn.execute(insert_status, {**STATUS, "job_id": B})
    assert changed(any_store, m) == {B}
    m = mark(any_store)
    with any_store.engine.begin() as conn:
        conn.execute(text("UPDATE job_status SET phase = 'running' WHERE job_id = :id"),
                     {"id": B})
    assert changed(any_store, m) == {B}
    # the status row deleted on its own, by hand: the job is read again
    m = mark(any_store)
    with any_store.engine.begin() as conn:
        conn.execute(text("DELETE FROM job_status WHERE job_id = :id"), {"id": B})
    assert changed(any_store, m) == {B}
    # a job deleted: its tombstone; a job inserted
    m = mark(any_store)
    with any_store.engine.begin() as conn:
        conn.execute(text("DELETE FROM jobs WHERE id = :id"), {"id": A})
        insert(conn, C)
    assert changed(any_store, m) == {A, C}
    # the stamps of a row move on every write; the versions still do as in 0002
    with any_store.engine.begin() as conn:
        before = conn.execute(text("SELECT version, changed FROM jobs WHERE id = :id"),
                              {"id": C}).one()
        conn.execute(text("UPDATE jobs SET labels = '{}' WHERE id = :id"), {"id": C})
        after = conn.execute(text("SELECT version, changed FROM jobs WHERE id = :id"),
                             {"id": C}).one()
    assert after[0] == before[0] + 1 and after[1] > before[1]


def test_a_transaction_that_commits_after_a_later_one_is_not_missed(
        pg_store: Store) -> None:
    """PostgreSQL: T1 writes A and stays open; a mark is taken and read; T2 writes B and
    commits; T1 commits. A reader of ``changed_ids(since=mark)`` sees both -- a counter
    taken at write time would have skipped A (its stamp below B's, committed later)."""
    with pg_store.engine.begin() as conn:
        insert(conn, A)
        insert(conn, B)
    m0 = mark(pg_store)
    t1 = pg_store.engine.connect()
    try:
        t1.begin()
        t1.execute(text("UPDATE jobs SET desired = 'held' WHERE id = :id"), {"id": A})
        m1 = mark(pg_store)
        assert changed(pg_store, m0) == set()  # T1 not committed
        with pg_store.engine.begin() as t2:
            t2.execute(text("UPDATE jobs SET desired = 'held' WHERE id = :id"), {"id": B})
        assert changed(pg_store, m1) == {B}
        m2 = mark(pg_store)  # T1 still runs: the mark names it among the running
        t1.commit()
    finally:
        t1.close()
    assert A in changed(pg_store, m2)
    assert changed(pg_store, m1) == {A, B}


@pytest.mark.parametrize("table", ["jobs", "job_status", "tombstones"])
def test_the_feed_reads_an_index(any_store: Store, table: str) -> None:
    """``changed_ids`` is a range scan of an index on each table, whatever their size."""
    with any_store.engine.connect() as conn:
        if conn.dialect.name == "sqlite":
            plan = " ".join(str(row[-1]) for row in conn.execute(text(
                f"EXPLAIN QUERY PLAN SELECT * FROM {table} WHERE changed >= 5")))
            assert f"ix_{table}_changed" in plan, plan
        else:
            names = set(conn.execute(text(
                "SELECT indexname FROM pg_indexes WHERE tablename = :t"), {"t": table}).scalars())
            assert f"ix_{table}_changed" in names


def test_a_mark_that_goes_back_reads_every_job_again(sqlite_store: Store) -> None:
    """A database whose stamps went back (restored from a backup under a running daemon)
    cannot be read through the feed: the next tick reads every tracked job's versions."""
    from controller.reconcile.memory import Memory
    from controller.reconcile.outcomes import OutcomeBook
    from controller.reconcile.report import TickReport
    from controller.reconcile.settings import ReconcileConfig

    with sqlite_store.engine.begin() as conn:
        insert(conn, A)
    memory = Memory(sqlite_store, cluster="lab", here=None, clusters=None,
                    settings=ReconcileConfig(), outcomes=OutcomeBook())
    first = TickReport()
    memory.track(first)
    assert first.full_load and memory.mark is not None
    steady = TickReport()
    memory.track(steady)
    assert not steady.full_load and steady.changed_rows == 0
    with sqlite_store.engine.begin() as conn:  # the counter of an older copy
        conn.execute(text("UPDATE change_seq SET n = 0"))
    back = TickReport()
    memory.track(back)
    assert back.full_load and back.changed_rows == 1


def test_a_long_transaction_elsewhere_does_not_make_old_rows_new(pg_store: Store) -> None:
    """PostgreSQL: a writing transaction that stays open (a bulk load, a session left
    idle inside a transaction -- in any database of the server: transaction ids are the
    server's) must not make the feed hand out, tick after tick, every row written since
    it began. A mark names the transactions running when it was taken, not only the
    oldest of them: what committed before it is not read again, and the open one's rows
    are read once it commits."""
    m0 = mark(pg_store)
    t0 = pg_store.engine.connect()
    try:
        t0.begin()
        insert(t0, C)  # a writer that stays open
        with pg_store.engine.begin() as conn:
            insert(conn, A)
            insert(conn, B)
        m1 = mark(pg_store)
        assert changed(pg_store, m0) == {A, B}
        assert changed(pg_store, m1) == set(), "rows committed before the mark read again"
        m2 = mark(pg_store)
        t0.commit()
    finally:
        t0.close()
    assert changed(pg_store, m2) == {C}
    assert changed(pg_store, m1) == {C}
    assert changed(pg_store, mark(pg_store)) == set()


def test_a_steady_tick_beside_a_long_transaction_reads_no_row(pg_store: Store) -> None:
    """The same through ``Memory.track``: a steady tick's ``changed_rows`` is 0 while a
    writing transaction of someone else stays open."""
    from controller.reconcile.memory import Memory
    from controller.reconcile.outcomes import OutcomeBook
    from controller.reconcile.report import TickReport
    from controller.reconcile.settings import ReconcileConfig

    memory = Memory(pg_store, cluster="lab", here=None, clusters=None,
                    settings=ReconcileConfig(), outcomes=OutcomeBook())
    t0 = pg_store.engine.connect()
    try:
        t0.begin()
        insert(t0, C)
        with pg_store.engine.begin() as conn:
            insert(conn, A)
            insert(conn, B)
        first = TickReport()
        memory.track(first)
        assert first.full_load and first.changed_rows == 2
        for _ in range(2):
            steady = TickReport()
            memory.track(steady)
            assert not steady.full_load and steady.changed_rows == 0
        t0.commit()
    finally:
        t0.close()
    after = TickReport()
    memory.track(after)
    assert after.changed_rows == 1 and C in memory.memos
