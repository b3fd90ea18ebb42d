"""Measuring a workspace for storage billing follows none of its links."""

from __future__ import annotations

from pathlib import Path

from gpulease.server.services.billing.storage import tree_kib


def test_a_link_to_a_big_tree_outside_is_not_measured(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "big").write_bytes(b"x" * (4 * 1024 * 1024))
    workspace = tmp_path / "workspace"
    (workspace / "sub").mkdir(parents=True)
    (workspace / "sub" / "small").write_bytes(b"y" * 8192)
    own = tree_kib(workspace)
    (workspace / "all").symlink_to(outside)
    (workspace / "sub" / "file").symlink_to(outside / "big")
    assert own >= 8
    assert tree_kib(workspace) < own + 64  # the links' own few blocks at most, not 4 MiB


def test_a_workspace_that_is_not_here_measures_nothing(tmp_path: Path) -> None:
    assert tree_kib(tmp_path / "released-or-on-another-node") == 0
    (tmp_path / "a-file").write_bytes(b"z")
    assert tree_kib(tmp_path / "a-file") == 0
