"""Metrics from training code: `from gpulease import track; track.log(step=10, loss=0.5)`.

Standard library only: the runner copies this file into every instance, whose venv need
not have gpulease installed. Inside gpulease the runner sets GPULEASE_METRICS_FILE and
each call appends one JSON line there, `{"step": 10, "time": 1700000000.5, "values":
{"loss": 0.5}}`, which the runner sends to the server. Outside gpulease a call does
nothing (no file, no network), unless GPULEASE_TRACK_FILE names a file to append the same
lines to. A call never raises: a bad key or value (not a number, NaN, infinite) is left
out with one warning on stderr. See docs/metrics.md.

`preempted()` says whether the instance (a spot one) has been preempted: its runner set the
notice GPULEASE_PREEMPT_NOTICE_FILE names before sending SIGTERM, and the job has the
grace period (30 s by default) to save a checkpoint and exit. See docs/scheduler.md.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import sys
import threading
import time
from typing import Any

__all__ = ["log", "preempted"]

METRICS_FILE_VARIABLE = "GPULEASE_METRICS_FILE"  # set by the runner
LOCAL_FILE_VARIABLE = "GPULEASE_TRACK_FILE"  # optional, outside gpulease
PREEMPT_NOTICE_VARIABLE = "GPULEASE_PREEMPT_NOTICE_FILE"  # set by the runner
KEY_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_./-]{0,63}$")

_lock = threading.Lock()
_warned: set[str] = set()
_fd: int | None = None
_fd_path: str | None = None


def _warn(problem: str, text: str) -> None:
    """One warning per problem on stderr; never an exception."""
    if problem in _warned:
        return
    _warned.add(problem)
    try:
        sys.stderr.write(f"gpulease.track: {text}\n")
        sys.stderr.flush()
    except Exception:  # a closed stderr must not break training
        pass


def _number(key: str, value: Any) -> float | None:
    if isinstance(value, (bool, str, bytes)):
        _warn(f"type:{key}", f"{key}={value!r} is not a number; it is left out")
        return None
    try:
        if hasattr(value, "item") and not isinstance(value, (int, float)):
            value = value.item()  # a NumPy scalar or a one-element tensor
        number = float(value)
    except Exception:
        _warn(f"type:{key}", f"{key}={value!r} is not a number; it is left out")
        return None
    if not math.isfinite(number):
        _warn(f"finite:{key}", f"{key}={number} is not finite; such values are left out")
        return None
    return number


def _target() -> str | None:
    return os.environ.get(METRICS_FILE_VARIABLE) or os.environ.get(LOCAL_FILE_VARIABLE) or None


def _write(path: str, line: str) -> None:
    """Append line with one write() on an O_APPEND descriptor, kept open between calls."""
    global _fd, _fd_path
    if _fd is None or _fd_path != path:
        if _fd is not None:
            with contextlib.suppress(OSError):
                os.close(_fd)
        _fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        _fd_path = path
    data = line.encode("utf-8")
    while data:
        written = os.write(_fd, data)
        data = data[written:]


def log(step: int | None = None, **values: Any) -> None:
    """Record metric values at a training step: `log(10, loss=0.5, acc=0.9)`.

    step: a non-negative integer; without one each key counts its own steps (0, 1, …).
    Keys match [A-Za-z_][A-Za-z0-9_./-]{0,63}; values are numbers (int, float, NumPy or
    one-element tensors). What is not valid is left out with one warning on stderr.
    """
    try:
        _log(step, values)
    except Exception as exc:  # the promise: never break the caller's training
        _warn(f"error:{type(exc).__name__}", f"metrics not recorded: {exc}")


def _log(step: Any, values: dict[str, Any]) -> None:
    path = _target()
    if path is None:
        return
    if step is not None:
        if hasattr(step, "item") and not isinstance(step, int):
            step = step.item()
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            if isinstance(step, float) and step.is_integer() and step >= 0:
                step = int(step)
            else:
                _warn("step", f"step={step!r} is not a non-negative integer; counting steps")
                step = None
    good: dict[str, float] = {}
    for key, value in values.items():
        if not KEY_PATTERN.match(key):
            _warn(f"key:{key}", f"metric name {key!r} is not valid; it is left out")
            continue
        number = _number(key, value)
        if number is not None:
            good[key] = number
    if not good:
        return
    line = json.dumps({"step": step, "time": time.time(), "values": good}) + "\n"
    with _lock:
        try:
            _write(path, line)
        except OSError as exc:
            _warn("write", f"metrics cannot be written to {path}: {exc}")


def preempted() -> bool:
    """Whether this instance has been preempted: save a checkpoint now and exit, the instance
    is queued again and its run restarts there (in the same workspace) when GPUs free up.
    Cheap enough to call every step; False outside gpulease and before any notice."""
    path = os.environ.get(PREEMPT_NOTICE_VARIABLE)
    if not path:
        return False
    try:
        return os.path.isfile(path)
    except (OSError, ValueError):
        return False
