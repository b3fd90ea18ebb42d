"""A PNG of queue length and GPU utilisation over simulated time, one colour per policy
(Pillow, imported only when a plot is asked for)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from gpulease.scheduler.simulator import Result

COLOURS = ((31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189))
WIDTH, PANEL, MARGIN = 1000, 260, 40


def write_png(path: Path, results: Sequence[Result]) -> None:
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (WIDTH, 2 * PANEL + 3 * MARGIN), "white")
    draw = ImageDraw.Draw(image)
    points = [s for r in results for s in r.samples]
    if not points:
        image.save(path)
        return
    t0 = min(s.at for s in points)
    t1 = max(s.at for s in points) or 1.0
    top_queue = max(s.queued for s in points) or 1
    span = max(t1 - t0, 1.0)

    def x(at: float) -> float:
        return MARGIN + (at - t0) / span * (WIDTH - 2 * MARGIN)

    panels = ((f"queue length (max {top_queue})", 0), ("GPU utilisation (0-100 %)", 1))
    for title, k in panels:
        y0 = MARGIN + k * (PANEL + MARGIN)
        draw.rectangle((MARGIN, y0, WIDTH - MARGIN, y0 + PANEL), outline="black")
        draw.text((MARGIN + 4, y0 - 14), title, fill="black")
    for i, r in enumerate(results):
        colour = COLOURS[i % len(COLOURS)]
        draw.text((WIDTH - MARGIN - 120, 4 + 12 * i), r.policy, fill=colour)
        queue = [(x(s.at), MARGIN + PANEL - s.queued / top_queue * PANEL) for s in r.samples]
        util = [
            (x(s.at), 2 * MARGIN + 2 * PANEL - s.busy_gpus / max(r.gpus, 1) * PANEL)
            for s in r.samples
        ]
        if len(queue) > 1:
            draw.line(queue, fill=colour, width=1)
            draw.line(util, fill=colour, width=1)
    image.save(path, "PNG")
