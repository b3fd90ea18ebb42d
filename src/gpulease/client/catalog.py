"""The catalog: GPU models with prices and availability, nodes, templates."""

from __future__ import annotations

from urllib.parse import quote

from gpulease.client.base import InstanceRef, Resource, path_part
from gpulease.schemas.catalog import (
    GpuModelPublic,
    NodePublic,
    TemplateAvailabilityPublic,
    TemplatePublic,
    TemplateSave,
)


class CatalogAPI(Resource):
    """`client.catalog`: what the server offers."""

    def gpus(self) -> list[GpuModelPublic]:
        """The GPU catalog with prices and live free/total counts."""
        return self._api.many(GpuModelPublic, "/gpus")

    def nodes(self) -> list[NodePublic]:
        """Hosts and their GPUs (admins only)."""
        return self._api.many(NodePublic, "/nodes")


class TemplatesAPI(Resource):
    """`client.templates`: built-in environments and your own (mine/NAME)."""

    def availability(self, name: str) -> list[TemplateAvailabilityPublic]:
        """Per GPU model: whether instances of it can run template `name`, and why not."""
        quoted = "/".join(quote(part, safe="") for part in name.split("/"))
        return self._api.many(TemplateAvailabilityPublic, f"/templates/{quoted}/availability")

    def list(self) -> list[TemplatePublic]:
        """Built-in templates and your own (mine/NAME), each with where it can run."""
        return self._api.many(TemplatePublic, "/templates")

    def delete(self, name: str) -> None:
        """Delete your template mine/NAME (NAME alone works too)."""
        short = name.removeprefix("mine/")
        self._api.send("DELETE", f"/templates/mine/{quote(short, safe='')}")

    def save(self, ref: InstanceRef, body: TemplateSave) -> TemplatePublic:
        """Save a running instance's environment as your template mine/NAME (pending until
        its runner has answered; see list())."""
        path = f"/instances/{path_part(ref)}/save-template"
        return self._api.one(TemplatePublic, "POST", path, body=body)
