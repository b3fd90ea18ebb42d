"""Training estimates: GPU-hours, wall time and cost on every GPU model of the catalog."""

from __future__ import annotations

from gpulease.client.base import Resource
from gpulease.schemas.estimates import EstimatePublic


class EstimatesAPI(Resource):
    """`client.estimates`."""

    def get(
        self, model: str, images: int, epochs: int, *, image_size: int = 224, gpus: int = 1
    ) -> EstimatePublic:
        """Expected GPU-hours, wall time, cost and NCU of training an image classifier, for
        every GPU model in the server's catalog (at its prices)."""
        params: dict[str, str | int] = {
            "model": model,
            "images": images,
            "epochs": epochs,
            "image_size": image_size,
            "gpus": gpus,
        }
        return self._api.one(EstimatePublic, "GET", "/estimate", params=params)
