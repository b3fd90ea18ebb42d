"""instances: the node an instance last ran on and its workspace snapshot; workspace_chunks

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("instances", schema=None) as batch_op:
        batch_op.add_column(sa.Column("last_node_id", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("workspace_snapshot", sa.String(length=255), nullable=True))
        batch_op.add_column(
            sa.Column("workspace_snapshot_at", sa.DateTime(timezone=True), nullable=True)
        )
        batch_op.add_column(
            sa.Column(
                "workspace_snapshot_bytes", sa.BigInteger(), nullable=False, server_default="0"
            )
        )
        batch_op.create_foreign_key(
            batch_op.f("fk_instances_last_node_id_nodes"), "nodes", ["last_node_id"], ["id"]
        )
    with op.batch_alter_table("instances", schema=None) as batch_op:
        batch_op.alter_column("workspace_snapshot_bytes", server_default=None)
    # an instance placed now ran last where it is
    op.execute("UPDATE instances SET last_node_id = node_id WHERE node_id IS NOT NULL")

    op.create_table(
        "workspace_chunks",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("instance_id", sa.Integer(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("blob", sa.String(length=255), nullable=False),
        sa.Column("offset", sa.BigInteger(), nullable=False),
        sa.Column("length", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["instance_id"],
            ["instances.id"],
            name=op.f("fk_workspace_chunks_instance_id_instances"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_workspace_chunks")),
        sa.UniqueConstraint("instance_id", "sha256", name=op.f("uq_workspace_chunks_instance_id")),
    )
    with op.batch_alter_table("workspace_chunks", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_workspace_chunks_blob"), ["blob"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("workspace_chunks", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_workspace_chunks_blob"))
    op.drop_table("workspace_chunks")
    with op.batch_alter_table("instances", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("fk_instances_last_node_id_nodes"), type_="foreignkey")
        batch_op.drop_column("workspace_snapshot_bytes")
        batch_op.drop_column("workspace_snapshot_at")
        batch_op.drop_column("workspace_snapshot")
        batch_op.drop_column("last_node_id")
