"""Dataset names and the paths inside a dataset: the rules the CLI and the server share."""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections.abc import Iterable, Sequence

from gpulease.core.errors import InvalidInput

NAME_RE = re.compile(r"^[a-z][a-z0-9_.-]{0,63}$")
MAX_PATH_CHARS = 4096
MAX_PART_BYTES = 255  # what Linux allows for one file name


def check_dataset_name(name: str) -> str:
    if not NAME_RE.fullmatch(name):
        raise InvalidInput(
            f"{name!r} is not a valid dataset name: use 1-64 lowercase letters, digits, '_', "
            "'.' and '-', starting with a letter (it becomes the directory /data/NAME)"
        )
    return name


def path_problem(path: str) -> str | None:
    """Why path cannot be a file of a dataset, or None when it can. Paths are relative,
    '/'-separated, without '.', '..', empty parts or control characters."""
    if not path:
        return "the path is empty"
    if len(path) > MAX_PATH_CHARS:
        return f"the path is longer than {MAX_PATH_CHARS} characters"
    plain = path.isascii() and path.isprintable() and "\\" not in path  # checked in C
    for char in () if plain else path:
        if unicodedata.category(char) in ("Cc", "Cf", "Cs", "Zl", "Zp") or char == "\\":
            return f"it contains the character {char!r} (a control character, not UTF-8, or \\)"
    if path.startswith("/"):
        return "it is an absolute path"
    parts = path.split("/")
    if ".." in parts:
        return "it points outside the dataset with '..'"
    if "" in parts or "." in parts:
        return "it has an empty or '.' part"
    # An ASCII part has as many bytes as characters (100,000 paths a push: no encoding).
    longest = max(map(len, parts)) if plain else max(len(part.encode()) for part in parts)
    if longest > MAX_PART_BYTES:
        return f"a part of it is longer than {MAX_PART_BYTES} bytes"
    return None


def check_path(path: str) -> str:
    problem = path_problem(path)
    if problem:
        raise InvalidInput(f"refused file path {path!r}: {problem}")
    return path


def tree_conflict(paths: list[str]) -> str | None:
    """A path given twice, or one that is both a file and a directory of another ('a' and
    'a/b'); None when the paths make a tree."""
    files: set[str] = set()
    for path in paths:
        if path in files:
            return f"{path!r} is listed twice"
        files.add(path)
    for path in paths:
        parts = path.split("/")
        for end in range(1, len(parts)):
            directory = "/".join(parts[:end])
            if directory in files:
                return f"{directory!r} is a file and also a directory holding {path!r}"
    return None


def format_bytes(count: int | float) -> str:
    """Sizes for people, in SI units as disks and quotas are sold: '812 B', '10.2 kB',
    '4.19 MB', '1.07 GB'."""
    value = float(count)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(value) < 1000 or unit == "TB":
            if unit == "B":
                return f"{int(value)} B"
            return f"{value:.3g} {unit}" if value < 100 else f"{value:.0f} {unit}"
        value /= 1000
    raise AssertionError("not reached")


def manifest_digest(files: Iterable[tuple[str, int, Sequence[str]]]) -> str:
    """The SHA-256 (hex) that names a version's content: its (path, size, chunk hashes), in
    path order. Client and server compute it alike, so that a push of a tree the server
    already holds as the current version is one comparison of two digests."""
    digest = hashlib.sha256()
    lines = [f"{path}\0{size}\0{','.join(chunks)}\n" for path, size, chunks in files]
    digest.update("".join(lines).encode())
    return digest.hexdigest()
