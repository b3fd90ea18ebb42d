"""Sweeps: start one (a trial per point of its space), list them, read one, its curves."""

from __future__ import annotations

from gpulease.client.base import Resource
from gpulease.schemas.metrics import RunsCompared
from gpulease.schemas.sweeps import SweepCreate, SweepPublic


class SweepsAPI(Resource):
    """`client.sweeps`: groups of trials of one task over a search space."""

    def create(self, body: SweepCreate) -> SweepPublic:
        """Start every trial (an instance and its run each), or none: a refusal says why
        (a bad space, or the estimated total above the wallet's balance)."""
        return self._api.one(SweepPublic, "POST", "/sweeps", body=body)

    def list(self) -> list[SweepPublic]:
        """The newest first (at most 100)."""
        return self._api.many(SweepPublic, "/sweeps")

    def get(self, sweep_id: int, *, metric: str | None = None) -> SweepPublic:
        """The sweep and its trials; `metric` ranks them by another key than the sweep's."""
        params = {"metric": metric} if metric else None
        return self._api.one(SweepPublic, "GET", f"/sweeps/{int(sweep_id)}", params=params)

    def curves(
        self, sweep_id: int, key: str | None = None, *, max_points: int = 500
    ) -> RunsCompared:
        """Each trial's curve of `key` (default: the sweep's metric), in trial order."""
        params: dict[str, str | int] = {"max_points": max_points}
        if key:
            params["key"] = key
        return self._api.one(RunsCompared, "GET", f"/sweeps/{int(sweep_id)}/curves", params=params)
