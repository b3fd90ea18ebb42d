"""The gpulease SDK: the one HTTP client of the project (the CLI and training scripts use it)."""

from gpulease.client.api import GpuleaseClient, InstanceRef
from gpulease.client.config import Login, config_path, load_saved, resolve_login, save_login
from gpulease.client.datasets import DatasetError, PushProgress, PushResult, scan_directory
from gpulease.client.errors import (
    ApiError,
    ClientError,
    NotLoggedIn,
    ServerUnreachable,
    WorkdirError,
)
from gpulease.client.logstream import EndEvent, LogEvent, LogStreamEvent, StatusEvent
from gpulease.client.workdir import WorkdirArchive, pack_workdir

__all__ = [
    "ApiError",
    "ClientError",
    "DatasetError",
    "EndEvent",
    "GpuleaseClient",
    "InstanceRef",
    "LogEvent",
    "LogStreamEvent",
    "Login",
    "NotLoggedIn",
    "PushProgress",
    "PushResult",
    "ServerUnreachable",
    "StatusEvent",
    "WorkdirArchive",
    "WorkdirError",
    "config_path",
    "load_saved",
    "pack_workdir",
    "resolve_login",
    "save_login",
    "scan_directory",
]
