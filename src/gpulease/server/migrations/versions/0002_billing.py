"""billing: plans, off-peak windows, vouchers, teams, caps, storage meters

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "offpeak_windows",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("weekdays", sa.String(length=16), nullable=False),
        sa.Column("start_minute", sa.Integer(), nullable=False),
        sa.Column("end_minute", sa.Integer(), nullable=False),
        sa.Column("discount_bp", sa.Integer(), nullable=False),
        sa.Column("tz", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_offpeak_windows")),
    )
    op.create_table(
        "spending_limits",
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("max_hourly_micro", sa.BigInteger(), nullable=True),
        sa.Column("monthly_budget_micro", sa.BigInteger(), nullable=True),
        sa.Column("admin_max_hourly_micro", sa.BigInteger(), nullable=True),
        sa.Column("admin_monthly_budget_micro", sa.BigInteger(), nullable=True),
        sa.Column("low_balance_micro", sa.BigInteger(), nullable=True),
        sa.ForeignKeyConstraint(
            ["user_id"], ["users.id"], name=op.f("fk_spending_limits_user_id_users")
        ),
        sa.PrimaryKeyConstraint("user_id", name=op.f("pk_spending_limits")),
    )
    op.create_table(
        "teams",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("owner_id", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["owner_id"], ["users.id"], name=op.f("fk_teams_owner_id_users")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_teams")),
        sa.UniqueConstraint("name", name=op.f("uq_teams_name")),
    )
    op.create_table(
        "vouchers",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("code", sa.String(length=64), nullable=False),
        sa.Column("amount_micro", sa.BigInteger(), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("max_redemptions", sa.Integer(), nullable=False),
        sa.Column("per_user_limit", sa.Integer(), nullable=False),
        sa.Column("created_by", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["created_by"], ["users.id"], name=op.f("fk_vouchers_created_by_users")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_vouchers")),
        sa.UniqueConstraint("code", name=op.f("uq_vouchers_code")),
    )
    op.create_table(
        "storage_meters",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("owner_id", sa.Integer(), nullable=False),
        sa.Column("team_id", sa.Integer(), nullable=True),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("ref_id", sa.Integer(), nullable=False),
        sa.Column("kib", sa.BigInteger(), nullable=False),
        sa.Column("kib_seconds", sa.BigInteger(), nullable=False),
        sa.Column("charged_micro", sa.BigInteger(), nullable=False),
        sa.Column("price_micro_per_gb_day", sa.BigInteger(), nullable=False),
        sa.Column("measured_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("closed_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["owner_id"], ["users.id"], name=op.f("fk_storage_meters_owner_id_users")
        ),
        sa.ForeignKeyConstraint(
            ["team_id"], ["teams.id"], name=op.f("fk_storage_meters_team_id_teams")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_storage_meters")),
        sa.UniqueConstraint("kind", "ref_id", name=op.f("uq_storage_meters_kind")),
    )
    with op.batch_alter_table("storage_meters", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_storage_meters_owner_id"), ["owner_id"], unique=False)

    op.create_table(
        "team_members",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("team_id", sa.Integer(), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("monthly_limit_micro", sa.BigInteger(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["team_id"], ["teams.id"], name=op.f("fk_team_members_team_id_teams")
        ),
        sa.ForeignKeyConstraint(
            ["user_id"], ["users.id"], name=op.f("fk_team_members_user_id_users")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_team_members")),
        sa.UniqueConstraint("team_id", "user_id", name=op.f("uq_team_members_team_id")),
    )
    with op.batch_alter_table("team_members", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_team_members_team_id"), ["team_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_team_members_user_id"), ["user_id"], unique=False)

    op.create_table(
        "voucher_redemptions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("voucher_id", sa.Integer(), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("ordinal", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["user_id"], ["users.id"], name=op.f("fk_voucher_redemptions_user_id_users")
        ),
        sa.ForeignKeyConstraint(
            ["voucher_id"], ["vouchers.id"], name=op.f("fk_voucher_redemptions_voucher_id_vouchers")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_voucher_redemptions")),
        sa.UniqueConstraint(
            "voucher_id", "ordinal", name=op.f("uq_voucher_redemptions_voucher_id")
        ),
    )
    with op.batch_alter_table("voucher_redemptions", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_voucher_redemptions_user_id"), ["user_id"], unique=False
        )
        batch_op.create_index(
            batch_op.f("ix_voucher_redemptions_voucher_id"), ["voucher_id"], unique=False
        )

    with op.batch_alter_table("instances", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("plan", sa.String(length=16), nullable=False, server_default="on_demand")
        )
        batch_op.add_column(sa.Column("team_id", sa.Integer(), nullable=True))
        batch_op.add_column(
            sa.Column("start_when_cheap", sa.Boolean(), nullable=False, server_default=sa.false())
        )
        batch_op.add_column(
            sa.Column("auto_renew", sa.Boolean(), nullable=False, server_default=sa.false())
        )
        batch_op.add_column(sa.Column("reserved_until", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(
            sa.Column("daily_blocks", sa.Integer(), nullable=False, server_default="0")
        )
        batch_op.add_column(sa.Column("stopped_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.create_index(batch_op.f("ix_instances_team_id"), ["team_id"], unique=False)
        batch_op.create_foreign_key(
            batch_op.f("fk_instances_team_id_teams"), "teams", ["team_id"], ["id"]
        )

    with op.batch_alter_table("ledger_accounts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("team_id", sa.Integer(), nullable=True))
        batch_op.drop_constraint(batch_op.f("uq_ledger_accounts_kind"), type_="unique")
        batch_op.create_unique_constraint(
            batch_op.f("uq_ledger_accounts_kind"), ["kind", "user_id", "team_id"]
        )
        batch_op.create_foreign_key(
            batch_op.f("fk_ledger_accounts_team_id_teams"), "teams", ["team_id"], ["id"]
        )

    with op.batch_alter_table("notifications", schema=None) as batch_op:
        batch_op.add_column(sa.Column("dedup_key", sa.String(length=120), nullable=True))
        batch_op.create_unique_constraint(batch_op.f("uq_notifications_dedup_key"), ["dedup_key"])

    with op.batch_alter_table("usage_segments", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("plan", sa.String(length=16), nullable=False, server_default="on_demand")
        )
        batch_op.add_column(sa.Column("team_id", sa.Integer(), nullable=True))
        batch_op.add_column(
            sa.Column("offpeak", sa.JSON(), nullable=False, server_default=sa.text("'{}'"))
        )
        batch_op.create_foreign_key(
            batch_op.f("fk_usage_segments_team_id_teams"), "teams", ["team_id"], ["id"]
        )


def downgrade() -> None:
    with op.batch_alter_table("usage_segments", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("fk_usage_segments_team_id_teams"), type_="foreignkey")
        batch_op.drop_column("offpeak")
        batch_op.drop_column("team_id")
        batch_op.drop_column("plan")

    with op.batch_alter_table("notifications", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("uq_notifications_dedup_key"), type_="unique")
        batch_op.drop_column("dedup_key")

    with op.batch_alter_table("ledger_accounts", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("fk_ledger_accounts_team_id_teams"), type_="foreignkey")
        batch_op.drop_constraint(batch_op.f("uq_ledger_accounts_kind"), type_="unique")
        batch_op.create_unique_constraint(
            batch_op.f("uq_ledger_accounts_kind"), ["kind", "user_id"]
        )
        batch_op.drop_column("team_id")

    with op.batch_alter_table("instances", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("fk_instances_team_id_teams"), type_="foreignkey")
        batch_op.drop_index(batch_op.f("ix_instances_team_id"))
        batch_op.drop_column("stopped_at")
        batch_op.drop_column("daily_blocks")
        batch_op.drop_column("reserved_until")
        batch_op.drop_column("auto_renew")
        batch_op.drop_column("start_when_cheap")
        batch_op.drop_column("team_id")
        batch_op.drop_column("plan")

    with op.batch_alter_table("voucher_redemptions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_voucher_redemptions_voucher_id"))
        batch_op.drop_index(batch_op.f("ix_voucher_redemptions_user_id"))

    op.drop_table("voucher_redemptions")
    with op.batch_alter_table("team_members", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_team_members_user_id"))
        batch_op.drop_index(batch_op.f("ix_team_members_team_id"))

    op.drop_table("team_members")
    with op.batch_alter_table("storage_meters", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_storage_meters_owner_id"))

    op.drop_table("storage_meters")
    op.drop_table("vouchers")
    op.drop_table("teams")
    op.drop_table("spending_limits")
    op.drop_table("offpeak_windows")
