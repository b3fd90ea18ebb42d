"""the two write-heavy tables: metric_points with one unique index in place of two,
usage_segments with room on its pages for the billing tick's updates (PostgreSQL)

The unique constraint on metric_points (run_id, source, key, step) and the index on
(run_id, key, step) become one unique constraint on (run_id, key, step, source): the same
points are unique, the index still serves a run's keys and each key's curve in step order,
and every stored point updates one index fewer.

usage_segments gets fillfactor 50 on PostgreSQL: the billing tick updates every open segment,
and with room left on the page the new row version stays there and no index is touched
(a heap-only update). Pages written before keep their layout until the table is rewritten.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-01
"""

from __future__ import annotations

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("metric_points", schema=None) as batch_op:
        batch_op.drop_index("ix_metric_points_run_id_key_step")
        batch_op.drop_constraint("uq_metric_points_run_id", type_="unique")
        batch_op.create_unique_constraint(
            "uq_metric_points_run_id", ["run_id", "key", "step", "source"]
        )
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE usage_segments SET (fillfactor = 50)")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE usage_segments RESET (fillfactor)")
    with op.batch_alter_table("metric_points", schema=None) as batch_op:
        batch_op.drop_constraint("uq_metric_points_run_id", type_="unique")
        batch_op.create_unique_constraint(
            "uq_metric_points_run_id", ["run_id", "source", "key", "step"]
        )
        batch_op.create_index(
            "ix_metric_points_run_id_key_step", ["run_id", "key", "step"], unique=False
        )
