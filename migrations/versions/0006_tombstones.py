"""Tombstones, unowned objects, claims: what this database deleted, what it never had,
and which database a cluster's jobs belong to

``tombstones`` keeps, for every job row deleted (by the CLI, the client or plain SQL, on
any connection), its id, when, and the submissions it had (``N=slurm_id@cluster``, comma
separated; an intent without a ref is ``N=@``). A trigger writes it, so no writer can
skip it. The daemon's sweep cancels a live ``dj-<id>`` Slurm job only when this database
knows the id -- a row, or a tombstone -- never from the absence of a row: a job of a
neighbouring deployment on the same Slurm account is never written. Tombstones expire
(``reconcile.tombstone_ttl_s``); ``tombstones`` also keeps the fast path that submits
new rows before the live read away from an id written again after a delete.

``unowned_objects`` is what the last complete read of each cluster found of ``dj-`` jobs
whose id this database never had (a neighbour's): listed by ``dispatchctl get
--unowned``, counted by ``dispatch_unowned_jobs``, never written to Slurm.

``deployment`` holds this database's deployment id (made at its first claim; a copy of
the database carries it too), ``claims`` per cluster the token its leader last wrote to
the marker ``<output.dir>/.owners/<deployment id>@<cluster>`` on that cluster, and the one before:
a marker that is neither was written by another database with the same id -- a backup
restored while its deployment runs -- and the leader refuses to act (``conflict``).

On SQLite the delete cascade of migration 0002 is an AFTER trigger, so the tombstone
trigger is a BEFORE trigger (the submissions are still there); on PostgreSQL a BEFORE
DELETE row trigger on ``jobs`` runs before the foreign keys' cascade.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

PG_FUNCTION = """
CREATE OR REPLACE FUNCTION dispatch_tombstone() RETURNS trigger AS $$
BEGIN
    INSERT INTO tombstones (job_id, deleted_at_ms, refs)
    VALUES (OLD.id, (extract(epoch from clock_timestamp()) * 1000)::bigint,
            coalesce((SELECT string_agg(s.submission || '=' || coalesce(s.slurm_job_id::text, '')
                                        || '@' || coalesce(s.cluster, ''), ','
                                        ORDER BY s.submission)
                      FROM submissions s WHERE s.job_id = OLD.id), ''))
    ON CONFLICT (job_id) DO UPDATE SET deleted_at_ms = EXCLUDED.deleted_at_ms,
        refs = CASE WHEN EXCLUDED.refs = '' THEN tombstones.refs
                    WHEN tombstones.refs = '' THEN EXCLUDED.refs
                    ELSE tombstones.refs || ',' || EXCLUDED.refs END;
    RETURN OLD;
END;
$$ LANGUAGE plpgsql
"""
PG_TRIGGER = """
CREATE TRIGGER jobs_tombstone BEFORE DELETE ON jobs
FOR EACH ROW EXECUTE FUNCTION dispatch_tombstone()
"""
SQLITE_TRIGGER = """
CREATE TRIGGER jobs_tombstone BEFORE DELETE ON jobs FOR EACH ROW
BEGIN
    INSERT INTO tombstones (job_id, deleted_at_ms, refs)
    VALUES (OLD.id, CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER),
            coalesce((SELECT group_concat(r, ',') FROM (
                SELECT submission || '=' || coalesce(slurm_job_id, '') || '@'
                       || coalesce(cluster, '') AS r
                FROM submissions WHERE job_id = OLD.id ORDER BY submission)), ''))
    ON CONFLICT (job_id) DO UPDATE SET deleted_at_ms = excluded.deleted_at_ms,
        refs = CASE WHEN excluded.refs = '' THEN tombstones.refs
                    WHEN tombstones.refs = '' THEN excluded.refs
                    ELSE tombstones.refs || ',' || excluded.refs END;
END
"""


def upgrade() -> None:
    op.create_table(
        "tombstones",
        sa.Column("job_id", sa.String(26), nullable=False),
        sa.Column("deleted_at_ms", sa.BigInteger(), nullable=False),
        sa.Column("refs", sa.Text(), nullable=False, server_default=""),
        sa.PrimaryKeyConstraint("job_id", name=op.f("pk_tombstones")),
    )
    op.create_index("ix_tombstones_deleted_at_ms", "tombstones", ["deleted_at_ms"])
    op.create_table(
        "unowned_objects",
        sa.Column("cluster", sa.String(64), nullable=False),
        sa.Column("slurm_job_id", sa.BigInteger(), nullable=False),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("submit", sa.BigInteger(), nullable=True),
        sa.Column("seen_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("cluster", "slurm_job_id", name=op.f("pk_unowned_objects")),
    )
    op.create_table(
        "deployment",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_deployment")),
    )
    op.create_table(
        "claims",
        sa.Column("cluster", sa.String(64), nullable=False),
        sa.Column("token", sa.String(32), nullable=False),
        sa.Column("previous", sa.String(32), nullable=True),
        sa.Column("claimed_at", sa.BigInteger(), nullable=False),
        sa.Column("conflict", sa.Text(), nullable=False, server_default=""),
        sa.PrimaryKeyConstraint("cluster", name=op.f("pk_claims")),
    )
    dialect = op.get_bind().dialect.name
    if dialect == "postgresql":
        op.execute(PG_FUNCTION)
        op.execute(PG_TRIGGER)
    elif dialect == "sqlite":
        op.execute(SQLITE_TRIGGER)


def downgrade() -> None:
    dialect = op.get_bind().dialect.name
    if dialect == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS jobs_tombstone ON jobs")
        op.execute("DROP FUNCTION IF EXISTS dispatch_tombstone()")
    elif dialect == "sqlite":
        op.execute("DROP TRIGGER IF EXISTS jobs_tombstone")
    op.drop_table("claims")
    op.drop_table("deployment")
    op.drop_table("unowned_objects")
    op.drop_index("ix_tombstones_deleted_at_ms", table_name="tombstones")
    op.drop_table("tombstones")
