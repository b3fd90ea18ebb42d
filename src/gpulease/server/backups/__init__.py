"""Backups of a server: a consistent, verified snapshot of its database and data directory."""

from gpulease.server.backups.progress import Step, no_progress
from gpulease.server.backups.snapshot import (
    BackupError,
    BackupSummary,
    RestoreSummary,
    create_backup,
    read_manifest,
    restore_backup,
    verify_backup,
)

__all__ = [
    "BackupError",
    "BackupSummary",
    "RestoreSummary",
    "Step",
    "create_backup",
    "no_progress",
    "read_manifest",
    "restore_backup",
    "verify_backup",
]
