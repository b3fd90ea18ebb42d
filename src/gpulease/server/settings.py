"""One typed Settings object, read from GPULEASE_* environment variables and validated at start."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

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

    backend: Literal["local"] = "local"
    node_name: str | None = None
    tick_interval_s: float = 1.0
    heartbeat_interval_s: float = 2.0
    # A runner silent for this long whose process is gone marks its instance failed.
    heartbeat_timeout_s: float = 15.0
    stop_grace_s: float = 20.0
    # Running instances are charged every this many seconds (and to the second when they
    # stop); a balance may lag that much behind the meter.
    billing_step_s: int = 30
    session_days: int = 14

    @model_validator(mode="after")
    def _enforce_safe_defaults(self) -> Settings:
        parse_credits(self.signup_credit)  # fails start-up on a malformed amount
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
        return f"http://{host}:{self.port}"

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
