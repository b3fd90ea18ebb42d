"""Database tables. Rows never leave the services: routers get schemas built from them."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship


class UTCDateTime(TypeDecorator[datetime]):
    """Aware UTC datetimes in and out, on SQLite (which keeps no zone) and Postgres alike."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to the database; use gpulease.server.db.utcnow")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        assert isinstance(value, datetime)
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class User(Base):
    __tablename__ = "users"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    email: Mapped[str | None] = mapped_column(String(254))
    password_hash: Mapped[str] = mapped_column(String(255))
    role: Mapped[str] = mapped_column(String(16), default="user")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


class ApiToken(Base):
    """Bearer tokens, stored as SHA-256 of a 256-bit random secret. kind: api or session."""

    __tablename__ = "api_tokens"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    name: Mapped[str] = mapped_column(String(100))
    kind: Mapped[str] = mapped_column(String(16), default="api")
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    last_used_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    user: Mapped[User] = relationship()


class LedgerAccount(Base):
    """A side of double-entry bookkeeping: a user's wallet, platform revenue, credit grants."""

    __tablename__ = "ledger_accounts"
    __table_args__ = (UniqueConstraint("kind", "user_id"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))  # wallet | revenue | grants
    user_id: Mapped[int | None] = mapped_column(ForeignKey("users.id"))


class LedgerTransaction(Base):
    """A balanced set of entries (they sum to zero). idempotency_key makes a retry a no-op."""

    __tablename__ = "ledger_transactions"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    kind: Mapped[str] = mapped_column(String(24))  # signup_credit | grant | usage
    idempotency_key: Mapped[str] = mapped_column(String(120), unique=True)
    memo: Mapped[str] = mapped_column(String(255), default="")
    user_id: Mapped[int | None] = mapped_column(ForeignKey("users.id"), index=True)
    instance_id: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


class LedgerEntry(Base):
    """Append-only. Amounts are integer micro-credits; a balance is a SUM, never stored."""

    __tablename__ = "ledger_entries"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    transaction_id: Mapped[int] = mapped_column(ForeignKey("ledger_transactions.id"), index=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("ledger_accounts.id"), index=True)
    amount: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


class Node(Base):
    __tablename__ = "nodes"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    backend: Mapped[str] = mapped_column(String(16))
    hostname: Mapped[str] = mapped_column(String(255))
    driver_version: Mapped[str | None] = mapped_column(String(32))
    cuda_version: Mapped[str | None] = mapped_column(String(16))
    cpu_count: Mapped[int] = mapped_column(Integer, default=0)
    memory_mb: Mapped[int] = mapped_column(BigInteger, default=0)
    status: Mapped[str] = mapped_column(String(16), default="ready")
    registered_at: Mapped[datetime] = mapped_column(UTCDateTime)
    last_seen_at: Mapped[datetime] = mapped_column(UTCDateTime)
    gpus: Mapped[list[Gpu]] = relationship(back_populates="node", order_by="Gpu.index")


class Gpu(Base):
    """One physical (or simulated) GPU. instance_id set = allocated to that instance."""

    __tablename__ = "gpus"
    __table_args__ = (UniqueConstraint("node_id", "index"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id"), index=True)
    index: Mapped[int] = mapped_column(Integer)
    uuid: Mapped[str] = mapped_column(String(80), unique=True)
    nvml_name: Mapped[str] = mapped_column(String(128))
    model: Mapped[str | None] = mapped_column(String(64))
    memory_mb: Mapped[int] = mapped_column(Integer)
    simulated: Mapped[bool] = mapped_column(Boolean, default=False)
    present: Mapped[bool] = mapped_column(Boolean, default=True)
    instance_id: Mapped[int | None] = mapped_column(ForeignKey("instances.id"), index=True)
    node: Mapped[Node] = relationship(back_populates="gpus")


class Instance(Base):
    """The unit of rental. status changes only via services.instances.states.switch_status."""

    __tablename__ = "instances"
    __table_args__ = (
        UniqueConstraint("owner_id", "name"),
        Index("ix_instances_status_queued_at", "status", "queued_at"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    name: Mapped[str] = mapped_column(String(64))
    gpu_model: Mapped[str] = mapped_column(String(64))
    gpu_count: Mapped[int] = mapped_column(Integer)
    template: Mapped[str] = mapped_column(String(64))
    hourly_micro: Mapped[int] = mapped_column(BigInteger)
    status: Mapped[str] = mapped_column(String(16))
    desired_state: Mapped[str] = mapped_column(String(16))
    status_reason: Mapped[str] = mapped_column(String(500), default="")
    status_message: Mapped[str] = mapped_column(String(500), default="")
    auto_release: Mapped[bool] = mapped_column(Boolean, default=False)
    node_id: Mapped[int | None] = mapped_column(ForeignKey("nodes.id"))
    workspace: Mapped[str | None] = mapped_column(String(500))
    workdir_upload: Mapped[str | None] = mapped_column(String(500))
    # Created by `gpulease run`, whose workdir upload follows: not placed until it lands.
    awaiting_workdir: Mapped[bool] = mapped_column(Boolean, default=False)
    runner_token_hash: Mapped[str | None] = mapped_column(String(64), unique=True)
    runner_handle: Mapped[str | None] = mapped_column(String(255))
    runner_launched_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    last_heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    stop_requested_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    queued_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)
    owner: Mapped[User] = relationship()
    node: Mapped[Node | None] = relationship()
    gpus: Mapped[list[Gpu]] = relationship(order_by="Gpu.index", viewonly=True)


class Run(Base):
    __tablename__ = "runs"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    instance_id: Mapped[int] = mapped_column(ForeignKey("instances.id"), index=True)
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    command: Mapped[str] = mapped_column(Text)
    env: Mapped[dict[str, str]] = mapped_column(JSON, default=dict)
    status: Mapped[str] = mapped_column(String(16))  # pending running succeeded failed
    exit_code: Mapped[int | None] = mapped_column(Integer)
    status_reason: Mapped[str] = mapped_column(String(500), default="")
    stop_instance_on_exit: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    instance: Mapped[Instance] = relationship()


class LogChunk(Base):
    __tablename__ = "log_chunks"
    __table_args__ = (UniqueConstraint("run_id", "seq"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"), index=True)
    seq: Mapped[int] = mapped_column(Integer)
    stream: Mapped[str] = mapped_column(String(8))
    data: Mapped[str] = mapped_column(Text)
    time: Mapped[datetime] = mapped_column(UTCDateTime)


class UsageSegment(Base):
    """One continuous interval an instance held its GPUs at one rate. The meter charges
    cost_for_seconds(hourly_micro, billed_seconds) in total, never more, never twice."""

    __tablename__ = "usage_segments"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    instance_id: Mapped[int] = mapped_column(ForeignKey("instances.id"), index=True)
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    gpu_model: Mapped[str] = mapped_column(String(64))
    gpu_count: Mapped[int] = mapped_column(Integer)
    hourly_micro: Mapped[int] = mapped_column(BigInteger)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    billed_seconds: Mapped[int] = mapped_column(BigInteger, default=0)
    charged_micro: Mapped[int] = mapped_column(BigInteger, default=0)


class Notification(Base):
    __tablename__ = "notifications"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    kind: Mapped[str] = mapped_column(String(32))
    message: Mapped[str] = mapped_column(String(1000))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    read_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
