"""Console sign-in: log in, register, log out. A session is a `session` token in a cookie."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated

from fastapi import Form, Query, Request, Response
from fastapi.responses import RedirectResponse
from pydantic import Field
from sqlalchemy.orm import Session

from gpulease.core.errors import GpuleaseError, InvalidInput
from gpulease.core.money import format_credits
from gpulease.server.orm import User
from gpulease.server.routers.auth_limits import auth_guard, client_address, guarded_login
from gpulease.server.routers.deps import SESSION_COOKIE, runtime, tx
from gpulease.server.routers.ui.forms import FormBody
from gpulease.server.routers.ui.guards import (
    LOGIN_PATH,
    SameSiteForm,
    clear_session_cookie,
    console_router,
    error_page,
    safe_next,
    set_session_cookie,
    viewer,
)
from gpulease.server.routers.ui.templating import render
from gpulease.server.services import console, tokens, users

router = console_router()

NextQuery = Annotated[str, Query(alias="next")]


class LoginForm(FormBody):
    name: str = ""
    password: str = ""
    next_: str = Field("/", alias="next")
    """Where to go once logged in (a path of this site: safe_next)."""


class RegisterForm(FormBody):
    name: str = ""
    password: str = ""
    password_repeat: str = ""


def _open_session(request: Request, session: Session, user: User) -> str:
    days = runtime(request).settings.session_days
    secret, _ = tokens.create_token(
        session, user, "web session", kind="session", ttl=timedelta(days=days)
    )
    return secret


def _signed_in(request: Request, secret: str, target: str) -> Response:
    response = RedirectResponse(safe_next(target), status_code=303)
    set_session_cookie(request, response, secret)
    return response


def _already_signed_in(request: Request) -> bool:
    if SESSION_COOKIE not in request.cookies:
        return False
    with tx(request) as session:
        return viewer(session, request) is not None


def _login_page(
    request: Request, *, next_: str, name: str = "", error: str = "", status_code: int = 200
) -> Response:
    signup = runtime(request).settings.signup_enabled
    context = {"next": safe_next(next_), "name": name, "error": error, "signup": signup}
    return render(request, "account/login.html", context, status_code=status_code)


def _register_page(
    request: Request, *, name: str = "", error: str = "", status_code: int = 200
) -> Response:
    rt = runtime(request)
    credit = format_credits(rt.settings.signup_credit_micro, rt.catalog.currency_symbol, 2)
    context = {"name": name, "error": error, "signup_credit": credit}
    return render(request, "account/register.html", context, status_code=status_code)


def _signup_closed(request: Request) -> Response:
    message = "This server does not take new sign-ups; ask an admin for an account."
    return error_page(request, "Sign-up is closed", message, user=None, status_code=403)


@router.get("/login")
def login_form(request: Request, next_: NextQuery = "/") -> Response:
    if _already_signed_in(request):
        return RedirectResponse(safe_next(next_), status_code=303)
    return _login_page(request, next_=next_)


@router.post("/login")
def login(request: Request, _: SameSiteForm, form: Annotated[LoginForm, Form()]) -> Response:
    name, password = form.name.strip(), form.password
    try:
        if not name or not password:
            raise InvalidInput("enter your user name and password")
        user = guarded_login(request, name, password)
        with tx(request) as session:
            secret = _open_session(request, session, user)
    except GpuleaseError as exc:
        return _login_page(
            request, next_=form.next_, name=name, error=exc.message, status_code=exc.status
        )
    return _signed_in(request, secret, form.next_)


@router.get("/register")
def register_form(request: Request) -> Response:
    if not runtime(request).settings.signup_enabled:
        return _signup_closed(request)
    if _already_signed_in(request):
        return RedirectResponse("/", status_code=303)
    return _register_page(request)


@router.post("/register")
def register(request: Request, _: SameSiteForm, form: Annotated[RegisterForm, Form()]) -> Response:
    settings = runtime(request).settings
    if not settings.signup_enabled:
        return _signup_closed(request)
    name, password = form.name.strip(), form.password
    try:
        if password != form.password_repeat:
            raise InvalidInput("the two passwords differ; type the same password twice")
        auth_guard(request).check_registration(client_address(request))
        with tx(request) as session:
            user = users.create_user(
                session, name, password, signup_credit_micro=settings.signup_credit_micro
            )
            secret = _open_session(request, session, user)
        auth_guard(request).registered(client_address(request))
    except GpuleaseError as exc:
        return _register_page(request, name=name, error=exc.message, status_code=exc.status)
    return _signed_in(request, secret, "/")


@router.post("/logout")
def logout(request: Request, _: SameSiteForm) -> Response:
    secret = request.cookies.get(SESSION_COOKIE)
    if secret:
        with tx(request) as session:
            row = console.session_token(session, secret)
            if row is not None and row.revoked_at is None:
                tokens.revoke_token(session, row.user, row.id)
    response = RedirectResponse(LOGIN_PATH, status_code=303)
    clear_session_cookie(request, response)
    return response
