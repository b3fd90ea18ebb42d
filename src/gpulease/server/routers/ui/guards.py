"""The one door of every console page and form: who is looking, whether a form post really
came from the console, the request's transaction, and what a refusal looks like.

Routes declare what they need as a parameter and get it resolved before they run:

- `PageViewer` (GET pages): the cookie's user, in the request's transaction; logged out,
  the login page (with `next`). `PartialViewer` answers 401 instead (live.js reloads).
- `FormViewer` (POST forms): the same, after the origin check (routers/deps.same_origin).
- `AdminPage`, `AdminForm`: as above, and a 404 to a signed-in user who is not an admin.
- `DetachedForm`: a form whose service opens its own transactions (blob I/O): the viewer
  is read in a transaction that has ended before the route runs.
- `SameSiteForm`: the forms that need no viewer (log in, register, log out).

A route answers with `console.act(...)`: the action runs in a savepoint; a domain refusal
(`gpulease.core.errors`) rolls it back and re-renders the page with the message and the
refusal's status; success redirects (303). The refusals above are raised as
`ConsoleRefusal` and answered by `ConsoleRoute`, the route class of every console router.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from datetime import timedelta
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, BackgroundTasks, Depends, Request, Response
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.routing import APIRoute
from sqlalchemy.orm import Session
from starlette.requests import HTTPConnection

from gpulease.core.errors import GpuleaseError, Unauthorized
from gpulease.schemas.accounts import UserPublic
from gpulease.server.orm import User
from gpulease.server.routers.deps import SESSION_COOKIE, SessionDep, runtime, same_origin, tx
from gpulease.server.routers.ui.templating import render
from gpulease.server.runtime import Runtime
from gpulease.server.services import tokens

LOGIN_PATH = "/login"


class ConsoleRefusal(Exception):
    """Raised by a console dependency: answer with `response` instead of running the route."""

    def __init__(self, response: Response) -> None:
        super().__init__(response.status_code)
        self.response = response


class ConsoleRoute(APIRoute):
    """A console route: a `ConsoleRefusal` from its dependencies becomes its answer."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def guarded(request: Request) -> Response:
            try:
                return await handler(request)
            except ConsoleRefusal as refusal:
                return refusal.response

        return guarded


def console_router(**options: Any) -> APIRouter:
    """An APIRouter for console pages (kept out of the OpenAPI schema)."""
    return APIRouter(route_class=ConsoleRoute, include_in_schema=False, **options)


# -- who is looking -----------------------------------------------------------------------


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


def to_login(request: Request) -> Response:
    """The login page, coming back here after; a cookie that no longer works is dropped."""
    response = RedirectResponse(login_url(request), status_code=303)
    if SESSION_COOKIE in request.cookies:
        clear_session_cookie(request, response)
    return response


def error_page(
    request: Request, title: str, message: str, *, user: UserPublic | None, status_code: int
) -> HTMLResponse:
    context = {"title": title, "message": message}
    return render(request, "errors/error.html", context, user=user, status_code=status_code)


def cross_site_refusal(request: Request) -> Response:
    """The answer to a form or socket that another site opened with the visitor's cookie."""
    return error_page(
        request,
        "Request refused",
        "This form was sent from another site, so it was refused. "
        "Open the console at its own address and try again.",
        user=None,
        status_code=403,
    )


@dataclass
class Viewer:
    """The signed-in user of a console request, and how to answer them."""

    request: Request
    user: User
    background: BackgroundTasks

    @property
    def public(self) -> UserPublic:
        return UserPublic.model_validate(self.user)

    @property
    def runtime(self) -> Runtime:
        return runtime(self.request)

    @property
    def is_admin(self) -> bool:
        return self.user.role == "admin"

    def render(
        self,
        template: str,
        context: dict[str, Any],
        *,
        page: str = "",
        status_code: int = 200,
        terminal: bool = False,
    ) -> HTMLResponse:
        return render(
            self.request,
            template,
            context,
            user=self.public,
            page=page,
            status_code=status_code,
            terminal=terminal,
        )

    def form_page(
        self,
        template: str,
        context: dict[str, Any],
        refusal: GpuleaseError | None,
        *,
        page: str = "",
        terminal: bool = False,
    ) -> HTMLResponse:
        """A page with a form: a refusal's message as `error`, and the refusal's status."""
        full = {**context, "error": refusal.message if refusal else ""}
        status = refusal.status if refusal else 200
        return self.render(template, full, page=page, status_code=status, terminal=terminal)

    def error(self, title: str, message: str, status_code: int) -> HTMLResponse:
        """The error page, with the nav of the signed-in user."""
        return error_page(self.request, title, message, user=self.public, status_code=status_code)

    def refused(self, exc: GpuleaseError, title: str = "Not changed") -> HTMLResponse:
        return self.error(title, exc.message, exc.status)

    def after(self, task: Callable[[], None]) -> None:
        """Run task once the response is out, so after the transaction has committed
        (waking a reconciler before would let it read the old state)."""
        self.background.add_task(task)

    def wake_reconcilers(self) -> None:
        self.after(self.request.app.state.wake_reconcilers)


Refused = Callable[[GpuleaseError], Response]


@dataclass
class ConsolePage(Viewer):
    """A viewer inside the request's one transaction (committed before the response)."""

    session: Session

    def act(self, action: Callable[[], str], refused: Refused | None = None) -> Response:
        """Run a form's action (it returns where to go next) in a savepoint, then 303 there.
        A domain refusal undoes the action and answers refused(exc): the form's page again
        with the message, or by default an error page saying what was not changed."""
        try:
            with self.session.begin_nested():
                target = action()
        except GpuleaseError as exc:
            return (refused or self.refused)(exc)
        return RedirectResponse(target, status_code=303)


def _not_admin(request: Request, user: User) -> ConsoleRefusal:
    """A signed-in user who is not an admin gets the 404 of a page that does not exist."""
    public = UserPublic.model_validate(user)
    message = f"There is no page {request.url.path}."
    return ConsoleRefusal(
        error_page(request, "Page not found", message, user=public, status_code=404)
    )


def same_site(connection: HTTPConnection) -> bool:
    """The console's one origin check (routers/deps.same_origin), for forms and sockets: the
    Origin or Referer must name this server, and one of them must be there when the
    request carries the session cookie (every browser sends Origin on a POST and on a
    WebSocket handshake)."""
    return same_origin(connection, require_header=SESSION_COOKIE in connection.cookies)


def require_same_site(request: Request) -> None:
    """A form post that fails the origin check is refused (403) before anything else."""
    if not same_site(request):
        raise ConsoleRefusal(cross_site_refusal(request))


def _signed_in(session: Session, request: Request, *, admin: bool, partial: bool) -> User:
    user = viewer(session, request)
    if user is None:
        if partial:
            raise ConsoleRefusal(Response("log in again", status_code=401, media_type="text/plain"))
        raise ConsoleRefusal(to_login(request))
    if admin and user.role != "admin":
        raise _not_admin(request, user)
    return user


def _dependency(*, admin: bool = False, partial: bool = False) -> Callable[..., ConsolePage]:
    def resolve(request: Request, session: SessionDep, background: BackgroundTasks) -> ConsolePage:
        user = _signed_in(session, request, admin=admin, partial=partial)
        return ConsolePage(request, user, background, session)

    return resolve


def _detached(request: Request, background: BackgroundTasks) -> Viewer:
    with tx(request) as session:
        user = _signed_in(session, request, admin=False, partial=False)
    return Viewer(request, user, background)


SameSite = Depends(require_same_site)
# The origin check is a parameter of its own, before the viewer: a cross-site post is
# refused before anything reads the database.
_page = _dependency()
_admin = _dependency(admin=True)
_partial = _dependency(partial=True)


def _form(
    _: Annotated[None, SameSite], page: Annotated[ConsolePage, Depends(_page)]
) -> ConsolePage:
    return page


def _admin_form(
    _: Annotated[None, SameSite], page: Annotated[ConsolePage, Depends(_admin)]
) -> ConsolePage:
    return page


def _detached_form(
    _: Annotated[None, SameSite], who: Annotated[Viewer, Depends(_detached)]
) -> Viewer:
    return who


PageViewer = Annotated[ConsolePage, Depends(_page)]
PartialViewer = Annotated[ConsolePage, Depends(_partial)]
AdminPage = Annotated[ConsolePage, Depends(_admin)]
FormViewer = Annotated[ConsolePage, Depends(_form)]
AdminForm = Annotated[ConsolePage, Depends(_admin_form)]
DetachedForm = Annotated[Viewer, Depends(_detached_form)]
SameSiteForm = Annotated[None, SameSite]


# -- the session cookie -------------------------------------------------------------------


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
