"""The whole dataset path on an S3-compatible blob store (moto's server on 127.0.0.1)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from datasets_support import moto_s3, random_tree, runner_connection, sdk, tree_digests
from factories import Caller, RunnerDouble, make_settings
from gpulease.backends.fake import FakeBackend
from gpulease.runner.datasets import materialise
from gpulease.server.runtime import Runtime
from gpulease.server.settings import Settings
from gpulease.storage.blobs import S3BlobStore


@pytest.fixture
def settings(  # the server's settings, on S3 instead of local files
    tmp_path: Path, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Settings]:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    with moto_s3("datasets") as endpoint:
        yield make_settings(
            tmp_path / "home",
            database_url,
            simulated_gpus="T4:1",
            blob_store="s3",
            s3_bucket="datasets",
            s3_endpoint_url=endpoint,
            s3_region="us-east-1",
            s3_prefix="gpulease",
        )


def test_push_mount_and_remove_on_s3(
    ann: Caller,
    rt: Runtime,
    http,  # type: ignore[no-untyped-def]
    tick: Callable[[], None],
    backend: FakeBackend,
    tmp_path: Path,
) -> None:
    assert rt.vault is not None and isinstance(rt.vault.store, S3BlobStore)
    random_tree(tmp_path / "d", 40, 2000)
    pushed = sdk(ann).datasets.push(tmp_path / "d", "d")
    assert pushed.sent_chunks == 40
    assert len(list(rt.vault.store.iterate("p/"))) == 1  # one request, one pack
    r = ann.post("/api/v1/instances", json={"datasets": ["d"]})
    tick()
    handle = backend.handle_for(int(r.json()["id"]))
    assert handle is not None
    spec = replace(backend.runners[handle].spec, dataset_cache=tmp_path / "cache")
    found = materialise(spec, runner_connection(http, spec.token), lambda message: None)
    assert tree_digests(found["d"]) == tree_digests(tmp_path / "d")
    ann.post(f"/api/v1/instances/{r.json()['id']}/release")
    RunnerDouble(http, spec.token).stopped()
    tick()
    assert sdk(ann).datasets.remove("d").freed_chunks == 40
    assert list(rt.vault.store.iterate("p/")) == []
