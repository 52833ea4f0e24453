"""row versions: ``jobs.version`` and ``job_status.version``, maintained by triggers

Every INSERT gives the row a random version and every UPDATE moves it on by one, whoever
writes (the controller, the CLI, another service with plain SQL, an operator), so the
controller can tell which rows changed since it last read them from one cheap
``SELECT id, version`` (``ix_jobs_id_version`` covers the jobs side) and reload only
those. The value is opaque: only equality means anything. Nobody writes the column.

SQLite enforces the ``ON DELETE CASCADE`` of ``job_status`` and ``submissions`` only on
connections that turned ``foreign_keys`` on; a client deleting a job with plain SQL may
not have. A trigger now cascades the delete on every connection (the rows it would have
orphaned before are removed here), so each status row belongs to a job and the phase
gauges can count ``job_status`` alone. PostgreSQL always enforces the foreign keys.

A later migration that rebuilds ``jobs``, ``job_status`` or ``submissions`` on SQLite
(Alembic's batch "move and copy") drops these triggers with the old table: it must
create them again (``SQLITE_TRIGGERS`` and ``SQLITE_CASCADE`` below).

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

TABLES = ("jobs", "job_status")

# A fresh row starts at a random value below 2**52 (so a job deleted and inserted again
# with the same id does not come back at the version the controller remembers), with room
# for 2**63 - 2**52 updates before the BIGINT could overflow.
PG_FUNCTION = """
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
PG_TRIGGER = """
CREATE TRIGGER {table}_version BEFORE INSERT OR UPDATE ON {table}
FOR EACH ROW EXECUTE FUNCTION dispatch_row_version()
"""

# SQLite cannot assign NEW in a BEFORE trigger: the AFTER triggers write the row again.
# The WHEN guard stops the second write from firing the update trigger once more (should
# recursive_triggers be on) and lets a writer that set a new version itself keep it.
SQLITE_TRIGGERS = (
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


SQLITE_CASCADE = """
CREATE TRIGGER jobs_delete_cascade AFTER DELETE ON jobs FOR EACH ROW
BEGIN
    DELETE FROM job_status WHERE job_id = OLD.id;
    DELETE FROM submissions WHERE job_id = OLD.id;
END
"""


def upgrade() -> None:
    for table in TABLES:
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.add_column(sa.Column("version", sa.BigInteger(), server_default="0",
                                          nullable=False))
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.create_index("ix_jobs_id_version", ["id", "version"], unique=False)
    dialect = op.get_bind().dialect.name
    if dialect == "postgresql":
        op.execute(PG_FUNCTION)
        for table in TABLES:
            op.execute(PG_TRIGGER.format(table=table))
    elif dialect == "sqlite":
        for table in TABLES:
            for trigger in SQLITE_TRIGGERS:
                op.execute(trigger.format(table=table))
        for table in ("job_status", "submissions"):
            op.execute(f"DELETE FROM {table} WHERE job_id NOT IN (SELECT id FROM jobs)")
        op.execute(SQLITE_CASCADE)


def downgrade() -> None:
    dialect = op.get_bind().dialect.name
    if dialect == "sqlite":
        op.execute("DROP TRIGGER IF EXISTS jobs_delete_cascade")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index("ix_jobs_id_version")
    for table in TABLES:
        if dialect == "postgresql":
            op.execute(f"DROP TRIGGER IF EXISTS {table}_version ON {table}")
        elif dialect == "sqlite":
            op.execute(f"DROP TRIGGER IF EXISTS {table}_version_insert")
            op.execute(f"DROP TRIGGER IF EXISTS {table}_version_update")
    if dialect == "postgresql":
        op.execute("DROP FUNCTION IF EXISTS dispatch_row_version()")
    for table in TABLES:
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.drop_column("version")
