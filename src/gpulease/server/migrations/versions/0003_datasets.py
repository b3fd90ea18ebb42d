"""datasets: wrapped storage keys, datasets, versions, uploads, chunks, instance mounts

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "storage_keys",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("scope", sa.String(length=64), nullable=False),
        sa.Column("owner_id", sa.Integer(), nullable=True),
        sa.Column("wrapped", sa.LargeBinary(), nullable=False),
        sa.Column("master_key_id", sa.String(length=32), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("rotated_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["owner_id"], ["users.id"], name=op.f("fk_storage_keys_owner_id_users")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_storage_keys")),
        sa.UniqueConstraint("scope", name=op.f("uq_storage_keys_scope")),
    )
    with op.batch_alter_table("storage_keys", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_storage_keys_owner_id"), ["owner_id"], unique=False)

    op.create_table(
        "datasets",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("owner_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("key_id", sa.Integer(), nullable=True),
        sa.Column("current_version", sa.Integer(), nullable=True),
        sa.Column("file_count", sa.BigInteger(), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("deleted_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["key_id"], ["storage_keys.id"], name=op.f("fk_datasets_key_id_storage_keys")
        ),
        sa.ForeignKeyConstraint(
            ["owner_id"], ["users.id"], name=op.f("fk_datasets_owner_id_users")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_datasets")),
    )
    with op.batch_alter_table("datasets", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_datasets_owner_id"), ["owner_id"], unique=False)
        batch_op.create_index(
            "uq_datasets_owner_id_name_live",
            ["owner_id", "name"],
            unique=True,
            sqlite_where=sa.text("deleted_at IS NULL"),
            postgresql_where=sa.text("deleted_at IS NULL"),
        )

    op.create_table(
        "dataset_versions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("dataset_id", sa.Integer(), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("file_count", sa.BigInteger(), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("chunk_count", sa.BigInteger(), nullable=False),
        sa.Column("manifest_blob", sa.String(length=255), nullable=False),
        sa.Column("upload_id", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["dataset_id"], ["datasets.id"], name=op.f("fk_dataset_versions_dataset_id_datasets")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_dataset_versions")),
        sa.UniqueConstraint("dataset_id", "number", name=op.f("uq_dataset_versions_dataset_id")),
    )
    with op.batch_alter_table("dataset_versions", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_dataset_versions_dataset_id"), ["dataset_id"], unique=False
        )

    op.create_table(
        "dataset_uploads",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("owner_id", sa.Integer(), nullable=False),
        sa.Column("dataset_id", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("declared_files", sa.BigInteger(), nullable=False),
        sa.Column("declared_bytes", sa.BigInteger(), nullable=False),
        sa.Column("parts", sa.Integer(), nullable=False),
        sa.Column("files_listed", sa.BigInteger(), nullable=False),
        sa.Column("chunks_received", sa.BigInteger(), nullable=False),
        sa.Column("bytes_received", sa.BigInteger(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=True),
        sa.Column("state_reason", sa.String(length=500), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["dataset_id"], ["datasets.id"], name=op.f("fk_dataset_uploads_dataset_id_datasets")
        ),
        sa.ForeignKeyConstraint(
            ["owner_id"], ["users.id"], name=op.f("fk_dataset_uploads_owner_id_users")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_dataset_uploads")),
    )
    with op.batch_alter_table("dataset_uploads", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_dataset_uploads_dataset_id"), ["dataset_id"], unique=False
        )
        batch_op.create_index(batch_op.f("ix_dataset_uploads_owner_id"), ["owner_id"], unique=False)

    op.create_table(
        "dataset_chunks",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("owner_id", sa.Integer(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("key_wrapped", sa.LargeBinary(), nullable=False),
        sa.Column("stored", sa.Boolean(), nullable=False),
        sa.Column("blob", sa.String(length=255), nullable=True),
        sa.Column("offset", sa.BigInteger(), nullable=False),
        sa.Column("length", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["owner_id"], ["users.id"], name=op.f("fk_dataset_chunks_owner_id_users")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_dataset_chunks")),
        sa.UniqueConstraint("owner_id", "sha256", name=op.f("uq_dataset_chunks_owner_id")),
    )
    with op.batch_alter_table("dataset_chunks", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_dataset_chunks_blob"), ["blob"], unique=False)

    op.create_table(
        "dataset_usage",
        sa.Column("owner_id", sa.Integer(), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["owner_id"], ["users.id"], name=op.f("fk_dataset_usage_owner_id_users")
        ),
        sa.PrimaryKeyConstraint("owner_id", name=op.f("pk_dataset_usage")),
    )

    op.create_table(
        "instance_datasets",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("instance_id", sa.Integer(), nullable=False),
        sa.Column("dataset_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["dataset_id"], ["datasets.id"], name=op.f("fk_instance_datasets_dataset_id_datasets")
        ),
        sa.ForeignKeyConstraint(
            ["instance_id"],
            ["instances.id"],
            name=op.f("fk_instance_datasets_instance_id_instances"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_instance_datasets")),
        sa.UniqueConstraint("instance_id", "name", name=op.f("uq_instance_datasets_instance_id")),
    )
    with op.batch_alter_table("instance_datasets", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_instance_datasets_dataset_id"), ["dataset_id"], unique=False
        )
        batch_op.create_index(
            batch_op.f("ix_instance_datasets_instance_id"), ["instance_id"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("instance_datasets", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_instance_datasets_instance_id"))
        batch_op.drop_index(batch_op.f("ix_instance_datasets_dataset_id"))
    op.drop_table("instance_datasets")
    op.drop_table("dataset_usage")
    with op.batch_alter_table("dataset_chunks", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_dataset_chunks_blob"))
    op.drop_table("dataset_chunks")
    with op.batch_alter_table("dataset_uploads", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_dataset_uploads_owner_id"))
        batch_op.drop_index(batch_op.f("ix_dataset_uploads_dataset_id"))
    op.drop_table("dataset_uploads")
    with op.batch_alter_table("dataset_versions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_dataset_versions_dataset_id"))
    op.drop_table("dataset_versions")
    with op.batch_alter_table("datasets", schema=None) as batch_op:
        batch_op.drop_index("uq_datasets_owner_id_name_live")
        batch_op.drop_index(batch_op.f("ix_datasets_owner_id"))
    op.drop_table("datasets")
    with op.batch_alter_table("storage_keys", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_storage_keys_owner_id"))
    op.drop_table("storage_keys")
