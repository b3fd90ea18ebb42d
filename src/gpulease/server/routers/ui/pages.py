"""All console pages under one router; each area of the console is a module beside this one."""

from __future__ import annotations

from fastapi import APIRouter

from gpulease.server.routers.ui import account, dashboard
from gpulease.server.routers.ui import billing as billing_pages
from gpulease.server.routers.ui import create as create_pages
from gpulease.server.routers.ui import datasets as dataset_pages

router = APIRouter(include_in_schema=False)
for area in (account, dashboard):
    router.include_router(area.router)
for area in (create_pages, billing_pages):  # issue 3: create form with estimate, billing
    router.include_router(area.router)
router.include_router(dataset_pages.router)  # issue 5: datasets
