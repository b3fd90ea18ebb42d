"""metrics: metric points of runs, GPU samples of nodes

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "metric_points",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=False),
        sa.Column("value", sa.Double(), nullable=False),
        sa.Column("time", sa.DateTime(timezone=True), nullable=False),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_metric_points_run_id_runs")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_metric_points")),
        sa.UniqueConstraint(
            "run_id", "source", "key", "step", name=op.f("uq_metric_points_run_id")
        ),
    )
    with op.batch_alter_table("metric_points", schema=None) as batch_op:
        batch_op.create_index(
            "ix_metric_points_run_id_key_step", ["run_id", "key", "step"], unique=False
        )

    op.create_table(
        "gpu_samples",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("node_id", sa.Integer(), nullable=False),
        sa.Column("gpu_uuid", sa.String(length=80), nullable=False),
        sa.Column("instance_id", sa.Integer(), nullable=True),
        sa.Column("time", sa.DateTime(timezone=True), nullable=False),
        sa.Column("util_pct", sa.Double(), nullable=True),
        sa.Column("memory_used_mb", sa.Integer(), nullable=True),
        sa.Column("memory_total_mb", sa.Integer(), nullable=True),
        sa.Column("power_w", sa.Double(), nullable=True),
        sa.Column("temperature_c", sa.Double(), nullable=True),
        sa.ForeignKeyConstraint(
            ["instance_id"], ["instances.id"], name=op.f("fk_gpu_samples_instance_id_instances")
        ),
        sa.ForeignKeyConstraint(
            ["node_id"], ["nodes.id"], name=op.f("fk_gpu_samples_node_id_nodes")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_gpu_samples")),
    )
    with op.batch_alter_table("gpu_samples", schema=None) as batch_op:
        batch_op.create_index("ix_gpu_samples_node_id_time", ["node_id", "time"], unique=False)
        batch_op.create_index(
            "ix_gpu_samples_instance_id_time", ["instance_id", "time"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("gpu_samples", schema=None) as batch_op:
        batch_op.drop_index("ix_gpu_samples_instance_id_time")
        batch_op.drop_index("ix_gpu_samples_node_id_time")
    op.drop_table("gpu_samples")
    with op.batch_alter_table("metric_points", schema=None) as batch_op:
        batch_op.drop_index("ix_metric_points_run_id_key_step")
    op.drop_table("metric_points")
