"""change feed: a change stamp on ``jobs``, ``job_status`` and ``tombstones``

Every write of a job row, of its status row, and every tombstone (a deleted job) gets a
stamp that a trigger writes, whoever writes. A tick then reads only what changed since
its last read (``controller.store.repo.changed_ids``): the stamps at or above the mark's
horizon, or of a transaction still running at the mark, where the mark was taken before
the previous read (``repo.change_mark``), so a steady tick at 100k jobs reads the few rows
that moved, not 100k version pairs.

The stamp orders commits differently on each database:
- SQLite: a counter in the one-row table ``change_seq`` (id 1), moved by the same trigger that
  moves the row version (migration 0002's triggers are replaced by ones that do both).
  SQLite has one writer at a time, so a stamp is never below a mark read after its
  commit; the mark is the counter plus one.
- PostgreSQL: the id of the writing transaction (``pg_current_xact_id()``; 64 bits, it
  never wraps). The mark is the snapshot's horizon (``pg_snapshot_xmax``) and the
  transactions still running when it is taken (``pg_snapshot_xip``): every other
  transaction below the horizon has ended, so its rows are visible to any later read;
  rows of the running ones and of later ones are read by the next read (they may still
  commit). A long writing transaction, in any database of the server, is one entry of
  the running list: it does not make the reads larger (until issue 19 the mark was the
  oldest running transaction, ``pg_snapshot_xmin``, and such a transaction made every
  steady tick read again every row written since it began).

A status row deleted on its own (by hand) moves its job row, so the job is read again.
The column is opaque and nobody writes it but the triggers.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

TABLES = ("jobs", "job_status", "tombstones")
VERSIONED = ("jobs", "job_status")

PG_VERSION_FUNCTION = """
CREATE OR REPLACE FUNCTION dispatch_row_version() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        NEW.version := floor(random() * 4503599627370496)::bigint;
    ELSE
        NEW.version := OLD.version + 1;
    END IF;
    NEW.changed := pg_current_xact_id()::text::bigint;
    RETURN NEW;
END;
$$ LANGUAGE plpgsql
"""
# migration 0002's function, for the downgrade
PG_VERSION_FUNCTION_0002 = """
CREATE OR REPLACE FUNCTION dispatch_row_version() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        NEW.version := floor(random() * 4503599627370496)::bigint;
    ELSE
        NEW.version := OLD.version + 1;
    END IF;
    RETURN NEW;
END;
$$ LANGUAGE plpgsql
"""
PG_STAMP_FUNCTION = """
CREATE OR REPLACE FUNCTION dispatch_change_stamp() RETURNS trigger AS $$
BEGIN
    NEW.changed := pg_current_xact_id()::text::bigint;
    RETURN NEW;
END;
$$ LANGUAGE plpgsql
"""
PG_STATUS_DELETED_FUNCTION = """
CREATE OR REPLACE FUNCTION dispatch_status_deleted() RETURNS trigger AS $$
BEGIN
    UPDATE jobs SET version = version WHERE id = OLD.job_id;
    RETURN OLD;
END;
$$ LANGUAGE plpgsql
"""
PG_TRIGGERS = (
    """CREATE TRIGGER tombstones_changed BEFORE INSERT OR UPDATE ON tombstones
       FOR EACH ROW EXECUTE FUNCTION dispatch_change_stamp()""",
    """CREATE TRIGGER job_status_deleted AFTER DELETE ON job_status
       FOR EACH ROW EXECUTE FUNCTION dispatch_status_deleted()""",
)

# SQLite cannot assign NEW in a BEFORE trigger: AFTER triggers write the row again, the
# stamp with the version. The WHEN guards keep each trigger from firing on the writes of
# the others (the inner writes always move ``changed``); a writer that sets a version
# itself keeps it, and still gets a stamp (``_changed_update``).
_NEXT = "UPDATE change_seq SET n = n + 1 WHERE id = 1;"
_STAMP = "(SELECT n FROM change_seq WHERE id = 1)"
SQLITE_VERSIONED = (
    f"""
CREATE TRIGGER {{table}}_version_insert AFTER INSERT ON {{table}} FOR EACH ROW
BEGIN
    {_NEXT}
    UPDATE {{table}} SET version = abs(random() % 4503599627370496), changed = {_STAMP}
    WHERE rowid = NEW.rowid;
END
""",
    f"""
CREATE TRIGGER {{table}}_version_update AFTER UPDATE ON {{table}} FOR EACH ROW
WHEN NEW.version IS OLD.version AND NEW.changed IS OLD.changed
BEGIN
    {_NEXT}
    UPDATE {{table}} SET version = OLD.version + 1, changed = {_STAMP}
    WHERE rowid = NEW.rowid;
END
""",
    f"""
CREATE TRIGGER {{table}}_changed_update AFTER UPDATE ON {{table}} FOR EACH ROW
WHEN NEW.version IS NOT OLD.version AND NEW.changed IS OLD.changed
BEGIN
    {_NEXT}
    UPDATE {{table}} SET changed = {_STAMP} WHERE rowid = NEW.rowid;
END
""",
)
SQLITE_STAMPED = (
    f"""
CREATE TRIGGER {{table}}_changed_insert AFTER INSERT ON {{table}} FOR EACH ROW
BEGIN
    {_NEXT}
    UPDATE {{table}} SET changed = {_STAMP} WHERE rowid = NEW.rowid;
END
""",
    f"""
CREATE TRIGGER {{table}}_changed_update AFTER UPDATE ON {{table}} FOR EACH ROW
WHEN NEW.changed IS OLD.changed
BEGIN
    {_NEXT}
    UPDATE {{table}} SET changed = {_STAMP} WHERE rowid = NEW.rowid;
END
""",
)
SQLITE_STATUS_DELETED = """
CREATE TRIGGER job_status_deleted AFTER DELETE ON job_status FOR EACH ROW
BEGIN
    UPDATE jobs SET version = version + 1 WHERE id = OLD.job_id;
END
"""
# migration 0002's triggers, for the downgrade
SQLITE_VERSIONED_0002 = (
    """
CREATE TRIGGER {table}_version_insert AFTER INSERT ON {table} FOR EACH ROW
BEGIN
    UPDATE {table} SET version = abs(random() % 4503599627370496) WHERE rowid = NEW.rowid;
END
""",
    """
CREATE TRIGGER {table}_version_update AFTER UPDATE ON {table} FOR EACH ROW
WHEN NEW.version IS OLD.version
BEGIN
    UPDATE {table} SET version = OLD.version + 1 WHERE rowid = NEW.rowid;
END
""",
)


def upgrade() -> None:
    for table in TABLES:
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.add_column(sa.Column("changed", sa.BigInteger(), server_default="0",
                                          nullable=False))
            batch_op.create_index(f"ix_{table}_changed", ["changed"], unique=False)
    # (on both databases, so that the schema is one; only SQLite's triggers use it)
    op.create_table(
        "change_seq",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("n", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_change_seq")),
    )
    op.execute("INSERT INTO change_seq (id, n) VALUES (1, 0)")
    dialect = op.get_bind().dialect.name
    if dialect == "postgresql":
        op.execute(PG_VERSION_FUNCTION)
        op.execute(PG_STAMP_FUNCTION)
        op.execute(PG_STATUS_DELETED_FUNCTION)
        for trigger in PG_TRIGGERS:
            op.execute(trigger)
    elif dialect == "sqlite":
        for table in VERSIONED:
            op.execute(f"DROP TRIGGER IF EXISTS {table}_version_insert")
            op.execute(f"DROP TRIGGER IF EXISTS {table}_version_update")
            for trigger in SQLITE_VERSIONED:
                op.execute(trigger.format(table=table))
        for trigger in SQLITE_STAMPED:
            op.execute(trigger.format(table="tombstones"))
        op.execute(SQLITE_STATUS_DELETED)


def downgrade() -> None:
    dialect = op.get_bind().dialect.name
    if dialect == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS tombstones_changed ON tombstones")
        op.execute("DROP TRIGGER IF EXISTS job_status_deleted ON job_status")
        op.execute("DROP FUNCTION IF EXISTS dispatch_change_stamp()")
        op.execute("DROP FUNCTION IF EXISTS dispatch_status_deleted()")
        op.execute(PG_VERSION_FUNCTION_0002)
    elif dialect == "sqlite":
        op.execute("DROP TRIGGER IF EXISTS job_status_deleted")
        op.execute("DROP TRIGGER IF EXISTS tombstones_changed_insert")
        op.execute("DROP TRIGGER IF EXISTS tombstones_changed_update")
        for table in VERSIONED:
            for suffix in ("version_insert", "version_update", "changed_update"):
                op.execute(f"DROP TRIGGER IF EXISTS {table}_{suffix}")
    op.drop_table("change_seq")
    for table in TABLES:
        # ALTER TABLE ... DROP COLUMN in place (SQLite >= 3.35): a batch rebuild of the
        # table would drop the triggers of migrations 0002 and 0006 with it
        with op.batch_alter_table(table, schema=None, recreate="never") as batch_op:
            batch_op.drop_index(f"ix_{table}_changed")
            batch_op.drop_column("changed")
    if dialect == "sqlite":
        for table in VERSIONED:
            for trigger in SQLITE_VERSIONED_0002:
                op.execute(trigger.format(table=table))
