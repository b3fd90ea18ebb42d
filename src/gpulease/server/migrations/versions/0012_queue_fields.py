"""instances: the scheduler's reason, estimated start and its basis for a queued instance,
and where its expected duration comes from

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("instances", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("queue_reason", sa.String(length=500), nullable=False, server_default="")
        )
        batch_op.add_column(sa.Column("queue_eta", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(
            sa.Column("queue_eta_basis", sa.String(length=500), nullable=False, server_default="")
        )
        batch_op.add_column(
            sa.Column("duration_basis", sa.String(length=200), nullable=False, server_default="")
        )


def downgrade() -> None:
    with op.batch_alter_table("instances", schema=None) as batch_op:
        for name in ("duration_basis", "queue_eta_basis", "queue_eta", "queue_reason"):
            batch_op.drop_column(name)
