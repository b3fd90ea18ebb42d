"""Helpers for the dataset tests: trees of files, SDK clients on the app, a runner's view."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from starlette.testclient import TestClient

from factories import Caller
from gpulease.backends.base import RunnerSpec
from gpulease.client import GpuleaseClient
from gpulease.runner.connection import Connection


def write_tree(root: Path, files: dict[str, bytes]) -> Path:
    for relative, data in files.items():
        target = root / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    return root


def random_tree(root: Path, count: int, size: int, seed: int = 0) -> dict[str, bytes]:
    """count files of about size bytes under a few subdirectories, deterministic by seed."""
    files = {}
    for i in range(count):
        digest = hashlib.sha256(f"{seed}/{i}".encode()).digest()
        data = (digest * (size // 32 + 1))[: size - i % 7] + os.urandom(0)
        files[f"class_{i % 5}/img_{i:05d}.bin"] = data
    write_tree(root, files)
    return files


def tree_digests(root: Path) -> dict[str, str]:
    return {
        path.relative_to(root).as_posix(): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


def sdk(caller: Caller) -> GpuleaseClient:
    return GpuleaseClient("http://testserver", caller.token, http=caller.http)


def forward_to(http: TestClient, request: httpx.Request) -> httpx.Response:
    """The in-process app's answer to a request a Connection made."""
    answer = http.request(
        request.method,
        request.url.raw_path.decode(),
        content=request.content,
        headers={k: v for k, v in request.headers.items() if k.lower() != "host"},
    )
    return httpx.Response(answer.status_code, content=answer.content, headers=answer.headers)


def runner_connection(http: TestClient, token: str) -> Connection:
    """A runner Connection whose requests go to the in-process app."""
    return Connection(
        "http://testserver",
        token,
        on_stop=lambda reason: None,
        transport=httpx.MockTransport(lambda request: forward_to(http, request)),
        backoff_start_s=0.01,
        backoff_max_s=0.02,
    )


def with_cache(spec: RunnerSpec, cache: Path) -> RunnerSpec:
    from dataclasses import replace

    return replace(spec, dataset_cache=cache)


@contextmanager
def moto_s3(bucket: str) -> Iterator[str]:
    """An S3 endpoint on 127.0.0.1 (moto's server) with an empty bucket; credentials in the
    environment are the caller's business (any non-empty values)."""
    import socket

    import boto3
    from moto.server import ThreadedMotoServer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    try:
        boto3.session.Session().client(
            "s3",
            endpoint_url=endpoint,
            region_name="us-east-1",
            aws_access_key_id="test",
            aws_secret_access_key="test",
        ).create_bucket(Bucket=bucket)
        yield endpoint
    finally:
        server.stop()
