"""scheduler: GPU quotas per user and team, preempted spot instances

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    for table in ("users", "teams"):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.add_column(sa.Column("max_gpus", sa.Integer(), nullable=True))
    with op.batch_alter_table("instances", schema=None) as batch_op:
        batch_op.add_column(sa.Column("preempted_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("instances", schema=None) as batch_op:
        batch_op.drop_column("preempted_at")
    for table in ("teams", "users"):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.drop_column("max_gpus")
