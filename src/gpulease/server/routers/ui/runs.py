"""The console's run page (live log, metric curves, exit status) and the compare-runs page."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated

from fastapi import Query, Response
from sqlalchemy.orm import Session

from gpulease.core.errors import InvalidInput, NotFound
from gpulease.schemas.runs import RunPublic
from gpulease.server.orm import User
from gpulease.server.routers.ui.guards import PageViewer, PartialViewer, console_router
from gpulease.server.services import console, runs

router = console_router()

RUN_ID = re.compile(r"[0-9]{1,9}")  # fits the database's integer column
TAIL_CHUNKS = 500
MAX_COMPARE = 8
PICKER_RUNS = 50
REFRESH_MS = 2000


@dataclass(frozen=True)
class RunView:
    run: RunPublic
    instance_id: int
    instance_name: str
    tail_from: int
    keys: list[str]
    finished: bool
    """It exited: the page stops refreshing and its badge says "Finished", not "Live"."""


@dataclass(frozen=True)
class PickerRow:
    run: RunPublic
    instance_name: str
    chosen: bool


def run_id(text: str) -> int:
    if not RUN_ID.fullmatch(text):
        raise NotFound(f"there is no run {text[:40]!r}; run ids are numbers")
    return int(text)


def load_run(session: Session, user: User, text: str) -> RunView:
    """A run of the user's for its page; someone else's or an unknown id is NotFound."""
    run = runs.get_run(session, user, run_id(text))
    last = console.last_log_seqs(session, [run.id]).get(run.id, -1)
    names = console.instance_names(session, user, [run.instance_id])
    return RunView(
        run=RunPublic.model_validate(run),
        instance_id=run.instance_id,
        instance_name=names.get(run.instance_id, f"#{run.instance_id}"),
        tail_from=max(last - TAIL_CHUNKS, -1),
        keys=console.metric_keys(session, [run.id]),
        finished=runs.is_finished(run),
    )


def compare_ids(values: list[str]) -> list[int]:
    """`ids=1,2,3` (or `ids=1&ids=2`) as run ids, in order, once each."""
    ids: list[int] = []
    for part in ",".join(values).split(","):
        part = part.strip()
        if not part:
            continue
        if not RUN_ID.fullmatch(part):
            raise InvalidInput(f"{part[:40]!r} is not a run id; give run numbers like ?ids=12,15")
        if int(part) not in ids:
            ids.append(int(part))
    if len(ids) > MAX_COMPARE:
        raise InvalidInput(f"compare at most {MAX_COMPARE} runs at a time; you gave {len(ids)}")
    return ids


@router.get("/runs/compare")
def compare_page(
    page: PageViewer, ids: Annotated[list[str] | None, Query(max_length=400)] = None
) -> Response:
    session, user = page.session, page.user
    try:
        chosen = compare_ids(ids or [])
    except InvalidInput as exc:
        return page.refused(exc, "Cannot compare these runs")
    try:
        picked = [RunPublic.model_validate(runs.get_run(session, user, i)) for i in chosen]
    except NotFound as exc:
        return page.refused(exc, "Run not found")
    recent = [RunPublic.model_validate(r) for r in runs.list_runs(session, user, None, PICKER_RUNS)]
    shown = {r.id for r in recent}
    everything = recent + [r for r in picked if r.id not in shown]
    names = console.instance_names(session, user, {r.instance_id for r in everything})
    picker = [
        PickerRow(r, names.get(r.instance_id, f"#{r.instance_id}"), r.id in chosen)
        for r in everything
    ]
    context = {
        "picker": picker,
        "chosen": picked,
        "ids": ",".join(str(i) for i in chosen),
        "keys": console.metric_keys(session, chosen),
        "max_compare": MAX_COMPARE,
    }
    return page.render("runs/compare.html", context, page="compare")


@router.get("/runs/{ref}")
def run_page(ref: str, page: PageViewer) -> Response:
    try:
        view = load_run(page.session, page.user, ref)
    except NotFound as exc:
        return page.refused(exc, "Run not found")
    # `run` (RunPublic) is what other areas' partials get (support/_open_ticket.html).
    context = {"view": view, "run": view.run, "csrf": "", "refresh_ms": REFRESH_MS}
    return page.render("runs/page.html", context, page="run")


@router.get("/partials/runs/{ref}")
def run_live(ref: str, page: PartialViewer) -> Response:
    """The run page's summary card, re-rendered for live.js."""
    try:
        view = load_run(page.session, page.user, ref)
    except NotFound as exc:
        return Response(exc.message, status_code=404, media_type="text/plain")
    return page.render("runs/_summary.html", {"view": view})
