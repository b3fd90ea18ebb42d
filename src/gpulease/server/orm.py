"""Database tables. Rows never leave the services: routers get schemas built from them."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Double,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    text,
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
    # IANA zone name; the user's schedules (services/instances/schedules) fire in it.
    timezone: Mapped[str] = mapped_column(String(64), default="UTC", server_default="UTC")
    # Most GPUs the user's instances may hold at once (services/quotas.py); None: no cap.
    max_gpus: Mapped[int | None] = mapped_column(Integer)


class ApiToken(Base):
    """Bearer tokens, stored as SHA-256 of a 256-bit random secret. kind: api or session."""

    __tablename__ = "api_tokens"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    name: Mapped[str] = mapped_column(String(100))
    kind: Mapped[str] = mapped_column(String(16), default="api")
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    # The secret's first 10 characters (random after "glp_"): what a wrong token that
    # begins like this one is counted against (services/ratelimit).
    prefix: Mapped[str] = mapped_column(String(16), index=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    last_used_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    user: Mapped[User] = relationship()


class AuthAttempt(Base):
    """One counted attempt of the guessing limits (services/ratelimit), shared by every
    server process: a failed login (subject: the account name), a refused one, a
    registration, a request with a wrong bearer token (subject: the prefix of the token it
    began like, or ""). Rows older than the window go, but the latest failed logins stay
    for the admin."""

    __tablename__ = "auth_attempts"
    __table_args__ = (
        Index("ix_auth_attempts_subject", "kind", "subject", "at"),
        Index("ix_auth_attempts_address", "kind", "address_key", "at"),
        Index("ix_auth_attempts_kind_at", "kind", "at"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))  # login | login-refused | register | token
    subject: Mapped[str] = mapped_column(String(64))
    address_key: Mapped[str] = mapped_column(String(64))
    address: Mapped[str] = mapped_column(String(64))
    reason: Mapped[str] = mapped_column(String(100))
    at: Mapped[datetime] = mapped_column(UTCDateTime)


class LedgerAccount(Base):
    """A side of double-entry bookkeeping: a user's wallet, platform revenue, credit grants."""

    __tablename__ = "ledger_accounts"
    __table_args__ = (UniqueConstraint("kind", "user_id", "team_id"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))  # wallet | team_wallet | revenue | grants
    user_id: Mapped[int | None] = mapped_column(ForeignKey("users.id"))
    team_id: Mapped[int | None] = mapped_column(ForeignKey("teams.id"))


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
    # The scheduler's word on a queued instance, each tick (reconcilers/scheduler.py): why it
    # waits, its estimated start and what that rests on; and how long it is expected to hold
    # its GPUs, in words ("declared 2 h", "learned from your last 5 runs of train").
    queue_reason: Mapped[str] = mapped_column(String(500), default="")
    queue_eta: Mapped[datetime | None] = mapped_column(UTCDateTime)
    queue_eta_basis: Mapped[str] = mapped_column(String(500), default="")
    duration_basis: Mapped[str] = mapped_column(String(200), default="")
    auto_release: Mapped[bool] = mapped_column(Boolean, default=False)
    node_id: Mapped[int | None] = mapped_column(ForeignKey("nodes.id"))
    # The node it last ran on (kept while stopped; node_id is the node holding it now): a
    # start goes back there when it can, else its workspace moves (services/workspaces.py).
    last_node_id: Mapped[int | None] = mapped_column(ForeignKey("nodes.id"))
    workspace: Mapped[str | None] = mapped_column(String(500))
    # The workspace as its runner saved it at its last stop on a fleet backend: the sealed
    # manifest's blob key, when it was taken and its bytes (services/workspaces.py).
    workspace_snapshot: Mapped[str | None] = mapped_column(String(255))
    workspace_snapshot_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    workspace_snapshot_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    # set by a stopping runner whose jobs ended and that is saving its workspace
    workspace_saving_since: Mapped[datetime | None] = mapped_column(UTCDateTime)
    workdir_upload: Mapped[str | None] = mapped_column(String(500))
    # Created by `gpulease run`, whose workdir upload follows: not placed until it lands.
    awaiting_workdir: Mapped[bool] = mapped_column(Boolean, default=False)
    # Billing (see services/billing): on_demand | daily | spot; the wallet it is charged to.
    plan: Mapped[str] = mapped_column(String(16), default="on_demand")
    team_id: Mapped[int | None] = mapped_column(ForeignKey("teams.id"), index=True)
    start_when_cheap: Mapped[bool] = mapped_column(Boolean, default=False)
    auto_renew: Mapped[bool] = mapped_column(Boolean, default=False)
    # Daily plan: the paid block's end; its GPUs stay reserved until then, even when stopped.
    reserved_until: Mapped[datetime | None] = mapped_column(UTCDateTime)
    daily_blocks: Mapped[int] = mapped_column(Integer, default=0)
    # Automatic stop (services/instances/autostop, reconcilers/idle): terminal or notebook
    # activity; idle stop below idle_util_pct % for idle_minutes (None: off, or the
    # operator's ceiling); a stop after max_runtime_minutes running; a run whose end stops it.
    last_activity_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    idle_util_pct: Mapped[float | None] = mapped_column(Double)
    idle_minutes: Mapped[int | None] = mapped_column(Integer)
    idle_warned_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    max_runtime_minutes: Mapped[int | None] = mapped_column(Integer)
    stop_after_run_id: Mapped[int | None] = mapped_column(Integer)
    # A no-GPU start (services/instances/resize) keeps the GPUs it set aside here; a plain
    # start brings them back.
    resume_gpu_model: Mapped[str | None] = mapped_column(String(64))
    resume_gpu_count: Mapped[int | None] = mapped_column(Integer)
    stopped_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    runner_token_hash: Mapped[str | None] = mapped_column(String(64), unique=True)
    runner_handle: Mapped[str | None] = mapped_column(String(255))
    runner_launched_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    last_heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    stop_requested_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # When the scheduler preempted it (spot): it stops after a grace and is queued again.
    preempted_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # A member of a multi-node run (services/instances/gangs.py): its gang (rank 0's id),
    # its rank in it and the gang's size. None: a one-node instance.
    gang_id: Mapped[int | None] = mapped_column(Integer, index=True)
    gang_rank: Mapped[int | None] = mapped_column(Integer)
    gang_size: Mapped[int | None] = mapped_column(Integer)
    # Its address on the job fabric (GPULEASE_FABRIC_CIDR), given when its gang is placed;
    # held until no rank of its gang is live any more. None: no fabric.
    fabric_address: Mapped[str | None] = mapped_column(String(64), index=True, unique=True)
    # A trial of a sweep (services/sweeps.py); None: not one.
    sweep_id: Mapped[int | None] = mapped_column(ForeignKey("sweeps.id"), index=True)
    queued_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)
    owner: Mapped[User] = relationship()
    node: Mapped[Node | None] = relationship(foreign_keys=[node_id])
    last_node: Mapped[Node | None] = relationship(foreign_keys=[last_node_id])
    team: Mapped[Team | None] = relationship()
    gpus: Mapped[list[Gpu]] = relationship(order_by="Gpu.index", viewonly=True)


class Run(Base):
    __tablename__ = "runs"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    instance_id: Mapped[int] = mapped_column(ForeignKey("instances.id"), index=True)
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    command: Mapped[str] = mapped_column(Text)
    task_name: Mapped[str | None] = mapped_column(String(100))  # a task file's `name:`
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
    cost_for_seconds(hourly_micro, billed_seconds) in total, never more, never twice.
    PostgreSQL leaves half of each page free, so that the billing tick's update of every open
    segment stays on its page and touches no index (a heap-only update)."""

    __tablename__ = "usage_segments"
    __table_args__ = (
        # only the open segments, which the meter reads every second
        Index(
            "ix_usage_segments_open",
            "id",
            sqlite_where=text("ended_at IS NULL"),
            postgresql_where=text("ended_at IS NULL"),
        ),
        {"postgresql_with": {"fillfactor": 50}},
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    instance_id: Mapped[int] = mapped_column(ForeignKey("instances.id"), index=True)
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    gpu_model: Mapped[str] = mapped_column(String(64))
    gpu_count: Mapped[int] = mapped_column(Integer)
    hourly_micro: Mapped[int] = mapped_column(BigInteger)
    plan: Mapped[str] = mapped_column(String(16), default="on_demand")
    team_id: Mapped[int | None] = mapped_column(ForeignKey("teams.id"))
    # The off-peak windows and time zone in force when the segment opened: its price is
    # fixed then, whatever an admin changes later.
    offpeak: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
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
    # Set for notices that must go out once (a release warning, a low balance crossing).
    dedup_key: Mapped[str | None] = mapped_column(String(120), unique=True)


class Team(Base):
    """A lab or team with a shared wallet (ledger account kind team_wallet)."""

    __tablename__ = "teams"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id"))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    # Most GPUs the team's instances may hold at once (services/quotas.py); None: no cap.
    max_gpus: Mapped[int | None] = mapped_column(Integer)


class TeamMember(Base):
    __tablename__ = "team_members"
    __table_args__ = (UniqueConstraint("team_id", "user_id"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id"), index=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    # What this member may charge to the team wallet per calendar month; None: no limit.
    monthly_limit_micro: Mapped[int | None] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


class OffPeakWindowRow(Base):
    """An operator's off-peak window (core.pricing.OffPeakWindow), in the operator's zone."""

    __tablename__ = "offpeak_windows"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    weekdays: Mapped[str] = mapped_column(String(16))  # digits 0-6, Monday = 0
    start_minute: Mapped[int] = mapped_column(Integer)
    end_minute: Mapped[int] = mapped_column(Integer)
    discount_bp: Mapped[int] = mapped_column(Integer)
    tz: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


class Voucher(Base):
    __tablename__ = "vouchers"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    code: Mapped[str] = mapped_column(String(64), unique=True)
    amount_micro: Mapped[int] = mapped_column(BigInteger)
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    max_redemptions: Mapped[int] = mapped_column(Integer, default=1)
    per_user_limit: Mapped[int] = mapped_column(Integer, default=1)
    created_by: Mapped[int] = mapped_column(ForeignKey("users.id"))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


class VoucherRedemption(Base):
    """One use of a voucher. (voucher_id, ordinal) is unique: two redemptions racing for the
    last use cannot both get it, on any database."""

    __tablename__ = "voucher_redemptions"
    __table_args__ = (UniqueConstraint("voucher_id", "ordinal"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    voucher_id: Mapped[int] = mapped_column(ForeignKey("vouchers.id"), index=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    ordinal: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


class SpendingLimit(Base):
    """A user's caps: what they set, and the ceiling an admin set. None: no cap."""

    __tablename__ = "spending_limits"
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id"), primary_key=True)
    max_hourly_micro: Mapped[int | None] = mapped_column(BigInteger)
    monthly_budget_micro: Mapped[int | None] = mapped_column(BigInteger)
    admin_max_hourly_micro: Mapped[int | None] = mapped_column(BigInteger)
    admin_monthly_budget_micro: Mapped[int | None] = mapped_column(BigInteger)
    low_balance_micro: Mapped[int | None] = mapped_column(BigInteger)


class StorageMeter(Base):
    """Storage held by one workspace or dataset, billed per GB-day. Usage accumulates in
    KiB-seconds; the charge so far is always floor(kib_seconds × price / (GiB-day)), so
    each tick posts only the difference, as usage segments do."""

    __tablename__ = "storage_meters"
    __table_args__ = (UniqueConstraint("kind", "ref_id"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    team_id: Mapped[int | None] = mapped_column(ForeignKey("teams.id"))
    kind: Mapped[str] = mapped_column(String(16))  # workspace | datasets (ref = the user)
    ref_id: Mapped[int] = mapped_column(Integer)
    kib: Mapped[int] = mapped_column(BigInteger, default=0)
    kib_seconds: Mapped[int] = mapped_column(BigInteger, default=0)
    charged_micro: Mapped[int] = mapped_column(BigInteger, default=0)
    price_micro_per_gb_day: Mapped[int] = mapped_column(BigInteger)
    measured_at: Mapped[datetime] = mapped_column(UTCDateTime)
    closed_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


# Datasets (services/datasets; the key scheme is explained in services/datasets/keys.py)


class StorageKey(Base):
    """A 256-bit key wrapped (AES-256-GCM) by the master key, bound to its scope:
    'user:ID' (wraps that user's chunk keys), 'dataset:ID' (seals its manifests), or the
    one 'master' row that names the master key in force (see services/datasets/keys.py)."""

    __tablename__ = "storage_keys"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    scope: Mapped[str] = mapped_column(String(64), unique=True)
    owner_id: Mapped[int | None] = mapped_column(ForeignKey("users.id"), index=True)
    wrapped: Mapped[bytes] = mapped_column(LargeBinary)
    master_key_id: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    rotated_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class Dataset(Base):
    """A user's named dataset. Visible only once it has a committed version (current_version
    set); a push in progress never shows. Names are unique per owner among live datasets."""

    __tablename__ = "datasets"
    __table_args__ = (
        Index(
            "uq_datasets_owner_id_name_live",
            "owner_id",
            "name",
            unique=True,
            sqlite_where=text("deleted_at IS NULL"),
            postgresql_where=text("deleted_at IS NULL"),
        ),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    name: Mapped[str] = mapped_column(String(64))
    key_id: Mapped[int | None] = mapped_column(ForeignKey("storage_keys.id"))
    current_version: Mapped[int | None] = mapped_column(Integer)
    file_count: Mapped[int] = mapped_column(BigInteger, default=0)
    size_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)
    deleted_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class DatasetVersion(Base):
    """A committed, immutable version: its manifest (paths, sizes, chunk ids) is a blob sealed
    with the dataset's key. Versions exist only once complete."""

    __tablename__ = "dataset_versions"
    __table_args__ = (UniqueConstraint("dataset_id", "number"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    dataset_id: Mapped[int] = mapped_column(ForeignKey("datasets.id"), index=True)
    number: Mapped[int] = mapped_column(Integer)
    file_count: Mapped[int] = mapped_column(BigInteger)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    chunk_count: Mapped[int] = mapped_column(BigInteger)
    manifest_blob: Mapped[str] = mapped_column(String(255))
    upload_id: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


class DatasetUpload(Base):
    """One push: open until committed (a version appears), abandoned or refused. Counts what
    the server received through it, so a resumed push shows it sent only the rest."""

    __tablename__ = "dataset_uploads"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    dataset_id: Mapped[int] = mapped_column(ForeignKey("datasets.id"), index=True)
    state: Mapped[str] = mapped_column(String(16))  # open committed abandoned refused
    declared_files: Mapped[int] = mapped_column(BigInteger, default=0)
    declared_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    parts: Mapped[int] = mapped_column(Integer, default=0)
    files_listed: Mapped[int] = mapped_column(BigInteger, default=0)
    chunks_received: Mapped[int] = mapped_column(BigInteger, default=0)
    bytes_received: Mapped[int] = mapped_column(BigInteger, default=0)
    version: Mapped[int | None] = mapped_column(Integer)
    state_reason: Mapped[str] = mapped_column(String(500), default="")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)


class DatasetChunk(Base):
    """A chunk a user has (or has reserved for a push in progress: stored is False until its
    bytes arrive). One row per (owner, plaintext SHA-256): the per-user dedup. key_wrapped is
    the chunk's own random key, wrapped by the owner's user key. Its sealed bytes are
    [offset, offset+length) of the pack blob `blob`, which holds the chunks that arrived in
    one request (a pack is deleted when no row points into it any more)."""

    __tablename__ = "dataset_chunks"
    __table_args__ = (UniqueConstraint("owner_id", "sha256"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id"))
    sha256: Mapped[str] = mapped_column(String(64))
    size: Mapped[int] = mapped_column(BigInteger)
    key_wrapped: Mapped[bytes] = mapped_column(LargeBinary)
    stored: Mapped[bool] = mapped_column(Boolean, default=False)
    blob: Mapped[str | None] = mapped_column(String(255), index=True)
    offset: Mapped[int] = mapped_column(BigInteger, default=0)
    length: Mapped[int] = mapped_column(BigInteger, default=0)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


class WorkspaceChunk(Base):
    """A chunk of an instance's workspace snapshot (services/workspaces.py): one row per
    (instance, plaintext SHA-256), its sealed bytes [offset, offset+length) of the pack blob
    `blob`, sealed with the instance's workspace key (storage_keys scope 'workspace:ID')."""

    __tablename__ = "workspace_chunks"
    __table_args__ = (UniqueConstraint("instance_id", "sha256"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    instance_id: Mapped[int] = mapped_column(ForeignKey("instances.id"))
    sha256: Mapped[str] = mapped_column(String(64))
    size: Mapped[int] = mapped_column(BigInteger)
    blob: Mapped[str] = mapped_column(String(255), index=True)
    offset: Mapped[int] = mapped_column(BigInteger, default=0)
    length: Mapped[int] = mapped_column(BigInteger, default=0)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


class DatasetUsage(Base):
    """The bytes of a user's chunk rows (stored or reserved), kept in step with them in the
    same transactions (under the owner's storage lock): what the quota is checked against,
    without summing 100,000 rows at every step of a push."""

    __tablename__ = "dataset_usage"
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id"), primary_key=True)
    bytes: Mapped[int] = mapped_column(BigInteger, default=0)


class InstanceDataset(Base):
    """A dataset mounted by an instance at /data/NAME, resolved to a version at create time."""

    __tablename__ = "instance_datasets"
    __table_args__ = (UniqueConstraint("instance_id", "name"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    instance_id: Mapped[int] = mapped_column(ForeignKey("instances.id"), index=True)
    dataset_id: Mapped[int] = mapped_column(ForeignKey("datasets.id"), index=True)
    name: Mapped[str] = mapped_column(String(64))
    version: Mapped[int] = mapped_column(Integer)


# Metrics (services/metrics): training curves of runs, GPU samples of nodes


class MetricPoint(Base):
    """One value a run reported for one key at one step. A (run, key, step, source) is kept
    once: a runner's retry, or a TensorBoard file read twice, never duplicates a point. Its
    unique index, in that order, also serves a run's keys and each key's curve by step."""

    __tablename__ = "metric_points"
    __table_args__ = (UniqueConstraint("run_id", "key", "step", "source"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    # A run's id without a foreign key (a per-point lookup of the run): the ingest checks
    # the run once per batch, and a trigger deletes a run's points with it (migration 0018).
    run_id: Mapped[int] = mapped_column(Integer)
    key: Mapped[str] = mapped_column(String(64))
    step: Mapped[int] = mapped_column(BigInteger)
    value: Mapped[float] = mapped_column(Double)
    time: Mapped[datetime] = mapped_column(UTCDateTime)
    source: Mapped[str] = mapped_column(String(16))  # sdk | stdout | tensorboard


class GpuSample(Base):
    """A reading of one real GPU (simulated GPUs never have any), with the instance that
    held it at that moment (None: free)."""

    __tablename__ = "gpu_samples"
    __table_args__ = (
        Index("ix_gpu_samples_node_id_time", "node_id", "time"),
        Index("ix_gpu_samples_instance_id_time", "instance_id", "time"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id"))
    gpu_uuid: Mapped[str] = mapped_column(String(80))
    instance_id: Mapped[int | None] = mapped_column(ForeignKey("instances.id"))
    time: Mapped[datetime] = mapped_column(UTCDateTime)
    util_pct: Mapped[float | None] = mapped_column(Double)
    memory_used_mb: Mapped[int | None] = mapped_column(Integer)
    memory_total_mb: Mapped[int | None] = mapped_column(Integer)
    power_w: Mapped[float | None] = mapped_column(Double)
    temperature_c: Mapped[float | None] = mapped_column(Double)


# Notifications by webhook and email (services/notifications), support tickets (services/support)


class NotificationChannel(Base):
    """Where a user's notifications also go besides the console: one webhook and one email
    address at most. `kinds` None means every category of notification."""

    __tablename__ = "notification_channels"
    __table_args__ = (UniqueConstraint("user_id", "kind"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id"))
    kind: Mapped[str] = mapped_column(String(16))  # webhook | email
    target: Mapped[str] = mapped_column(String(2000))  # the URL or the email address
    # Webhooks: the HMAC-SHA256 key of the signature header; the user sees it once.
    secret: Mapped[str | None] = mapped_column(String(128))
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    kinds: Mapped[list[str] | None] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)


class NotificationDelivery(Base):
    """The outbox: one notification to one channel, until delivered or given up. A sender
    holds `lease_token` until `lease_until`, so that two servers never send it twice."""

    __tablename__ = "notification_deliveries"
    __table_args__ = (
        UniqueConstraint("notification_id", "channel_id"),
        Index("ix_notification_deliveries_status_next", "status", "next_attempt_at"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    notification_id: Mapped[int] = mapped_column(ForeignKey("notifications.id"))
    channel_id: Mapped[int] = mapped_column(ForeignKey("notification_channels.id"), index=True)
    status: Mapped[str] = mapped_column(String(16))  # pending | delivered | failed
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    last_error: Mapped[str] = mapped_column(String(500), default="")
    next_attempt_at: Mapped[datetime] = mapped_column(UTCDateTime)
    delivered_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    lease_token: Mapped[str | None] = mapped_column(String(40))
    lease_until: Mapped[datetime | None] = mapped_column(UTCDateTime)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


class SupportTicket(Base):
    __tablename__ = "support_tickets"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    subject: Mapped[str] = mapped_column(String(200))
    status: Mapped[str] = mapped_column(String(16))  # open | answered | closed
    instance_id: Mapped[int | None] = mapped_column(ForeignKey("instances.id"))
    run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id"))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)
    closed_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    owner: Mapped[User] = relationship()


class SupportMessage(Base):
    __tablename__ = "support_messages"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    ticket_id: Mapped[int] = mapped_column(ForeignKey("support_tickets.id"), index=True)
    author_id: Mapped[int] = mapped_column(ForeignKey("users.id"))
    body: Mapped[str] = mapped_column(Text)
    # The run's last lines when the renter chose to attach them.
    log_excerpt: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    author: Mapped[User] = relationship()


# Scheduled start and stop (services/instances/schedules, reconcilers/schedules)


class InstanceSchedule(Base):
    """A cron expression that starts or stops an instance, read in a time zone. next_fire_at
    is stored and moved on only when a fire is applied, so a restart neither loses nor
    repeats one."""

    __tablename__ = "instance_schedules"
    __table_args__ = (Index("ix_instance_schedules_next_fire_at", "next_fire_at"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    instance_id: Mapped[int] = mapped_column(ForeignKey("instances.id"), index=True)
    action: Mapped[str] = mapped_column(String(8))  # start | stop
    cron: Mapped[str] = mapped_column(String(120))
    timezone: Mapped[str] = mapped_column(String(64))
    next_fire_at: Mapped[datetime] = mapped_column(UTCDateTime)
    last_fired_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


# Templates users save from their instances (services/templates)


class UserTemplate(Base):
    """A user's own template: the `pip freeze` of one of their instances' venv on top of the
    built-in template it started from. status: pending (the runner has not answered yet),
    ready, failed (error says why). Used as `mine/NAME` by its owner only."""

    __tablename__ = "user_templates"
    __table_args__ = (UniqueConstraint("owner_id", "name"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    name: Mapped[str] = mapped_column(String(64))
    base_template: Mapped[str] = mapped_column(String(80))
    python: Mapped[str] = mapped_column(String(16))
    packages: Mapped[list[str]] = mapped_column(JSON)
    cuda: Mapped[str | None] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(16))  # pending | ready | failed
    error: Mapped[str | None] = mapped_column(Text)
    # The instance whose venv is frozen (the runner's task); kept for the record.
    instance_id: Mapped[int | None] = mapped_column(ForeignKey("instances.id"))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


# Hyperparameter sweeps (services/sweeps, reconcilers/sweeps)


class Sweep(Base):
    """A group of trials: one task run once per point of a search space, each trial on its
    own instance. `space` is the space as given (grid, ranges, random, seed); `metric` and
    `goal` name the best trial; with `stop_early` the median stopping rule stops trials
    that fall behind, once `min_steps` points and `min_trials` other trials allow it."""

    __tablename__ = "sweeps"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    name: Mapped[str | None] = mapped_column(String(100))
    space: Mapped[dict[str, Any]] = mapped_column(JSON)
    metric: Mapped[str | None] = mapped_column(String(64))
    goal: Mapped[str] = mapped_column(String(8), default="max")  # max | min
    stop_early: Mapped[bool] = mapped_column(Boolean, default=False)
    min_steps: Mapped[int] = mapped_column(Integer, default=5)
    min_trials: Mapped[int] = mapped_column(Integer, default=2)
    estimated_micro: Mapped[int] = mapped_column(BigInteger, default=0)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


class SweepTrial(Base):
    """One point of a sweep's space and the instance that runs it. `stop_reason` says why
    the median rule stopped it (empty: it was not)."""

    __tablename__ = "sweep_trials"
    __table_args__ = (UniqueConstraint("sweep_id", "index"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    sweep_id: Mapped[int] = mapped_column(ForeignKey("sweeps.id"), index=True)
    index: Mapped[int] = mapped_column(Integer)
    params: Mapped[dict[str, str]] = mapped_column(JSON)
    instance_id: Mapped[int] = mapped_column(ForeignKey("instances.id"), index=True)
    stopped_early_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    stop_reason: Mapped[str] = mapped_column(String(500), default="")
