"""autostop: idle stop, schedules, resize, user time zones

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


INSTANCE_COLUMNS: tuple[tuple[str, sa.types.TypeEngine[Any]], ...] = (
    ("last_activity_at", sa.DateTime(timezone=True)),
    ("idle_util_pct", sa.Double()),
    ("idle_minutes", sa.Integer()),
    ("idle_warned_at", sa.DateTime(timezone=True)),
    ("max_runtime_minutes", sa.Integer()),
    ("stop_after_run_id", sa.Integer()),
    ("resume_gpu_model", sa.String(length=64)),
    ("resume_gpu_count", sa.Integer()),
)


def upgrade() -> None:
    with op.batch_alter_table("instances", schema=None) as batch_op:
        for name, type_ in INSTANCE_COLUMNS:
            batch_op.add_column(sa.Column(name, type_, nullable=True))
    with op.batch_alter_table("users", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("timezone", sa.String(length=64), nullable=False, server_default="UTC")
        )

    op.create_table(
        "instance_schedules",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("instance_id", sa.Integer(), nullable=False),
        sa.Column("action", sa.String(length=8), nullable=False),
        sa.Column("cron", sa.String(length=120), nullable=False),
        sa.Column("timezone", sa.String(length=64), nullable=False),
        sa.Column("next_fire_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_fired_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["instance_id"],
            ["instances.id"],
            name=op.f("fk_instance_schedules_instance_id_instances"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_instance_schedules")),
    )
    with op.batch_alter_table("instance_schedules", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_instance_schedules_instance_id"), ["instance_id"], unique=False
        )
        batch_op.create_index("ix_instance_schedules_next_fire_at", ["next_fire_at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("instance_schedules", schema=None) as batch_op:
        batch_op.drop_index("ix_instance_schedules_next_fire_at")
        batch_op.drop_index(batch_op.f("ix_instance_schedules_instance_id"))
    op.drop_table("instance_schedules")
    with op.batch_alter_table("users", schema=None) as batch_op:
        batch_op.drop_column("timezone")
    with op.batch_alter_table("instances", schema=None) as batch_op:
        for name, _ in reversed(INSTANCE_COLUMNS):
            batch_op.drop_column(name)
