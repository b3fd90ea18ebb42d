"""A gpulease server whose backend starts no runner: it writes each launch's spec to a
directory and leaves the runner's part to whoever reads it (a benchmark playing the runner
over the real protocol: the spec's launch secret, POST /session, /ready, the Unix socket).

Settings come from GPULEASE_* as for `gpulease server`; everything but the backend is the
real server (app, reconcilers, runner socket).

    python benchmarks/handoff_server.py SPEC_DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

from gpulease.schemas.runner import RunnerSpec
from gpulease.server.app import create_app
from gpulease.server.runner_socket import serve
from gpulease.server.runtime import build_runtime
from gpulease.server.settings import Settings


class HandoffBackend:
    """Writes SPEC_DIR/<instance id>.json on start (0600, as the local backend writes its
    spec file) and reports the runner alive until stop()."""

    name = "handoff"
    same_host = True

    def __init__(self, spec_dir: Path) -> None:
        self._dir = spec_dir
        self._stopped: set[str] = set()

    def start(self, spec: RunnerSpec) -> str:
        path = self._dir / f"{spec.instance_id}.json"
        partial = path.with_suffix(".part")
        partial.touch(mode=0o600)
        partial.write_text(spec.to_json())
        partial.rename(path)  # a reader never sees half a spec
        return f"handoff-{spec.instance_id}"

    def alive(self, handle: str) -> bool:
        return handle not in self._stopped

    def stop(self, handle: str, *, force: bool = False) -> None:
        self._stopped.add(handle)


def main() -> None:
    spec_dir = Path(sys.argv[1])
    spec_dir.mkdir(parents=True, exist_ok=True)
    settings = Settings()
    runtime = build_runtime(settings, backend=HandoffBackend(spec_dir))
    serve(create_app(settings, runtime=runtime), settings, log_level="warning")


if __name__ == "__main__":
    main()
