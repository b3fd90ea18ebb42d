"""All console pages under one router; each area of the console is a module beside this one."""

from __future__ import annotations

from fastapi import APIRouter

from gpulease.server.routers.ui import account, dashboard

router = APIRouter(include_in_schema=False)
for area in (account, dashboard):
    router.include_router(area.router)
