"""The node cache's marks (runner/version_marks.py) where the server is not needed."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpulease.runner import version_marks


def test_a_version_from_before_marks_is_used_even_where_it_cannot_be_marked(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A cache where .marks cannot be made (here a file holds its name) keeps serving the
    versions it had, as before marks were kept, and says why it could not mark them."""
    (tmp_path / "1-2-v3").mkdir()
    (tmp_path / version_marks.MARKS).write_text("not a directory")
    assert version_marks.usable(tmp_path, "1-2-v3")
    assert "could not mark dataset version 1-2-v3" in caplog.text


def test_the_boot_id_is_the_kernels_and_none_where_there_is_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    found = version_marks.boot_id()
    assert found is not None and len(found) == 36 and found.count("-") == 4
    monkeypatch.setattr(version_marks, "BOOT_ID", tmp_path / "absent")
    assert version_marks.boot_id() is None
    # without a boot id, a version marked built is not known to be this boot's: it is
    # fetched again rather than trusted
    (tmp_path / "1-2-v3").mkdir()
    version_marks.mark_built(tmp_path, "1-2-v3")
    assert (tmp_path / ".marks" / "1-2-v3").read_text() == "built unknown\n"
    assert version_marks.state(tmp_path, "1-2-v3") == "suspect"
