"""The console's datasets page: your datasets, your storage, and an upload form for small sets."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import APIRouter, Request, Response
from fastapi.responses import RedirectResponse
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException

from gpulease.core.datasets import format_bytes
from gpulease.core.errors import GpuleaseError, InvalidInput
from gpulease.schemas.accounts import UserPublic
from gpulease.schemas.datasets import DatasetPublic
from gpulease.server.orm import User
from gpulease.server.routers.deps import runtime, same_origin, tx
from gpulease.server.routers.ui.account import cross_site_refusal
from gpulease.server.routers.ui.guards import login_url, viewer
from gpulease.server.routers.ui.templating import render
from gpulease.server.services.datasets import console_push, library, quota

router = APIRouter()

PATH = "/datasets"


@dataclass(frozen=True)
class DatasetRow:
    dataset: DatasetPublic
    size: str
    mounted_by: list[str]


def _page(
    request: Request,
    user: User,
    *,
    name: str = "",
    error: str = "",
    notice: str = "",
    status_code: int = 200,
) -> Response:
    settings = runtime(request).settings
    with tx(request) as session:
        rows = [
            DatasetRow(
                DatasetPublic.model_validate(d),
                format_bytes(d.size_bytes),
                library.mounting_instances(session, d),
            )
            for d in library.list_datasets(session, user)
        ]
        used = quota.usage(session, user.id)
    context = {
        "rows": rows,
        "used": format_bytes(used),
        "quota": format_bytes(settings.storage_quota_bytes),
        "used_percent": min(100, used * 100 // max(settings.storage_quota_bytes, 1)),
        "max_files": console_push.MAX_FILES,
        "max_bytes": format_bytes(console_push.MAX_BYTES),
        "name": name,
        "error": error,
        "notice": notice,
    }
    return render(
        request,
        "datasets/page.html",
        context,
        user=UserPublic.model_validate(user),
        page="datasets",
        status_code=status_code,
    )


def _viewer(request: Request) -> User | None:
    with tx(request) as session:
        return viewer(session, request)


@router.get(PATH)
def datasets_page(request: Request, pushed: str = "", removed: str = "") -> Response:
    user = _viewer(request)
    if user is None:
        return RedirectResponse(login_url(request), status_code=303)
    notice = ""
    if pushed:
        notice = f"Uploaded {pushed}; mount it with `--dataset {pushed}`."
    elif removed:
        notice = f"Removed {removed}."
    return _page(request, user, notice=notice)


def dataset_paths(names: list[str]) -> list[str]:
    """Paths inside the dataset from the browser's file names: a folder upload names files
    'folder/sub/file'; the chosen folder itself is dropped."""
    parts = [name.replace("\\", "/").split("/") for name in names]
    tops = {p[0] for p in parts}
    if parts and all(len(p) > 1 for p in parts) and len(tops) == 1 and not tops & {"", ".", ".."}:
        parts = [p[1:] for p in parts]
    return ["/".join(p) for p in parts]


@router.post(PATH)
async def upload(request: Request) -> Response:
    """The upload form: multipart with `name` and `files` (several, or a whole folder)."""
    user = await run_in_threadpool(_viewer, request)
    if user is None:
        return RedirectResponse(login_url(request), status_code=303)
    if not same_origin(request):
        return cross_site_refusal(request)
    name = ""
    error, status = "", 200
    try:
        async with request.form(
            max_files=console_push.MAX_FILES + 1, max_fields=20
        ) as form:  # closes the spooled files
            name = str(form.get("name") or "").strip()
            picked = [f for f in form.getlist("files") if isinstance(f, UploadFile) and f.filename]
            names = dataset_paths([f.filename or "" for f in picked])
            if not name and picked and "/" in (picked[0].filename or ""):
                name = (picked[0].filename or "").split("/")[0].lower()
            contents = [await f.read() for f in picked]
        if not name:
            raise InvalidInput("give the dataset a name")
        rt = runtime(request)
        assert rt.vault is not None
        await run_in_threadpool(
            console_push.push_files,
            rt.sessions,
            rt.vault,
            user,
            name,
            list(zip(names, contents, strict=True)),
            quota_bytes=rt.settings.storage_quota_bytes,
        )
    except GpuleaseError as exc:
        error, status = exc.message, exc.status
    except HTTPException as exc:  # the multipart parser's refusals (too many files, say)
        error, status = f"the upload could not be read: {exc.detail}", 400
    if error:
        return await run_in_threadpool(
            lambda: _page(request, user, name=name, error=error, status_code=status)
        )
    return RedirectResponse(f"{PATH}?pushed={name}", status_code=303)


@router.post(PATH + "/{name}/delete")
def delete(name: str, request: Request) -> Response:
    user = _viewer(request)
    if user is None:
        return RedirectResponse(login_url(request), status_code=303)
    if not same_origin(request):
        return cross_site_refusal(request)
    rt = runtime(request)
    assert rt.vault is not None
    try:
        library.remove_dataset(rt.sessions, rt.vault, user, name)
    except GpuleaseError as exc:
        return _page(request, user, error=exc.message, status_code=exc.status)
    return RedirectResponse(f"{PATH}?removed={name}", status_code=303)
