"""The gpulease SDK: the one HTTP client of the project (the CLI and training scripts use it).

Importing the package loads none of its modules: each name below is imported on first use
(so the CLI's quick exec, which needs client.config and client.quickexec alone, never loads
httpx or pydantic).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpulease.client.api import GpuleaseClient
    from gpulease.client.base import InstanceRef
    from gpulease.client.config import Login, config_path, load_saved, resolve_login, save_login
    from gpulease.client.datasets import PushProgress, PushResult
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
    from gpulease.client.scan import DatasetError, scan_directory
    from gpulease.client.workdir import WorkdirArchive, pack_workdir

# Each public name and the module of gpulease.client that defines it.
_HOMES = {
    "GpuleaseClient": "api",
    "InstanceRef": "base",
    "Login": "config",
    "config_path": "config",
    "load_saved": "config",
    "resolve_login": "config",
    "save_login": "config",
    "DatasetError": "scan",
    "PushProgress": "datasets",
    "PushResult": "datasets",
    "scan_directory": "scan",
    "ApiError": "errors",
    "ClientError": "errors",
    "NotLoggedIn": "errors",
    "ServerUnreachable": "errors",
    "WorkdirError": "errors",
    "START": "runstream",
    "EndEvent": "runstream",
    "LogEvent": "runstream",
    "MetricEvent": "runstream",
    "RunStreamEvent": "runstream",
    "StatusEvent": "runstream",
    "position": "runstream",
    "WorkdirArchive": "workdir",
    "pack_workdir": "workdir",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)


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
