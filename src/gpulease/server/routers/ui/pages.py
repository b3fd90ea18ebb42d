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
from gpulease.server.routers.ui import sweeps as sweep_pages

router = APIRouter(include_in_schema=False)
for area in (account, dashboard):
    router.include_router(area.router)
for area in (create_pages, billing_pages):  # the Create form with its estimate; Billing
    router.include_router(area.router)
router.include_router(dataset_pages.router)
router.include_router(catalog_pages.router)  # the GPU catalog
router.include_router(instance_pages.router)  # after create: /instances/new is not an id
router.include_router(run_pages.router)  # a run's page, comparing runs
router.include_router(sweep_pages.router)  # sweeps: their trials and curves together
router.include_router(admin_pages.router)  # the admin console: nodes, users, prices
for area in (terminal, jupyter_proxy):  # the browser terminal, the JupyterLab proxy
    router.include_router(area.router)
router.include_router(autostop_pages.router)  # autostop, schedule and resize forms
for area in (support_pages, notification_pages):  # support tickets, notification settings
    router.include_router(area.router)
