"""Shared fixtures: every database test runs on SQLite and on PostgreSQL."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from argon2 import PasswordHasher
from argon2.exceptions import VerifyMismatchError
from sqlalchemy import Engine, create_engine, text

from gpulease.server import security
from gpulease.server.db import make_engine, migrate
from gpulease.server.orm import Base
from pg_support import create_database, drop_database
from processes import REPO
from ray_support import ray_cluster  # noqa: F401  (one Ray cluster per session)

PG_ADMIN_URL = os.environ.get("GPULEASE_TEST_PG", "postgresql+psycopg://root@127.0.0.1:5432/test")


class _OnceEachHasher(PasswordHasher):
    """argon2 as the server uses it, run once for each password (hash) and once for each
    (hash, password) pair (verify), then answered from memory. argon2 costs about 0.15 s a
    call by design, and the suite registers and logs in thousands of users with a few
    passwords: real hashes and real verdicts, only not computed again."""

    def __init__(self) -> None:
        super().__init__()
        self.hashes: dict[str, str] = {}
        self.verdicts: dict[tuple[str, str], bool] = {}

    def hash(self, password: str | bytes, *, salt: bytes | None = None) -> str:
        if salt is not None or not isinstance(password, str):
            return super().hash(password, salt=salt)
        if password not in self.hashes:
            self.hashes[password] = super().hash(password)
        return self.hashes[password]

    def verify(self, hash: str | bytes, password: str | bytes) -> bool:
        if not isinstance(hash, str) or not isinstance(password, str):
            return super().verify(hash, password)
        key = (hash, password)
        if key not in self.verdicts:
            try:
                self.verdicts[key] = super().verify(hash, password)
            except VerifyMismatchError:
                self.verdicts[key] = False
        if not self.verdicts[key]:
            raise VerifyMismatchError
        return True


@pytest.fixture(autouse=True, scope="session")
def _argon2_once_each() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(security, "_hasher", _OnceEachHasher())
        yield


@pytest.fixture(autouse=True)
def _private_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Caches (the dataset push index) go under the test's own directory, never ~/.cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))


def _pg_available() -> bool:
    try:
        engine = create_engine(PG_ADMIN_URL)
        with engine.connect():
            pass
        engine.dispose()
        return True
    except Exception:
        return False


# One engine for each test database, kept for the session: emptying it between tests is then
# one pooled connection's work, not a new connection's.
_pg_engines: dict[str, Engine] = {}


@pytest.fixture(scope="session")
def pg_database() -> Iterator[str]:
    """A fresh PostgreSQL database for this test session, migrated, dropped at the end."""
    if not _pg_available():
        if os.environ.get("CI"):
            pytest.fail(f"PostgreSQL is not reachable at {PG_ADMIN_URL}; CI must start it")
        pytest.skip(f"PostgreSQL is not reachable at {PG_ADMIN_URL}")
    url, name = create_database(PG_ADMIN_URL, "gpulease_test")
    engine = make_engine(url)
    migrate(engine)
    engine.dispose()
    yield url
    if url in _pg_engines:
        _pg_engines.pop(url).dispose()
    drop_database(PG_ADMIN_URL, name)


def _empty_pg(url: str) -> None:
    """Every table emptied and every sequence restarted, as TRUNCATE ... RESTART IDENTITY
    would, by DELETEs from the children up: on tables of a few rows that is about 7 ms
    where a TRUNCATE of the 38 tables takes 0.3-0.4 s (it makes new files for each)."""
    engine = _pg_engines.get(url) or _pg_engines.setdefault(url, create_engine(url))
    with engine.begin() as conn:
        for table in reversed(Base.metadata.sorted_tables):
            conn.execute(text(f'DELETE FROM "{table.name}"'))
        conn.execute(text("SELECT setval(oid, 1, false) FROM pg_class WHERE relkind = 'S'"))


@pytest.fixture(scope="session")
def sqlite_migrated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One SQLite database migrated to head, copied for each test: migrating a new file
    costs about 0.1 s, copying one about a millisecond (the server's own migrate() then
    finds it at head, as after any restart)."""
    path = tmp_path_factory.mktemp("sqlite-migrated") / "gpulease.db"
    engine = make_engine(f"sqlite:///{path}")
    migrate(engine)
    engine.dispose()  # closing the last connection checkpoints the WAL into the file
    return path


@pytest.fixture(scope="session")
def digits_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """examples/digits/make_dataset.py's output (scikit-learn's digits as an ImageFolder of
    PNGs), written once per session: the script is seeded, so every run writes the same
    tree, and writing its 1,797 images costs seconds where copying them costs a fraction of
    one. Tests copy it into their own directory, never change it."""
    out = tmp_path_factory.mktemp("digits") / "data"
    subprocess.run(
        [sys.executable, str(REPO / "examples/digits/make_dataset.py"), "--out", str(out)],
        check=True,
        capture_output=True,
    )
    return out


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        shutil.copyfile(request.getfixturevalue("sqlite_migrated"), tmp_path / "gpulease.db")
        yield f"sqlite:///{tmp_path / 'gpulease.db'}"
        return
    url = request.getfixturevalue("pg_database")
    _empty_pg(url)
    yield url


@functools.cache
def _names_ray_cluster(path: Path) -> bool:
    try:
        return "ray_cluster" in path.read_text()
    except OSError:
        return False


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under pytest-xdist (`pytest -n 2`): the tests of one file run in one worker, so that a
    module's fixtures are made once, and every test on the session's Ray cluster (its file
    names ray_cluster, or it is a [ray-...] case of ON_BOTH_BACKENDS) runs in one worker, so
    that one cluster is started, not one per worker."""
    from xdist.scheduler import LoadScopeScheduling

    root = config.rootpath

    class OneRayWorker(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            if "[ray-" in nodeid or _names_ray_cluster(root / path):
                return "ray"
            return path

    return OneRayWorker(config, log)
