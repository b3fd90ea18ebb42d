"""One typed Settings object, read from GPULEASE_* environment variables and validated at start."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from gpulease.core.money import parse_credits

WEAK_PASSWORDS = {"admin", "password", "changeme", "changethis", "gpulease"}


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GPULEASE_", extra="ignore")

    environment: Literal["development", "production"] = "development"
    home: Path = Field(default_factory=lambda: Path.home() / ".gpulease")
    database_url: str | None = None
    host: str = "127.0.0.1"
    port: int = 8420
    # The address runners use to reach the server; defaults to http://host:port.
    public_url: str | None = None

    admin_name: str = "admin"
    # None: a random password is generated at the first start and printed once.
    admin_password: SecretStr | None = None
    signup_enabled: bool = True
    signup_credit: str = "10.00"
    # An instance must be able to pay this many minutes at its rate to start.
    min_start_minutes: int = 10

    pricing_file: Path | None = None
    simulated_gpus: str = ""
    env_cache: Path | None = None

    # local: runners on this host. ray: on the nodes of the Ray cluster at RAY_ADDRESS
    # (docs/ray.md); this host then offers no GPUs of its own.
    backend: Literal["local", "ray"] = "local"
    ray_address: str | None = None
    ray_namespace: str = "gpulease"
    # On every Ray node: the directory under which it keeps workspaces, runners' files,
    # environments and dataset caches, one folder per node name.
    ray_node_home: Path = Path("/var/lib/gpulease-node")
    # The job fabric's IPv4 range (docs/ray.md): each rank of a multi-node run gets an
    # address in it, on a macvlan of its node's GPULEASE_FABRIC_PARENT. None: no fabric.
    fabric_cidr: str | None = None
    node_name: str | None = None
    tick_interval_s: float = 1.0
    heartbeat_interval_s: float = 2.0
    # A runner silent for this long whose process is gone marks its instance failed.
    heartbeat_timeout_s: float = 15.0
    stop_grace_s: float = 20.0
    # On a fleet backend (Ray): a running instance's workspace is saved to the server this
    # often (only what changed, at low priority; 0: only at stop), so that an instance
    # whose node dies starts elsewhere from that copy (docs/ray.md).
    workspace_save_interval_s: float = Field(default=600.0, ge=0)
    # A stopping runner saving its workspace (billing already ended) is killed only after
    # this long, measured from when its jobs ended, in place of stop_grace_s.
    workspace_save_max_s: float = Field(default=3600.0, gt=0)
    # A preempted spot instance's job gets this long after SIGTERM to checkpoint
    # (runner/preempt.py) before it is killed and its GPUs go to the request that needs them.
    preempt_grace_s: float = Field(default=30.0, ge=0, le=3600)
    # Running instances are charged every this many seconds (and to the second when they
    # stop); a balance may lag that much behind the meter.
    billing_step_s: int = 30

    # Billing. The operator's time zone places off-peak windows and statement days.
    timezone: str = "UTC"
    # Override the pricing file's currency symbol and name.
    currency_symbol: str | None = None
    currency_name: str | None = None
    # Workspaces and datasets cost this much per GB (GiB) per day, also while stopped.
    storage_price_gb_day: str = "0.003"
    storage_meter_interval_s: float = 300.0
    # A stopped instance is released (workspace deleted) after this many days, with notices
    # this many days before.
    stopped_release_days: int = 15
    release_warning_days: str = "3,1"
    # Warn a user whose balance falls below this many minutes of their current spend
    # (unless they set their own threshold amount).
    low_balance_minutes: int = 60
    session_days: int = 14
    # Prometheus: when set, GET /metrics needs 'Authorization: Bearer TOKEN'.
    metrics_token: SecretStr | None = None

    # Automatic stop: the longest idle time (minutes) a renter may allow before an
    # idle instance is stopped; instances without their own setting get it. None: no ceiling.
    idle_stop_max_minutes: int | None = Field(default=None, ge=1)
    # GPU samples (5 s per GPU: 17,280 rows a GPU a day) older than this are deleted. Metric
    # points of runs are never deleted: they are the user's results.
    gpu_sample_retention_days: int = Field(default=30, ge=1, le=3650)

    # Datasets: storage quota, the master key, the blob store, the node's cache.
    # Each user may keep this many GB (10^9 bytes) of distinct dataset content.
    storage_quota_gb: float = Field(default=50.0, ge=0)
    # The key that wraps every dataset key; made (mode 0600) at the first start. Keep it out
    # of database backups' reach: whoever has both reads every dataset.
    master_key_file: Path | None = None
    blob_store: Literal["fs", "s3"] = "fs"
    blob_dir: Path | None = None  # fs: default HOME/blobs
    s3_bucket: str | None = None
    s3_prefix: str = ""
    s3_endpoint_url: str | None = None  # MinIO, Ceph, Garage...; None: AWS
    s3_region: str | None = None
    # Where runners materialise dataset versions on a node, shared by its instances.
    dataset_cache: Path | None = None

    # Sandbox and transport security (bubblewrap, HTTPS; backups read these too).
    # Jobs run in a bubblewrap sandbox; a server without a usable bwrap refuses to start
    # unless this is set, and then jobs run UNSANDBOXED with the server's own rights (they
    # can read its database and keys): sign-up is forced off, for one trusted user only.
    unsandboxed_single_user: bool = False
    # Instance N's jobs run as host uid SANDBOX_UID_BASE + N, an account that owns nothing
    # (runner/sandbox.py); give each server on one host a range of its own.
    sandbox_uid_base: int = Field(default=2_000_000_000, ge=1000, le=2**32 - 3)
    # HTTPS with the operator's certificate (PEM, chain included) and its key...
    tls_cert: Path | None = None
    tls_key: Path | None = None
    # ...or with a self-signed certificate made at the first start under HOME/tls, whose
    # fingerprint the CLI pins at the first login.
    tls_self_signed: bool = False

    # Notifications by email: sent only when SMTP_HOST is set. STARTTLS is used on
    # any port but 465 (TLS from the start there) unless SMTP_STARTTLS=false.
    smtp_host: str | None = None
    smtp_port: int = 587
    smtp_username: str | None = None
    smtp_password: SecretStr | None = None
    smtp_from: str | None = None
    smtp_starttls: bool = True
    # Webhook and email deliveries: tries before giving up (waits double from 30 s: 8 tries
    # span about an hour), and the time one try may take.
    notify_max_attempts: int = Field(default=8, ge=1, le=20)
    notify_timeout_s: float = Field(default=10.0, gt=0, le=60)
    # Webhooks may target loopback, private (RFC 1918, CGNAT, fc00::/7) and link-local
    # addresses only when this is set (an intranet receiver); metadata addresses never.
    webhook_allow_private: bool = False

    # JupyterLab runs on an origin of its own, one host per instance: <id>.JUPYTER_DOMAIN
    # (a wildcard DNS name and certificate; scheme and port follow the console's public
    # URL). It never receives the console's cookie. *.localhost resolves to loopback in
    # browsers, so the default works for a server on this machine.
    jupyter_domain: str = "jupyter.localhost"

    # Guessing: failed logins per account and per client address, registrations per address,
    # wrong bearer tokens per address and per token they begin like, within a sliding
    # window (counted in the database, shared by every replica).
    auth_window_s: int = Field(default=900, ge=1)
    login_failures_per_account: int = Field(default=10, ge=1)
    login_failures_per_address: int = Field(default=30, ge=1)
    registrations_per_address: int = Field(default=10, ge=1)
    token_failures_per_address: int = Field(default=30, ge=1)
    token_failures_per_token: int = Field(default=10, ge=1)

    @model_validator(mode="after")
    def _enforce_safe_defaults(self) -> Settings:
        parse_credits(self.signup_credit)  # fails start-up on a malformed amount
        parse_credits(self.storage_price_gb_day)
        _zone, _warnings = self.tz, self.release_warnings  # both raise on bad values
        if self.environment == "production":
            pw = self.admin_password.get_secret_value() if self.admin_password else None
            if pw is not None and (pw.lower() in WEAK_PASSWORDS or len(pw) < 12):
                raise ValueError(
                    "GPULEASE_ADMIN_PASSWORD is weak; outside development use 12+ characters "
                    "or leave it unset to have one generated"
                )
            if self.simulated_gpus:
                raise ValueError(
                    "GPULEASE_SIMULATED_GPUS is for development and tests; unset it in production"
                )
        return self

    @property
    def db_url(self) -> str:
        return self.database_url or f"sqlite:///{self.home / 'gpulease.db'}"

    @property
    def runner_url(self) -> str:
        if self.public_url:
            return self.public_url.rstrip("/")
        host = "127.0.0.1" if self.host in {"0.0.0.0", "::"} else self.host
        scheme = "https" if self.tls_enabled else "http"
        return f"{scheme}://{host}:{self.port}"

    @property
    def pricing_path(self) -> Path:
        return self.pricing_file or self.home / "pricing.yaml"

    @property
    def envs_path(self) -> Path:
        return self.env_cache or self.home / "envs"

    @property
    def workspaces_path(self) -> Path:
        return self.home / "workspaces"

    @property
    def runners_path(self) -> Path:
        return self.home / "runners"

    @property
    def uploads_path(self) -> Path:
        return self.home / "uploads"

    @property
    def signup_credit_micro(self) -> int:
        return parse_credits(self.signup_credit)

    @property
    def tz(self) -> ZoneInfo:
        try:
            return ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(
                f"GPULEASE_TIMEZONE={self.timezone!r} is not a time zone; use e.g. Asia/Shanghai"
            ) from None

    @property
    def release_warnings(self) -> list[int]:
        try:
            days = sorted({int(d) for d in self.release_warning_days.split(",") if d.strip()})
        except ValueError:
            raise ValueError("GPULEASE_RELEASE_WARNING_DAYS must be days like 3,1") from None
        return [d for d in days if 0 < d < self.stopped_release_days]

    @property
    def storage_price_micro(self) -> int:
        return parse_credits(self.storage_price_gb_day)

    @model_validator(mode="after")
    def _check_dataset_storage(self) -> Settings:
        if self.blob_store == "s3" and not self.s3_bucket:
            raise ValueError("GPULEASE_BLOB_STORE=s3 needs GPULEASE_S3_BUCKET")
        return self

    @property
    def storage_quota_bytes(self) -> int:
        return int(self.storage_quota_gb * 1_000_000_000)

    @property
    def master_key_path(self) -> Path:
        return self.master_key_file or self.home / "keys" / "master.key"

    @property
    def blobs_path(self) -> Path:
        return self.blob_dir or self.home / "blobs"

    @property
    def dataset_cache_path(self) -> Path:
        return self.dataset_cache or self.home / "datasets"

    @model_validator(mode="after")
    def _check_sandbox_and_tls(self) -> Settings:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("GPULEASE_TLS_CERT and GPULEASE_TLS_KEY go together: set both")
        if self.tls_cert is not None and self.tls_self_signed:
            raise ValueError(
                "GPULEASE_TLS_SELF_SIGNED and GPULEASE_TLS_CERT exclude each other; "
                "use your certificate or a generated one"
            )
        if self.unsandboxed_single_user:
            self.signup_enabled = False  # nobody else may get an account on such a server
        return self

    @property
    def tls_enabled(self) -> bool:
        return self.tls_self_signed or self.tls_cert is not None

    @property
    def tls_path(self) -> Path:
        """Where the self-signed certificate and its key live."""
        return self.home / "tls"

    @property
    def smtp_configured(self) -> bool:
        return bool(self.smtp_host)

    @model_validator(mode="after")
    def _check_fabric(self) -> Settings:
        if self.fabric_cidr is None:
            return self
        try:
            network = ipaddress.IPv4Network(self.fabric_cidr)
        except ValueError as exc:
            raise ValueError(
                f"GPULEASE_FABRIC_CIDR={self.fabric_cidr!r} is not an IPv4 network ({exc}); "
                "give one such as 10.213.0.0/16, its host bits zero"
            ) from exc
        if network.prefixlen > 30:
            raise ValueError("GPULEASE_FABRIC_CIDR must hold at least 2 addresses: /30 or wider")
        return self

    @model_validator(mode="after")
    def _check_smtp(self) -> Settings:
        if self.smtp_host and not self.smtp_from:
            raise ValueError(
                "GPULEASE_SMTP_HOST needs GPULEASE_SMTP_FROM, the sender address of notices"
            )
        if (self.smtp_username is None) != (self.smtp_password is None):
            raise ValueError("GPULEASE_SMTP_USERNAME and GPULEASE_SMTP_PASSWORD go together")
        return self
