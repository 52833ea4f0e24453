"""Replicas and shard leases: the daemons sharing the shards (one per configured cluster)

Each daemon keeps one row here, renewed every few seconds (``controller.store.members``):
the number of live rows is how many replicas share the shards, so each takes at most its
fair share of them (``ceil(shards / live replicas)``) and leaves the rest to the others.
A row whose daemon died expires (and is deleted later); its shards' leases expire too,
and the survivors take them over.

``leases.cluster`` names the cluster a lease is for (the default cluster's lease keeps
the name ``controller``): a cluster is never led under two lease names at once, even by
replicas whose configurations order ``[[clusters]]`` differently
(``controller.store.lease``).

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "replicas",
        sa.Column("holder", sa.String(200), nullable=False),
        sa.Column("expires_at_ms", sa.BigInteger(), nullable=False),
        sa.Column("started_at_ms", sa.BigInteger(), nullable=False),
        sa.Column("shards", sa.Text(), nullable=False, server_default=""),
        sa.PrimaryKeyConstraint("holder", name=op.f("pk_replicas")),
    )
    op.add_column("leases", sa.Column("cluster", sa.String(64), nullable=True))


def downgrade() -> None:
    op.drop_column("leases", "cluster")
    op.drop_table("replicas")
