"""SLUID: Slurm's unique job id on ``job_status`` and ``submissions``

Slurm 24.11 records a job's SLUID in accounting, 25.11 prints it in squeue, and from 26.05
scancel and scontrol take it: a SLUID names one job forever, where the numeric id is
reused. The controller records it with the ref wherever the cluster reports it (None on
22.05, and for objects recorded before this migration). Adding a nullable column does not
rebuild the table on SQLite, so the triggers of 0002 stay.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("job_status", sa.Column("sluid", sa.String(64), nullable=True))
    op.add_column("submissions", sa.Column("sluid", sa.String(64), nullable=True))


def downgrade() -> None:
    op.drop_column("submissions", "sluid")
    op.drop_column("job_status", "sluid")
