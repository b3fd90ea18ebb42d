"""A real server for the API fuzzer: `python tests/fuzz_server.py`, settings from GPULEASE_*.

The production app served the way `gpulease server` serves it (`create_app` and
`runner_socket.serve`: uvicorn on TCP and on the runners' Unix socket, reconcilers on), on
the fake backend, so that generated requests which start instances launch no runner. Each
runner's launch secret is left in HOME/fuzz-runner-tokens/INSTANCE_ID, for the fuzzer to
play that runner.
"""

from __future__ import annotations

from pathlib import Path

from gpulease.backends.fake import FakeBackend
from gpulease.schemas.runner import RunnerSpec
from gpulease.server.app import create_app
from gpulease.server.runner_socket import serve
from gpulease.server.runtime import build_runtime
from gpulease.server.settings import Settings

TOKENS_DIR = "fuzz-runner-tokens"


class RecordingBackend(FakeBackend):
    def __init__(self, tokens: Path) -> None:
        super().__init__()
        self.tokens = tokens

    def start(self, spec: RunnerSpec) -> str:
        handle = super().start(spec)
        self.tokens.mkdir(mode=0o700, parents=True, exist_ok=True)
        (self.tokens / str(spec.instance_id)).write_text(spec.token)
        return handle


def main() -> None:
    settings = Settings()
    runtime = build_runtime(settings, RecordingBackend(settings.home / TOKENS_DIR))
    serve(create_app(settings, runtime=runtime), settings, log_level="warning")


if __name__ == "__main__":
    main()
