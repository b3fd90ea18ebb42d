"""sweeps and their trials; instances.sweep_id for a sweep's trial instances

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "sweeps",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("owner_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=True),
        sa.Column("space", sa.JSON(), nullable=False),
        sa.Column("metric", sa.String(length=64), nullable=True),
        sa.Column("goal", sa.String(length=8), nullable=False),
        sa.Column("stop_early", sa.Boolean(), nullable=False),
        sa.Column("min_steps", sa.Integer(), nullable=False),
        sa.Column("min_trials", sa.Integer(), nullable=False),
        sa.Column("estimated_micro", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["owner_id"], ["users.id"], name="fk_sweeps_owner_id_users"),
        sa.PrimaryKeyConstraint("id", name="pk_sweeps"),
    )
    op.create_index("ix_sweeps_owner_id", "sweeps", ["owner_id"])
    op.create_table(
        "sweep_trials",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("sweep_id", sa.Integer(), nullable=False),
        sa.Column("index", sa.Integer(), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("instance_id", sa.Integer(), nullable=False),
        sa.Column("stopped_early_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("stop_reason", sa.String(length=500), nullable=False),
        sa.ForeignKeyConstraint(
            ["instance_id"], ["instances.id"], name="fk_sweep_trials_instance_id_instances"
        ),
        sa.ForeignKeyConstraint(
            ["sweep_id"], ["sweeps.id"], name="fk_sweep_trials_sweep_id_sweeps"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_sweep_trials"),
        sa.UniqueConstraint("sweep_id", "index", name="uq_sweep_trials_sweep_id"),
    )
    op.create_index("ix_sweep_trials_sweep_id", "sweep_trials", ["sweep_id"])
    op.create_index("ix_sweep_trials_instance_id", "sweep_trials", ["instance_id"])
    with op.batch_alter_table("instances", schema=None) as batch_op:
        batch_op.add_column(sa.Column("sweep_id", sa.Integer(), nullable=True))
        batch_op.create_index("ix_instances_sweep_id", ["sweep_id"])
        batch_op.create_foreign_key("fk_instances_sweep_id_sweeps", "sweeps", ["sweep_id"], ["id"])


def downgrade() -> None:
    with op.batch_alter_table("instances", schema=None) as batch_op:
        batch_op.drop_constraint("fk_instances_sweep_id_sweeps", type_="foreignkey")
        batch_op.drop_index("ix_instances_sweep_id")
        batch_op.drop_column("sweep_id")
    op.drop_index("ix_sweep_trials_instance_id", table_name="sweep_trials")
    op.drop_index("ix_sweep_trials_sweep_id", table_name="sweep_trials")
    op.drop_table("sweep_trials")
    op.drop_index("ix_sweeps_owner_id", table_name="sweeps")
    op.drop_table("sweeps")
