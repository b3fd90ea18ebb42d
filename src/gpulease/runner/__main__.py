"""Entry point: `python -m gpulease.runner SPEC_FILE`, started by a backend."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from gpulease.backends.base import RunnerSpec
from gpulease.runner.agent import serve


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m gpulease.runner SPEC_FILE", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("httpcore").setLevel(logging.WARNING)
    spec = RunnerSpec.from_json(Path(args[0]).read_text())
    return serve(spec)


if __name__ == "__main__":
    sys.exit(main())
