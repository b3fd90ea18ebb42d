"""All console pages under one router; each area of the console is a module beside this one."""

from __future__ import annotations

from fastapi import APIRouter

from gpulease.server.routers.ui import account, dashboard, jupyter_proxy, terminal
from gpulease.server.routers.ui import admin as admin_pages
from gpulease.server.routers.ui import autostop as autostop_pages
from gpulease.server.routers.ui import billing as billing_pages
from gpulease.server.routers.ui import catalog as catalog_pages
from gpulease.server.routers.ui import create as create_pages
from gpulease.server.routers.ui import datasets as dataset_pages
from gpulease.server.routers.ui import instances as instance_pages
from gpulease.server.routers.ui import notification_settings as notification_pages
from gpulease.server.routers.ui import runs as run_pages
from gpulease.server.routers.ui import support as support_pages

router = APIRouter(include_in_schema=False)
for area in (account, dashboard):
    router.include_router(area.router)
for area in (create_pages, billing_pages):  # issue 3: create form with estimate, billing
    router.include_router(area.router)
router.include_router(dataset_pages.router)  # issue 5: datasets
router.include_router(catalog_pages.router)  # issue 6: GPU catalog
router.include_router(instance_pages.router)  # issue 6: instance page (after /instances/new)
router.include_router(run_pages.router)  # issue 6: run page, compare runs
router.include_router(admin_pages.router)  # issue 6: admin console (nodes, users, prices)
for area in (terminal, jupyter_proxy):  # issue 4: browser terminal, JupyterLab proxy
    router.include_router(area.router)
router.include_router(autostop_pages.router)  # issue 4: autostop, schedules, resize forms
for area in (support_pages, notification_pages):  # issue 6: support, notification settings
    router.include_router(area.router)
