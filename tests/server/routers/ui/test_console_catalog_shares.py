"""The console's catalog and create pages tell each GPU model's CPU and memory share (a
CPU-only instance's size), the figures the API's catalog gives."""

from __future__ import annotations

import html
import re

from factories import BrowserFactory, Caller, logged_in
from gpulease.core.catalog import share_text


def test_catalog_and_create_pages_show_the_cpu_and_memory_share(
    ann: Caller, browser: BrowserFactory
) -> None:
    models = ann.get("/api/v1/gpus").json()
    shares = {
        m["name"]: share_text(m["vcpus_per_gpu"], m["ram_gb_per_gpu"])
        for m in models
        if m["vcpus_per_gpu"] is not None
    }
    offered = [m["name"] for m in models if m["name"] in shares]
    assert any(m["is_gpu"] for m in models if m["name"] in shares) and "CPU" in shares
    unplaced = [m["name"] for m in models if m["name"] not in shares]
    assert unplaced, "the test catalog has a model no node holds"

    client = logged_in(browser, "ann")
    catalog = html.unescape(client.get("/catalog").text)
    create = html.unescape(client.get("/instances/new").text)
    for name in offered:
        cell = re.search(rf'data-testid="share-{re.escape(name)}">(.*?)</td>', catalog, re.S)
        assert cell is not None, name
        per = "per GPU" if name != "CPU" else "per instance"
        assert shares[name] in cell.group(1) and per in cell.group(1), cell.group(1)
        option = re.search(rf'<option value="{re.escape(name)}"[^>]*>(.*?)</option>', create)
        assert option is not None and shares[name] in option.group(1), name
    for name in unplaced:
        cell = re.search(rf'data-testid="share-{re.escape(name)}">(.*?)</td>', catalog, re.S)
        assert cell is not None and cell.group(1) == "—", name
        option = re.search(rf'<option value="{re.escape(name)}"[^>]*>(.*?)</option>', create)
        assert option is not None and "vCPU" not in option.group(1), name
