"""Fixtures for the SDK tests: the real server app in process (see inprocess.py)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # also under --import-mode=importlib

from inprocess import server, template_home  # noqa: E402,F401  (fixtures)
