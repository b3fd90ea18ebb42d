"""Rendering console pages: the Jinja2 environment, its filters, the nav and page headers."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any

import jinja2
from fastapi import Request
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates

from gpulease.core.durations import span as span  # the console filter and dashboard use it
from gpulease.core.run_commands import own_command
from gpulease.schemas.accounts import UserPublic
from gpulease.server.db import utcnow

SERVER_DIR = Path(__file__).parents[2]
TEMPLATES_DIR = SERVER_DIR / "templates"
STATIC_DIR = SERVER_DIR / "static"


def content_security_policy(*, inline_styles: bool = False) -> str:
    """Scripts and styles come only from /static: no inline code, nothing from elsewhere.
    `inline_styles` lets a page's scripts add <style> elements, for the pages that hold the
    terminal (xterm.js sizes its rows and draws its theme with style sheets it writes
    itself); inline script stays refused everywhere."""
    styles = "'self' 'unsafe-inline'" if inline_styles else "'self'"
    return (
        f"default-src 'self'; script-src 'self'; style-src {styles}; img-src 'self' data:; "
        "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
        "frame-ancestors 'none'"
    )


SECURITY_HEADERS = {
    "Content-Security-Policy": content_security_policy(),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
TERMINAL_HEADERS = {
    **SECURITY_HEADERS,
    "Content-Security-Policy": content_security_policy(inline_styles=True),
}


@dataclass(frozen=True)
class NavItem:
    key: str
    label: str
    href: str
    admin_only: bool = False


# The top bar, in order. A new page adds itself here and passes its key as `page`.
NAV: tuple[NavItem, ...] = (
    NavItem("dashboard", "Dashboard", "/"),
    NavItem("catalog", "Catalog", "/catalog"),
    NavItem("create", "Create", "/instances/new"),
    NavItem("datasets", "Datasets", "/datasets"),
    NavItem("sweeps", "Sweeps", "/sweeps"),
    NavItem("billing", "Billing", "/billing"),
    NavItem("support", "Support", "/support"),
    NavItem("admin", "Admin", "/admin", admin_only=True),
)


def ago(moment: datetime | None) -> str:
    """'just now', '42 s ago', '5 min ago', '3 h ago', '2 d ago'."""
    if moment is None:
        return "—"
    seconds = int((utcnow() - moment).total_seconds())
    if seconds < 5:
        return "just now"
    if seconds < 60:
        return f"{seconds} s ago"
    if seconds < 3600:
        return f"{seconds // 60} min ago"
    if seconds < 86400:
        return f"{seconds // 3600} h ago"
    return f"{seconds // 86400} d ago"


def duration(start: datetime | None, end: datetime | None) -> str:
    """How long something ran (until now while it still runs)."""
    if start is None:
        return "—"
    return span(int(((end or utcnow()) - start).total_seconds()))


def utc(moment: datetime | None) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC") if moment else ""


def iso(moment: datetime | None) -> str:
    return moment.isoformat() if moment else ""


@cache
def asset(name: str) -> str:
    """The URL of a static file, versioned by its content so browsers never run stale JS."""
    digest = hashlib.sha256((STATIC_DIR / name).read_bytes()).hexdigest()[:10]
    return f"/static/{name}?v={digest}"


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES_DIR),
        autoescape=True,
        trim_blocks=True,
        lstrip_blocks=True,
        undefined=jinja2.StrictUndefined,
    )
    env.filters.update(
        ago=ago, duration=duration, utc=utc, iso=iso, span=span, own_command=own_command
    )
    env.globals.update(asset=asset)
    return env


templates = Jinja2Templates(env=_environment())


def render(
    request: Request,
    template: str,
    context: dict[str, Any] | None = None,
    *,
    user: UserPublic | None = None,
    page: str = "",
    status_code: int = 200,
    terminal: bool = False,
) -> HTMLResponse:
    """A console page: the template with the nav, the viewer and the security headers
    (`terminal`: a page that holds the terminal, with the policy xterm.js needs)."""
    nav = [item for item in NAV if user and (not item.admin_only or user.role == "admin")]
    full = {"user": user, "page": page, "nav": nav, **(context or {})}
    headers = TERMINAL_HEADERS if terminal else SECURITY_HEADERS
    return templates.TemplateResponse(
        request, template, full, status_code=status_code, headers=headers
    )
