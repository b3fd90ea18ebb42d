"""gangs: the instances of one multi-node run (its id, each member's rank, its size)

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("instances", schema=None) as batch_op:
        batch_op.add_column(sa.Column("gang_id", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("gang_rank", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("gang_size", sa.Integer(), nullable=True))
        batch_op.create_index("ix_instances_gang_id", ["gang_id"])


def downgrade() -> None:
    with op.batch_alter_table("instances", schema=None) as batch_op:
        batch_op.drop_index("ix_instances_gang_id")
        batch_op.drop_column("gang_size")
        batch_op.drop_column("gang_rank")
        batch_op.drop_column("gang_id")
