"""Dataset names and paths: what the CLI and the server both refuse."""

from __future__ import annotations

import pytest

from gpulease.core.datasets import (
    check_dataset_name,
    format_bytes,
    path_problem,
    tree_conflict,
)
from gpulease.core.errors import InvalidInput


@pytest.mark.parametrize("name", ["cat_images", "c", "imagenet-1k.v2", "a" * 64])
def test_good_names(name: str) -> None:
    assert check_dataset_name(name) == name


@pytest.mark.parametrize("name", ["", "Cats", "1k", "_x", "a" * 65, "a b", "a/b", "é", "a\n"])
def test_bad_names(name: str) -> None:
    with pytest.raises(InvalidInput, match="not a valid dataset name"):
        check_dataset_name(name)


@pytest.mark.parametrize("path", ["a", "a/b.jpg", "données/été.txt", ".hidden", "a b/c d", "…"])
def test_good_paths(path: str) -> None:
    assert path_problem(path) is None


@pytest.mark.parametrize(
    ("path", "words"),
    [
        ("", "empty"),
        ("/etc/passwd", "absolute"),
        ("..", "outside"),
        ("a/../../b", "outside"),
        ("a/./b", "'.' part"),
        ("a//b", "empty"),
        ("a/", "empty"),
        ("tab\there", "control"),
        ("esc\x1b[31m", "control"),
        ("rtl\u202etxt.exe", "control"),
        ("bad\udcff", "not UTF-8"),
        ("win\\path", "\\"),
        ("x" * 256, "longer than 255"),
    ],
)
def test_bad_paths(path: str, words: str) -> None:
    problem = path_problem(path)
    assert problem is not None and words in problem


def test_tree_conflicts() -> None:
    assert tree_conflict(["a", "b/c", "b/d"]) is None
    assert tree_conflict(["a", "a-b", "a/b"]) == "'a' is a file and also a directory holding 'a/b'"
    assert tree_conflict(["x", "x"]) == "'x' is listed twice"


def test_format_bytes() -> None:
    assert [format_bytes(n) for n in (0, 999, 1000, 10_240, 4_194_304, 1.5e9, 3e13)] == [
        "0 B",
        "999 B",
        "1 kB",
        "10.2 kB",
        "4.19 MB",
        "1.5 GB",
        "30 TB",
    ]
