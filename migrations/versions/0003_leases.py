"""leader leases with fencing: the ``leases`` table, and the epoch of each intent

``leases`` replaces the PostgreSQL advisory lock and the SQLite ``.leader`` file lock:
one row per lease (holder, epoch, expires_at_ms), taken and renewed by compare-and-set
(``controller.store.lease``). ``submissions.epoch`` records which lease epoch allocated
an intent (audit: which leader wrote it). Adding a column does not rebuild the table on
SQLite, so the triggers of 0002 stay.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "leases",
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("holder", sa.String(200), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("expires_at_ms", sa.BigInteger(), nullable=False),
        sa.Column("acquired_at_ms", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_leases")),
    )
    op.add_column("submissions", sa.Column("epoch", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    op.drop_column("submissions", "epoch")
    op.drop_table("leases")
