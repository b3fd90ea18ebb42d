"""Backup and restore: a snapshot survives wiping the data directory and the database."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, MetaData, select
from typer.testing import CliRunner

from factories import Caller, RunnerDouble
from gpulease.cli.main import app
from gpulease.server.backups import BackupError, create_backup, read_manifest, restore_backup
from gpulease.server.backups.database import database_is_empty, decode, drop_everything, encode
from gpulease.server.db import make_engine, migrate
from gpulease.server.runtime import Runtime
from gpulease.server.settings import Settings


def table_rows(engine: Engine) -> dict[str, list[dict[str, Any]]]:
    """Every row of every table, in primary key order."""
    metadata = MetaData()
    with engine.connect() as conn:
        metadata.reflect(bind=conn)
        return {
            table.name: [
                dict(row)
                for row in conn.execute(
                    select(table).order_by(*table.primary_key.columns)
                ).mappings()
            ]
            for table in metadata.sorted_tables
        }


def files_under(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def wipe(settings: Settings) -> None:
    """Lose everything: the data directory and every table of the database."""
    shutil.rmtree(settings.home)
    engine = make_engine(settings.db_url)
    try:
        drop_everything(engine)
        assert database_is_empty(engine)
    finally:
        engine.dispose()


@pytest.fixture
def engine(settings: Settings, rt: Runtime) -> Iterator[Engine]:
    """An engine of its own; afterwards the schema is whole again for the next tests."""
    rt.engine.dispose()
    engine = make_engine(settings.db_url)
    yield engine
    engine.dispose()
    repair = make_engine(settings.db_url)
    migrate(repair)
    repair.dispose()


@pytest.fixture
def busy_server(
    settings: Settings,
    rt: Runtime,
    ann: Caller,
    admin: Caller,
    tick: Callable[[], None],
    runner_for: Callable[[int], RunnerDouble],
) -> dict[str, Path]:
    """Credit, one stopped instance with files in its workspace, one running, and blobs."""
    assert admin.post("/api/v1/admin/grants", json={"user": "ann", "amount": "25.00"}).is_success
    stopped = ann.post("/api/v1/instances", json={"gpu": "T4:1", "name": "kept"}).json()
    running = ann.post("/api/v1/instances", json={"gpu": "A100-80GB:1", "name": "busy"}).json()
    tick()
    for instance in (stopped, running):
        runner_for(instance["id"]).ready()
        (settings.workspaces_path / str(instance["id"])).mkdir(parents=True, exist_ok=True)
    kept = settings.workspaces_path / str(stopped["id"])
    (kept / "model.pt").write_bytes(bytes(range(256)) * 64)
    (kept / "sub").mkdir()
    (kept / "sub" / "notes.txt").write_text("epoch 3 was best")
    (settings.workspaces_path / str(running["id"]) / "live.log").write_text("changing")
    assert ann.post("/api/v1/instances/kept/stop").is_success
    runner_for(stopped["id"]).stopped()
    blob = settings.blobs_path / "ab" / "abcdef0123"
    blob.parent.mkdir(parents=True, exist_ok=True)
    blob.write_bytes(b"\x00encrypted chunk\xff" * 100)
    return {"kept": kept, "running": settings.workspaces_path / str(running["id"])}


def test_backup_wipe_restore_gives_identical_rows_and_files(
    settings: Settings, engine: Engine, busy_server: dict[str, Path], tmp_path: Path
) -> None:
    rows_before = table_rows(engine)
    assert rows_before["ledger_entries"], "the scenario must have ledger rows"
    blobs_before = files_under(settings.blobs_path)
    kept_before = files_under(busy_server["kept"])
    pricing_before = settings.pricing_path.read_bytes()

    summary = create_backup(settings, tmp_path / "backup")
    manifest = read_manifest(tmp_path / "backup")
    assert manifest["keys_included"] is False
    assert "database/ledger_entries.jsonl.gz" in manifest["files"]
    assert summary.workspaces == [int(busy_server["kept"].name)]
    assert summary.skipped_workspaces == {int(busy_server["running"].name): "running"}

    engine.dispose()
    wipe(settings)
    result = restore_backup(settings, tmp_path / "backup")

    assert table_rows(engine) == rows_before
    assert files_under(settings.blobs_path) == blobs_before
    assert files_under(busy_server["kept"]) == kept_before
    assert not busy_server["running"].exists()
    assert settings.pricing_path.read_bytes() == pricing_before
    assert not settings.runners_path.exists()  # runner state is not restored
    if manifest["master_key_sha256"]:
        assert not result.keys_restored
        assert any("master key" in warning for warning in result.warnings)


def test_a_damaged_backup_is_refused_before_anything_is_touched(
    settings: Settings, engine: Engine, busy_server: dict[str, Path], tmp_path: Path
) -> None:
    backup = tmp_path / "backup"
    create_backup(settings, backup)
    engine.dispose()
    wipe(settings)
    dump = backup / "database" / "ledger_entries.jsonl.gz"
    data = bytearray(dump.read_bytes())
    data[len(data) // 2] ^= 0x01
    dump.write_bytes(bytes(data))

    with pytest.raises(BackupError, match="damaged: database/ledger_entries.jsonl.gz"):
        restore_backup(settings, backup)
    assert not settings.home.exists()
    assert database_is_empty(engine)

    (backup / "blobs.tar").unlink()
    with pytest.raises(BackupError, match="is missing"):
        restore_backup(settings, backup)
    (backup / "manifest.json").unlink()
    with pytest.raises(BackupError, match="no manifest.json"):
        restore_backup(settings, backup)


def test_restore_over_existing_data_needs_force(
    settings: Settings, engine: Engine, busy_server: dict[str, Path], tmp_path: Path
) -> None:
    rows_before = table_rows(engine)
    create_backup(settings, tmp_path / "backup")
    with pytest.raises(BackupError, match="refusing to restore over existing data"):
        restore_backup(settings, tmp_path / "backup")
    with pytest.raises(BackupError, match="not an empty directory"):
        create_backup(settings, tmp_path / "backup")

    (busy_server["kept"] / "model.pt").write_text("overwritten later")
    engine.dispose()
    restore_backup(settings, tmp_path / "backup", force=True)
    assert table_rows(engine) == rows_before
    assert (busy_server["kept"] / "model.pt").read_bytes() == bytes(range(256)) * 64


def test_the_cli_backs_up_with_keys_and_restores(
    settings: Settings,
    engine: Engine,
    busy_server: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GPULEASE_HOME", str(settings.home))
    monkeypatch.setenv("GPULEASE_DATABASE_URL", settings.db_url)
    settings.master_key_path.parent.mkdir(parents=True, exist_ok=True)
    if not settings.master_key_path.exists():
        settings.master_key_path.write_bytes(b"k" * 32)
    key = settings.master_key_path.read_bytes()
    rows_before = table_rows(engine)
    engine.dispose()

    made = CliRunner().invoke(app, ["backup", str(tmp_path / "backup"), "--include-keys"])
    assert made.exit_code == 0, made.output
    assert "backup written to" in made.stdout
    assert "contain the master key" in made.stderr
    assert "workspace of instance" in made.stderr and "running" in made.stderr

    refused = CliRunner().invoke(app, ["restore", str(tmp_path / "backup")])
    assert refused.exit_code == 1
    assert refused.stderr.startswith("error: refusing to restore over existing data")

    wipe(settings)
    restored = CliRunner().invoke(app, ["restore", str(tmp_path / "backup")])
    assert restored.exit_code == 0, restored.output
    assert "(keys included)" in restored.stdout
    assert "warning" not in restored.stderr
    assert settings.master_key_path.read_bytes() == key
    assert settings.master_key_path.stat().st_mode & 0o777 == 0o600
    assert table_rows(engine) == rows_before


def test_the_manifest_keeps_no_secrets(settings: Settings, engine: Engine, tmp_path: Path) -> None:
    create_backup(settings, tmp_path / "backup")
    text = (tmp_path / "backup" / "manifest.json").read_text()
    assert "admin-password-1" not in text
    manifest = json.loads(text)
    assert "admin_password" not in manifest["source"]["settings"]
    assert manifest["database"]["dialect"] in {"sqlite", "postgresql"}


@pytest.mark.parametrize(
    "value",
    [None, True, 3, 2.5, "text", b"\x00\xffbytes", {"a": [1, 2]}, [1, "x"]],
)
def test_values_survive_the_dump_encoding(value: object) -> None:
    assert decode(json.loads(json.dumps(encode(value)))) == value


def test_a_restore_into_another_data_directory_moves_workspace_paths(
    settings: Settings, engine: Engine, busy_server: dict[str, Path], tmp_path: Path
) -> None:
    create_backup(settings, tmp_path / "backup")
    engine.dispose()
    wipe(settings)
    sqlite = settings.db_url.startswith("sqlite")
    moved = settings.model_copy(
        update={
            "home": tmp_path / "new-home",
            "database_url": f"sqlite:///{tmp_path / 'new-home' / 'gpulease.db'}"
            if sqlite
            else settings.database_url,
        }
    )
    restore_backup(moved, tmp_path / "backup")

    kept = moved.workspaces_path / busy_server["kept"].name
    assert (kept / "sub" / "notes.txt").read_text() == "epoch 3 was best"
    restored = make_engine(moved.db_url)
    try:
        workspaces = {row["workspace"] for row in table_rows(restored)["instances"]}
    finally:
        restored.dispose()
    assert str(kept) in workspaces
    assert not any(str(settings.home) in path for path in workspaces if path)
