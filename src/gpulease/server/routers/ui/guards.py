"""Who is looking at a console page, and whether a form post really came from the console."""

from __future__ import annotations

from datetime import timedelta
from urllib.parse import urlencode

from fastapi import Request, Response
from sqlalchemy.orm import Session

from gpulease.core.errors import Unauthorized
from gpulease.server.orm import User
from gpulease.server.routers.deps import SESSION_COOKIE, runtime
from gpulease.server.services import tokens

LOGIN_PATH = "/login"


def viewer(session: Session, request: Request) -> User | None:
    """The user behind the session cookie; None when there is none or it no longer works."""
    secret = request.cookies.get(SESSION_COOKIE)
    if not secret:
        return None
    try:
        return tokens.resolve_token(session, secret)
    except Unauthorized:
        return None


def safe_next(target: str | None) -> str:
    """Where to go after logging in: a path on this site, never another site."""
    if not target or not target.startswith("/") or target.startswith(("//", "/\\")):
        return "/"
    return target


def login_url(request: Request) -> str:
    here = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return LOGIN_PATH if here == "/" else f"{LOGIN_PATH}?{urlencode({'next': here})}"


def set_session_cookie(request: Request, response: Response, secret: str) -> None:
    days = runtime(request).settings.session_days
    response.set_cookie(
        SESSION_COOKIE,
        secret,
        max_age=int(timedelta(days=days).total_seconds()),
        path="/",
        secure=request.url.scheme == "https",
        httponly=True,
        samesite="lax",
    )


def clear_session_cookie(request: Request, response: Response) -> None:
    response.delete_cookie(
        SESSION_COOKIE,
        path="/",
        secure=request.url.scheme == "https",
        httponly=True,
        samesite="lax",
    )
