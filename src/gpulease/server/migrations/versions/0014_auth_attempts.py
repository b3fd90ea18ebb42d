"""auth_attempts: the guessing limits' counts, shared by every server process; an index on
api_tokens.prefix, which names the token a wrong one began like

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "auth_attempts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("subject", sa.String(length=64), nullable=False),
        sa.Column("address_key", sa.String(length=64), nullable=False),
        sa.Column("address", sa.String(length=64), nullable=False),
        sa.Column("reason", sa.String(length=100), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_auth_attempts")),
    )
    op.create_index("ix_auth_attempts_subject", "auth_attempts", ["kind", "subject", "at"])
    op.create_index("ix_auth_attempts_address", "auth_attempts", ["kind", "address_key", "at"])
    op.create_index("ix_auth_attempts_kind_at", "auth_attempts", ["kind", "at"])
    op.create_index(op.f("ix_api_tokens_prefix"), "api_tokens", ["prefix"])


def downgrade() -> None:
    op.drop_index(op.f("ix_api_tokens_prefix"), table_name="api_tokens")
    op.drop_table("auth_attempts")
