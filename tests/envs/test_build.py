"""Template environments: built once with real venv + pip, reused, rebuilt after a crash."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import pytest

from gpulease.core.templates import Template, get_template
from gpulease.envs.build import COMPLETE_MARKER, EnvBuildError, ensure_env, env_key

SIX = Template(name="six-test", description="", python="3.11", packages=("six",), cuda=None)


@pytest.fixture(scope="module")
def python_env(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[str]]:
    cache = tmp_path_factory.mktemp("envs")
    messages: list[str] = []
    env_dir = ensure_env(get_template("python"), cache, messages.append)
    return cache, env_dir, messages


def test_python_template_builds_a_working_venv(python_env: tuple[Path, Path, list[str]]) -> None:
    cache, env_dir, messages = python_env

    assert env_dir == cache / env_key(get_template("python"))
    assert (env_dir / COMPLETE_MARKER).exists()
    out = subprocess.run(
        [env_dir / "bin" / "python", "-c", "import sys, pip; print(sys.prefix)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert Path(out.stdout.strip()) == env_dir
    assert any("creating" in m for m in messages)
    assert messages[-1] == "environment python is ready"


def test_a_built_env_is_reused(python_env: tuple[Path, Path, list[str]]) -> None:
    cache, env_dir, _ = python_env
    marker_mtime = (env_dir / COMPLETE_MARKER).stat().st_mtime_ns
    messages: list[str] = []

    started = time.monotonic()
    again = ensure_env(get_template("python"), cache, messages.append)

    assert time.monotonic() - started < 0.5
    assert again == env_dir
    assert messages == []
    assert (env_dir / COMPLETE_MARKER).stat().st_mtime_ns == marker_mtime


def test_racing_builders_build_once(tmp_path: Path) -> None:
    messages: list[str] = []
    results: list[Path] = []

    def build() -> None:
        results.append(ensure_env(SIX, tmp_path, messages.append))

    threads = [threading.Thread(target=build) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert len(results) == 3 and len(set(results)) == 1
    assert sum("creating" in m for m in messages) == 1
    assert any(m.startswith("Collecting six") or "six" in m for m in messages)
    subprocess.run([results[0] / "bin" / "python", "-c", "import six"], check=True)


def test_a_crashed_build_is_rebuilt(tmp_path: Path) -> None:
    template = get_template("python")
    leftover = tmp_path / env_key(template)
    (leftover / "bin").mkdir(parents=True)
    (leftover / "half-written").write_text("crash")
    messages: list[str] = []

    env_dir = ensure_env(template, tmp_path, messages.append)

    assert env_dir == leftover
    assert not (env_dir / "half-written").exists()
    assert (env_dir / "bin" / "python").exists()
    assert (env_dir / COMPLETE_MARKER).exists()
    assert any("unfinished" in m for m in messages)


def test_a_bad_package_fails_with_pips_reason(tmp_path: Path) -> None:
    template = Template(
        name="broken", description="", python="3.11", packages=("no-such-package-zzz",), cuda=None
    )

    with pytest.raises(EnvBuildError) as caught:
        ensure_env(template, tmp_path)

    message = caught.value.message
    assert "pip install no-such-package-zzz" in message
    assert "No matching distribution found for no-such-package-zzz" in message
    assert not (tmp_path / env_key(template) / COMPLETE_MARKER).exists()


def test_a_python_the_host_lacks_is_explained(tmp_path: Path) -> None:
    template = Template(name="old", description="", python="2.1", packages=(), cuda=None)

    with pytest.raises(EnvBuildError, match="needs Python 2.1"):
        ensure_env(template, tmp_path)


class Cancelled(Exception):
    pass


def test_an_exception_from_progress_aborts_without_marking_complete(tmp_path: Path) -> None:
    def cancel(message: str) -> None:
        raise Cancelled(message)

    with pytest.raises(Cancelled):
        ensure_env(SIX, tmp_path, cancel)

    assert not (tmp_path / env_key(SIX) / COMPLETE_MARKER).exists()
