"""A backend that owns a fleet of nodes: it tells the server which nodes exist and what they hold.

The local backend has one node, this host, registered once at start from NVML. A fleet
backend (Ray) learns its nodes from the cluster engine; the fleet reconciler
(server/reconcilers/fleet.py) copies them into the node inventory every tick.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from gpulease.core.catalog import Catalog
from gpulease.gpus.discovery import Inventory

__all__ = ["Fleet", "FleetNode"]


@dataclass(frozen=True)
class FleetNode:
    """One node as the cluster engine sees it now."""

    name: str  # unique in the fleet and stable across restarts of that node
    # How the other nodes reach it: an IP address where the engine knows one (Ray's node
    # address), since multi-node runs hand it to their ranks as MASTER_ADDR.
    hostname: str
    cpu_count: int
    memory_mb: int
    inventory: Inventory
    alive: bool


@runtime_checkable
class Fleet(Protocol):
    """What a fleet backend adds to the Backend contract."""

    def nodes(self, catalog: Catalog) -> list[FleetNode]:
        """Every node the engine knows, alive or gone, as of now, its GPUs named by the
        catalog's models. One call to the engine;
        the backend's alive() answers from the same view until the next call, so that a
        node's death and its runners' deaths are seen together."""
        ...
