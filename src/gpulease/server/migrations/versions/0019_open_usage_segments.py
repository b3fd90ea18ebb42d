"""usage_segments: a partial index of the open segments

The meter reads the open segments every second (and asks whether there is any first, in a
read-only transaction). Without an index both read every segment ever closed, a table that
only grows; the partial index holds only the open ones. The billing tick's update of an
open segment changes neither its id nor ended_at, so on PostgreSQL it stays a heap-only
update.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(
        "ix_usage_segments_open",
        "usage_segments",
        ["id"],
        sqlite_where=sa.text("ended_at IS NULL"),
        postgresql_where=sa.text("ended_at IS NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_usage_segments_open", table_name="usage_segments")
