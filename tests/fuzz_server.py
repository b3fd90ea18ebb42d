"""A real server for the API fuzzer: `python tests/fuzz_server.py`, settings from GPULEASE_*.

The production app served the way `gpulease server` serves it (`create_app` and
`runner_socket.serve`: uvicorn on TCP and on the runners' Unix socket, reconcilers on), on
the fake backend, so that generated requests which start instances launch no runner.
"""

from __future__ import annotations

from gpulease.backends.fake import FakeBackend
from gpulease.server.app import create_app
from gpulease.server.runner_socket import serve
from gpulease.server.runtime import build_runtime
from gpulease.server.settings import Settings


def main() -> None:
    settings = Settings()
    runtime = build_runtime(settings, FakeBackend())
    serve(create_app(settings, runtime=runtime), settings, log_level="warning")


if __name__ == "__main__":
    main()
