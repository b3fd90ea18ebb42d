"""instances.workspace_saving_since: when a stopping runner began saving its workspace

A runner whose jobs have ended says so before it saves the workspace: billing ends then,
and the stop's kill deadline is measured from then by the save's own limit instead of the
stop grace, so that a long save is not cut.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("instances", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("workspace_saving_since", sa.DateTime(timezone=True), nullable=True)
        )


def downgrade() -> None:
    with op.batch_alter_table("instances", schema=None) as batch_op:
        batch_op.drop_column("workspace_saving_since")
