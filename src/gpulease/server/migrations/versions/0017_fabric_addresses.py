"""fabric addresses: each rank of a multi-node run's address on the job fabric

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("instances", schema=None) as batch_op:
        batch_op.add_column(sa.Column("fabric_address", sa.String(length=64), nullable=True))
        # one holder per address: two replicas placing gangs at once cannot both take it
        batch_op.create_index("ix_instances_fabric_address", ["fabric_address"], unique=True)


def downgrade() -> None:
    with op.batch_alter_table("instances", schema=None) as batch_op:
        batch_op.drop_index("ix_instances_fabric_address")
        batch_op.drop_column("fabric_address")
