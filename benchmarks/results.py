"""The one line each benchmark prints per figure, for benchmarks/report.py to collect:

    bench-result {"figure": ..., "value": ..., "baseline": ..., "ratio": ..., "target": ...,
                  "met": true | false | null}

value and baseline are what was measured in the same run, as display strings with their
units; ratio is how the target compares them ("2.4×"); met says whether the target was met
(null: the figure has no target).
"""

from __future__ import annotations

import json
from typing import Any

PREFIX = "bench-result "


def emit(figure: str, value: str, baseline: str, ratio: str, target: str, met: bool | None) -> None:
    """Print one result line (flushed: the report reads it while the benchmark runs on)."""
    fields = {"figure": figure, "value": value, "baseline": baseline, "ratio": ratio}
    fields |= {"target": target, "met": met}
    print(PREFIX + json.dumps(fields, ensure_ascii=False), flush=True)


def parse(line: str) -> dict[str, Any] | None:
    """A result line's fields, or None for any other line."""
    if not line.startswith(PREFIX):
        return None
    found = json.loads(line[len(PREFIX) :])
    return found if isinstance(found, dict) else None
