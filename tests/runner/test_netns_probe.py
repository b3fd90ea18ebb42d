"""The network self-check's kept result: one namespace per boot, not one per runner start."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpulease.runner import netns


def _fail(self: netns.InstanceNetwork) -> None:
    raise netns.NetworkError("no network today")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    if (reason := netns.probe(tmp_path / "first")) is not None:
        pytest.skip(f"no instance network here: {reason}")
    return tmp_path / "netns"


def test_a_success_is_kept_for_the_boot_and_its_tools(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert netns.probe(root) is None
    mark = root / netns.PROBE_MARK
    assert mark.stat().st_mode & 0o777 == 0o600 and root.stat().st_mode & 0o777 == 0o700
    assert "boot " in mark.read_text() and "slirp4netns " in mark.read_text()
    monkeypatch.setattr(netns.InstanceNetwork, "ensure", _fail)
    assert netns.probe(root) is None  # answered from the mark: no network made
    assert [p.name for p in root.iterdir()] == [netns.PROBE_MARK]


def test_a_mark_of_another_boot_or_tool_is_not_trusted(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert netns.probe(root) is None
    mark = root / netns.PROBE_MARK
    mark.write_text(mark.read_text().replace("boot ", "boot 0"))
    monkeypatch.setattr(netns.InstanceNetwork, "ensure", _fail)
    assert netns.probe(root) == "no network today"
    assert "boot 0" in mark.read_text()  # a failure never writes the mark


def test_a_failure_is_never_kept(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(netns.InstanceNetwork, "ensure", _fail)
    assert netns.probe(root) == "no network today"
    monkeypatch.undo()
    assert not (root / netns.PROBE_MARK).exists()
    assert netns.probe(root) is None
