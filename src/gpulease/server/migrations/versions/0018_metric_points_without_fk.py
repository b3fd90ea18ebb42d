"""metric_points without a foreign key to runs: the run is checked once per batch instead of
once per point, and a trigger deletes a run's points with the run

The foreign key made PostgreSQL look up (and key-share lock) the run for every point stored,
a third of the insert of a batch. The integrity it gave stays: the ingest checks the run in
the statement (PostgreSQL: locked FOR KEY SHARE, so it cannot be deleted before the points
commit; SQLite: one writer at a time), and deleting a run deletes its points (the trigger
runs_delete_metric_points, on both databases). A later batch-mode alteration of `runs` on
SQLite recreates that table and drops its triggers: such a migration must create this one
again (create_points_trigger).

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-01
"""

from __future__ import annotations

from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

FK = "fk_metric_points_run_id_runs"
TRIGGER = "runs_delete_metric_points"


def create_points_trigger() -> None:
    """The trigger that deletes a run's metric points with the run."""
    if _postgres():
        # OR REPLACE: dropping every table (backups' restore --force) leaves functions
        op.execute(
            "CREATE OR REPLACE FUNCTION runs_delete_metric_points() RETURNS trigger "
            "LANGUAGE plpgsql AS "
            "$$ BEGIN DELETE FROM metric_points WHERE run_id = OLD.id; RETURN OLD; END $$"
        )
        op.execute(
            f"CREATE TRIGGER {TRIGGER} AFTER DELETE ON runs "
            "FOR EACH ROW EXECUTE FUNCTION runs_delete_metric_points()"
        )
    else:
        op.execute(
            f"CREATE TRIGGER {TRIGGER} AFTER DELETE ON runs FOR EACH ROW "
            "BEGIN DELETE FROM metric_points WHERE run_id = OLD.id; END"
        )


def upgrade() -> None:
    with op.batch_alter_table("metric_points", schema=None) as batch_op:
        batch_op.drop_constraint(FK, type_="foreignkey")
    create_points_trigger()


def downgrade() -> None:
    op.execute(f"DROP TRIGGER {TRIGGER}" + (" ON runs" if _postgres() else ""))
    if _postgres():
        op.execute("DROP FUNCTION runs_delete_metric_points()")
    # points of runs that no longer exist would refuse the foreign key
    op.execute("DELETE FROM metric_points WHERE run_id NOT IN (SELECT id FROM runs)")
    with op.batch_alter_table("metric_points", schema=None) as batch_op:
        batch_op.create_foreign_key(FK, "runs", ["run_id"], ["id"])


def _postgres() -> bool:
    return op.get_bind().dialect.name == "postgresql"
