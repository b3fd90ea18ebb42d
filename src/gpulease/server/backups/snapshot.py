"""`gpulease backup` and `gpulease restore`: a verified snapshot of a server's data directory.

A backup is a directory:

    manifest.json        what is in it, with the size and SHA-256 of every file below
    database/T.jsonl.gz  every table (see database.py)
    home.tar             the data directory's own files: uploads, pricing, anything else kept
                         there, but not caches (envs, materialised datasets) or runner files
    blobs.tar            the local blob store (dataset chunks and manifests, encrypted); with
                         the S3 store only a reference to the bucket, in the manifest
    workspaces.tar       workspaces of instances that are not running (their files are at rest)
    keys.tar             only with include_keys: the master key and the TLS key pair

Without the keys, a restored server needs its master key file put back (the manifest keeps
its SHA-256 to check it): a backup is then useless to whoever steals it alone.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import stat
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import SecretStr
from sqlalchemy.engine import make_url

from gpulease import __version__
from gpulease.core.errors import GpuleaseError
from gpulease.server.backups import database
from gpulease.server.backups.progress import Advance, Step, no_progress
from gpulease.server.db import make_engine, migrate, normalize_url
from gpulease.server.settings import Settings

FORMAT = "gpulease-backup"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
READ_BYTES = 1024 * 1024
# Instances whose workspace is at rest; a running one is skipped (stop it to include it).
AT_REST = ("stopped", "failed", "queued")
_SECRET_WORDS = ("password", "secret", "token")


class BackupError(GpuleaseError):
    """A backup or restore that cannot be done; the message says why and what to do."""


@dataclass
class BackupSummary:
    path: Path
    tables: dict[str, int]
    files: dict[str, int]  # archive -> bytes
    workspaces: list[int]
    skipped_workspaces: dict[int, str]
    keys_included: bool
    warnings: list[str] = field(default_factory=list)


@dataclass
class RestoreSummary:
    tables: dict[str, int]
    workspaces: list[int]
    keys_restored: bool
    warnings: list[str] = field(default_factory=list)


# -- backup -----------------------------------------------------------------------------------


def create_backup(
    settings: Settings, dest: Path, *, include_keys: bool = False, step: Step = no_progress
) -> BackupSummary:
    """Write a backup of the server described by settings into dest (absent or empty).

    The database is read first, in one snapshot; files are copied after it, so every blob
    the snapshot refers to is already there (blobs are written before the rows naming them).
    """
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise BackupError(f"{dest} exists and is not an empty directory; choose a new one")
    if _covers(settings.home, dest.resolve()):
        raise BackupError(f"{dest} lies inside the data directory {settings.home}; pick another")
    dest.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(dest, 0o700)
    try:
        db_info = database.dump_database(settings.db_url, dest / "database", step)
    except FileNotFoundError as exc:
        raise BackupError(f"nothing to back up: {exc}") from exc
    summary = BackupSummary(
        path=dest,
        tables=db_info["tables"],
        files={},
        workspaces=[],
        skipped_workspaces={},
        keys_included=include_keys,
    )
    archives: dict[str, list[tuple[Path, str]]] = {
        "home.tar": [(settings.home / name, name) for name in _home_entries(settings)],
        "blobs.tar": _blob_sources(settings),
        "workspaces.tar": _workspace_sources(settings, dest / "database", summary),
    }
    if include_keys:
        archives["keys.tar"] = _key_sources(settings)
    for name, sources in archives.items():
        summary.files[name] = _write_tar(dest / name, sources, step(f"archiving {name}", None))
    key_hash = _sha256_file(settings.master_key_path) if settings.master_key_path.exists() else None
    if key_hash is None:
        summary.warnings.append(f"no master key at {settings.master_key_path} (no datasets yet?)")
    manifest = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "created_at": datetime.now(UTC).isoformat(),
        "gpulease_version": __version__,
        "source": {"home": str(settings.home), "settings": _public_settings(settings)},
        "database": db_info,
        "blob_store": _blob_store_reference(settings),
        "workspaces": {
            "included": summary.workspaces,
            "skipped": {str(k): v for k, v in summary.skipped_workspaces.items()},
        },
        "keys_included": include_keys,
        "master_key_sha256": key_hash,
        "files": _hash_files(dest, step),
    }
    partial = dest / f".{MANIFEST}.partial"
    partial.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    partial.replace(dest / MANIFEST)  # a backup without its manifest is incomplete
    return summary


def _covers(outer: Path, inner: Path) -> bool:
    outer = outer.resolve()
    return inner == outer or outer in inner.parents


def _excluded_from_home(settings: Settings) -> set[Path]:
    """What of the data directory a backup leaves out or takes separately."""
    excluded = {
        settings.runners_path,  # runner state and tokens: meaningless after a restore
        settings.envs_path,  # built environments: a cache, rebuilt on demand
        settings.dataset_cache_path,  # materialised datasets: rebuilt from the blobs
        settings.workspaces_path,  # workspaces.tar, at rest only
        settings.blobs_path,  # blobs.tar
        settings.tls_path,  # keys.tar
        settings.master_key_path,  # keys.tar
        settings.home / "keys",
    }
    if database.dialect_of(settings.db_url) == "sqlite":
        db_file = Path(make_url(normalize_url(settings.db_url)).database or "")
        excluded |= {db_file.with_name(db_file.name + s) for s in ("", "-wal", "-shm", "-journal")}
    return {path.resolve() for path in excluded}


def _home_entries(settings: Settings) -> list[str]:
    if not settings.home.is_dir():
        return []
    excluded = _excluded_from_home(settings)
    return sorted(
        entry.name
        for entry in settings.home.iterdir()
        if entry.resolve() not in excluded and not any(_covers(entry, x) for x in excluded)
    )


def _blob_sources(settings: Settings) -> list[tuple[Path, str]]:
    if settings.blob_store != "fs" or not settings.blobs_path.is_dir():
        return []
    return [(entry, entry.name) for entry in sorted(settings.blobs_path.iterdir())]


def _key_sources(settings: Settings) -> list[tuple[Path, str]]:
    key = settings.master_key_path  # with its siblings (a rotation's next key)
    sources = [
        (path, f"keys/{path.name}")
        for path in sorted(key.parent.glob(f"{key.name}*"))
        if path.is_file()
    ]
    if settings.tls_path.is_dir():
        sources.append((settings.tls_path, "tls"))
    return sources


def _workspace_sources(
    settings: Settings, dump_dir: Path, summary: BackupSummary
) -> list[tuple[Path, str]]:
    """Workspaces of the snapshot's instances that are at rest, as workspaces/<dir name>."""
    dump = dump_dir / "instances.jsonl.gz"
    if not dump.exists():
        return []
    sources = []
    for row in _dumped_rows(dump):
        workspace, status, instance_id = row.get("workspace"), row.get("status"), row.get("id")
        if not isinstance(workspace, str) or not isinstance(instance_id, int):
            continue
        path = Path(workspace)
        if not path.is_dir():
            continue
        if status not in AT_REST:
            summary.skipped_workspaces[instance_id] = str(status)
            continue
        summary.workspaces.append(instance_id)
        sources.append((path, path.name))
    return sources


def _dumped_rows(path: Path) -> Iterator[dict[str, Any]]:
    with gzip.open(path, "rt", encoding="utf-8") as lines:
        for line in lines:
            yield json.loads(line)


def _write_tar(target: Path, sources: list[tuple[Path, str]], advance: Advance) -> int:
    """Archive sources (path, name in the archive): regular files, directories, symbolic
    links (as links) and hard links; FIFOs, sockets and devices are left out.

    Workspaces are written by jobs, so nothing here follows a link or trusts a name: a tree
    is walked through directory descriptors (os.fwalk, which skips a directory swapped for
    a link), and each file is opened relative to its directory without following a link
    or blocking on a FIFO, then described from the open descriptor (what is archived is
    what was opened, whatever is at that name by then)."""
    with tarfile.open(target, "w", format=tarfile.PAX_FORMAT) as tar:
        for source, name in sources:
            parent = os.open(source.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                if _add_entry(tar, parent, source.name, name, advance):
                    for directory, dirs, files, dir_fd in os.fwalk(source, follow_symlinks=False):
                        dirs.sort()
                        rel = Path(directory).relative_to(source)
                        for entry in sorted(dirs) + sorted(files):
                            _add_entry(tar, dir_fd, entry, str(Path(name) / rel / entry), advance)
            finally:
                os.close(parent)
    return target.stat().st_size


def _add_entry(
    tar: tarfile.TarFile, dir_fd: int, entry: str, arcname: str, advance: Advance
) -> bool:
    """Add entry of the directory dir_fd as arcname; True when it is a real directory."""
    try:
        info = os.stat(entry, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False  # gone meanwhile
    if stat.S_ISDIR(info.st_mode):
        tar.addfile(_tarinfo(arcname, info, tarfile.DIRTYPE))
        return True
    if stat.S_ISLNK(info.st_mode):
        member = _tarinfo(arcname, info, tarfile.SYMTYPE)
        member.linkname = os.readlink(entry, dir_fd=dir_fd)
        tar.addfile(member)
    elif stat.S_ISREG(info.st_mode):
        try:
            fd = os.open(
                entry, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd
            )
        except OSError:
            return False  # swapped for a link or a FIFO since: left out
        with os.fdopen(fd, "rb") as data:
            member = tar.gettarinfo(arcname=arcname, fileobj=data)
            if member.isreg():
                tar.addfile(member, data)
                advance(member.size)
            elif member.islnk():  # a second name of a file already archived
                tar.addfile(member)
    return False


def _tarinfo(arcname: str, info: os.stat_result, kind: bytes) -> tarfile.TarInfo:
    member = tarfile.TarInfo(arcname)
    member.type = kind
    member.mode = stat.S_IMODE(info.st_mode)
    member.mtime = int(info.st_mtime)
    member.uid, member.gid = info.st_uid, info.st_gid
    return member


def _public_settings(settings: Settings) -> dict[str, Any]:
    """The settings of the backed-up server, without secrets (passwords stay out of URLs)."""
    data: dict[str, Any] = {}
    for key, value in settings.model_dump().items():
        if isinstance(value, SecretStr) or any(word in key for word in _SECRET_WORDS):
            continue
        if key == "database_url" and value:
            value = make_url(normalize_url(value)).render_as_string(hide_password=True)
        data[key] = str(value) if isinstance(value, Path) else value
    return data


def _blob_store_reference(settings: Settings) -> dict[str, Any]:
    if settings.blob_store == "s3":
        return {
            "kind": "s3",
            "bucket": settings.s3_bucket,
            "prefix": settings.s3_prefix,
            "endpoint_url": settings.s3_endpoint_url,
            "region": settings.s3_region,
            "note": "the blobs stay in the bucket; back it up with the bucket's own versioning",
        }
    return {"kind": "fs", "archive": "blobs.tar"}


def _sha256_file(path: Path, advance: Advance | None = None) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as data:
        while block := data.read(READ_BYTES):
            digest.update(block)
            if advance is not None:
                advance(len(block))
    return digest.hexdigest()


def _artifacts(root: Path) -> list[Path]:
    return sorted(
        p
        for p in root.rglob("*")
        if p.is_file() and not p.name.startswith(".") and p.name != MANIFEST
    )


def _hash_files(root: Path, step: Step) -> dict[str, dict[str, Any]]:
    files = _artifacts(root)
    advance = step("hashing", sum(p.stat().st_size for p in files))
    return {
        str(p.relative_to(root)): {"size": p.stat().st_size, "sha256": _sha256_file(p, advance)}
        for p in files
    }


# -- restore ----------------------------------------------------------------------------------


def read_manifest(src: Path) -> dict[str, Any]:
    path = src / MANIFEST
    if not path.exists():
        raise BackupError(
            f"{src} has no {MANIFEST}: it is not a gpulease backup, or the backup did not "
            "finish; nothing was restored"
        )
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise BackupError(
            f"the manifest of {src} is damaged ({exc}); nothing was restored"
        ) from exc
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise BackupError(f"{src} is not a gpulease backup; nothing was restored")
    if manifest.get("version") != FORMAT_VERSION:
        raise BackupError(
            f"{src} is a backup of format version {manifest.get('version')}; this gpulease "
            f"reads version {FORMAT_VERSION}; nothing was restored"
        )
    return manifest


def verify_backup(src: Path, manifest: dict[str, Any], step: Step = no_progress) -> None:
    """Check every file against the manifest's size and SHA-256; BackupError naming the
    first damaged or missing one."""
    files: dict[str, dict[str, Any]] = manifest["files"]
    advance = step("verifying", sum(int(f["size"]) for f in files.values()))
    for name, expected in sorted(files.items()):
        path = src / name
        if not path.is_file():
            raise BackupError(f"the backup is damaged: {name} is missing; nothing was restored")
        if (
            path.stat().st_size != expected["size"]
            or _sha256_file(path, advance) != expected["sha256"]
        ):
            raise BackupError(
                f"the backup is damaged: {name} does not match its SHA-256 in the manifest; "
                "nothing was restored. Use another copy of the backup"
            )


def restore_backup(
    settings: Settings, src: Path, *, force: bool = False, step: Step = no_progress
) -> RestoreSummary:
    """Bring the backup at src back into the data directory and database of settings.

    Refuses, before touching anything, a damaged backup and a target that holds data
    (unless force: then the database's tables are dropped and what the backup restores is
    replaced; other files, such as the environment cache, stay).
    """
    manifest = read_manifest(src)
    engine = make_engine(settings.db_url)
    try:
        occupied = _occupied(settings, engine)
        if occupied and not force:
            raise BackupError(
                f"refusing to restore over existing data ({'; '.join(occupied)}); restore into "
                "an empty data directory and database, or pass --force to replace them"
            )
        verify_backup(src, manifest, step)
        if occupied:
            database.drop_everything(engine)
    finally:
        engine.dispose()
    if occupied:
        _clear_targets(settings)
    db_info = manifest["database"]
    settings.home.mkdir(parents=True, exist_ok=True)
    settings.home.chmod(0o700)
    engine = make_engine(settings.db_url)
    try:
        database.migrate_to(engine, db_info["revision"])
        old_home = manifest["source"]["home"]
        moved = (old_home, str(settings.home)) if old_home != str(settings.home) else None
        database.load_tables(
            engine,
            src / "database",
            db_info["tables"],
            step("database rows", sum(db_info["tables"].values()), "rows"),
            moved,
        )
        migrate(engine)  # a backup of an older schema is brought up to this version's
    finally:
        engine.dispose()
    targets = {
        "home.tar": settings.home,
        "blobs.tar": settings.blobs_path,
        "workspaces.tar": settings.workspaces_path,
    }
    for name, target in targets.items():
        if (src / name).exists():
            _extract(
                src / name, target, step(f"extracting {name}", manifest["files"][name]["size"])
            )
    summary = RestoreSummary(
        tables=db_info["tables"],
        workspaces=list(manifest["workspaces"]["included"]),
        keys_restored=bool(manifest.get("keys_included")),
    )
    if summary.keys_restored:
        _restore_keys(src / "keys.tar", settings)
    summary.warnings += _key_warnings(settings, manifest)
    return summary


def _occupied(settings: Settings, engine: Any) -> list[str]:
    found = []
    if settings.home.exists() and any(settings.home.iterdir()):
        found.append(f"the data directory {settings.home} is not empty")
    if not database.database_is_empty(engine):
        found.append("the database has tables")
    if (
        settings.blob_store == "fs"
        and settings.blobs_path.exists()
        and any(settings.blobs_path.iterdir())
    ):
        found.append(f"the blob store {settings.blobs_path} is not empty")
    return found


def _clear_targets(settings: Settings) -> None:
    """--force: remove what the restore writes anew. Kept: the environment cache, the
    materialised datasets, and the keys and TLS pair (replaced only from keys.tar)."""
    keep = {
        path.resolve()
        for path in (
            settings.envs_path,
            settings.dataset_cache_path,
            settings.home / "keys",
            settings.master_key_path,
            settings.tls_path,
        )
    }
    for entry in list(settings.home.iterdir()) if settings.home.is_dir() else []:
        if entry.resolve() not in keep:
            _remove(entry)
    for path in (settings.blobs_path, settings.workspaces_path):
        if path.exists():
            _remove(path)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def _extract(archive: Path, target: Path, advance: Advance) -> None:
    target.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "r") as tar:
        for member in tar:
            tar.extract(member, target, filter="tar")
            if member.isreg():
                advance(member.size)


def _restore_keys(archive: Path, settings: Settings) -> None:
    with tarfile.open(archive, "r") as tar:
        for member in tar:
            if member.name.startswith("keys/") and member.isreg():
                data = tar.extractfile(member)
                assert data is not None
                key = settings.master_key_path.parent / Path(member.name).name
                key.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(fd, "wb") as out:
                    shutil.copyfileobj(data, out)
            elif member.name.startswith("tls/") and member.isreg():
                relative = member.name.removeprefix("tls/")
                settings.tls_path.mkdir(parents=True, exist_ok=True, mode=0o700)
                tar.extract(member.replace(name=relative), settings.tls_path, filter="tar")


def _key_warnings(settings: Settings, manifest: dict[str, Any]) -> list[str]:
    expected = manifest.get("master_key_sha256")
    if not expected:
        return []
    key = settings.master_key_path
    if not key.exists():
        return [
            f"the backup holds no master key: put the old server's master key back at {key} "
            f"(its SHA-256 must be {expected}) before starting the server, or no dataset can "
            "be read"
        ]
    if _sha256_file(key) != expected:
        return [
            f"the master key at {key} is not the one the backup was made with (SHA-256 "
            f"{expected}); datasets cannot be read until the right key is there"
        ]
    return []
