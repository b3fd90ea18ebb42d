"""Entry point: `python -m gpulease.runner SPEC_FILE`, started by a backend; or
`python -m gpulease.runner --warm RUNNERS_DIR/`, started ahead of need by the local
backend, which then writes the spec file's path to its stdin."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from gpulease.backends.base import RunnerSpec
from gpulease.runner.agent import serve


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) == 2 and args[0] == "--warm":
        return _warm(Path(args[1]))
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


def _warm(runners_dir: Path) -> int:
    """Wait, imported, for the path of a spec in runners_dir on stdin (nothing: the server
    went away, exit 0), then run it as a cold start would: in the spec's directory, output
    to runner.log beside it, stdin /dev/null."""
    from gpulease.backends.local import LOG_FILE

    line = sys.stdin.buffer.readline().decode().strip()
    if not line:
        return 0
    spec_file = Path(line)
    if spec_file.parent.parent != runners_dir:
        print(f"{spec_file} is not a spec in {runners_dir}", file=sys.stderr)
        return 2
    os.chdir(spec_file.parent)
    with open(spec_file.parent / LOG_FILE, "ab") as runner_log:
        os.dup2(runner_log.fileno(), 1)
        os.dup2(runner_log.fileno(), 2)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    return main([str(spec_file)])


if __name__ == "__main__":
    sys.exit(main())
