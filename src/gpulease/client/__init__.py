"""The gpulease SDK: the one HTTP client of the project (the CLI and training scripts use it)."""

from gpulease.client.api import GpuleaseClient
from gpulease.client.base import InstanceRef
from gpulease.client.config import Login, config_path, load_saved, resolve_login, save_login
from gpulease.client.datasets import DatasetError, PushProgress, PushResult, scan_directory
from gpulease.client.errors import (
    ApiError,
    ClientError,
    NotLoggedIn,
    ServerUnreachable,
    WorkdirError,
)
from gpulease.client.runstream import (
    START,
    EndEvent,
    LogEvent,
    MetricEvent,
    RunStreamEvent,
    StatusEvent,
    position,
)
from gpulease.client.workdir import WorkdirArchive, pack_workdir

__all__ = [
    "START",
    "ApiError",
    "ClientError",
    "DatasetError",
    "EndEvent",
    "GpuleaseClient",
    "InstanceRef",
    "LogEvent",
    "Login",
    "MetricEvent",
    "NotLoggedIn",
    "PushProgress",
    "PushResult",
    "RunStreamEvent",
    "ServerUnreachable",
    "StatusEvent",
    "WorkdirArchive",
    "WorkdirError",
    "config_path",
    "load_saved",
    "pack_workdir",
    "position",
    "resolve_login",
    "save_login",
    "scan_directory",
]
