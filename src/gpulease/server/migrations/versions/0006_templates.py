"""templates: templates users save from their instances

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "user_templates",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("owner_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("base_template", sa.String(length=80), nullable=False),
        sa.Column("python", sa.String(length=16), nullable=False),
        sa.Column("packages", sa.JSON(), nullable=False),
        sa.Column("cuda", sa.String(length=16), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("instance_id", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["instance_id"], ["instances.id"], name=op.f("fk_user_templates_instance_id_instances")
        ),
        sa.ForeignKeyConstraint(
            ["owner_id"], ["users.id"], name=op.f("fk_user_templates_owner_id_users")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_user_templates")),
        sa.UniqueConstraint("owner_id", "name", name=op.f("uq_user_templates_owner_id")),
    )
    with op.batch_alter_table("user_templates", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_user_templates_owner_id"), ["owner_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("user_templates", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_user_templates_owner_id"))
    op.drop_table("user_templates")
