"""The console's datasets page: your datasets, your storage, and an upload form for small sets."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request, Response
from fastapi.responses import RedirectResponse
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException

from gpulease.core.datasets import format_bytes
from gpulease.core.errors import GpuleaseError, InvalidInput
from gpulease.schemas.datasets import DatasetPublic
from gpulease.server.routers.deps import tx
from gpulease.server.routers.ui.guards import DetachedForm, PageViewer, Viewer, console_router
from gpulease.server.services.datasets import console_push, library, quota

router = console_router()

PATH = "/datasets"


@dataclass(frozen=True)
class DatasetRow:
    dataset: DatasetPublic
    size: str
    mounted_by: list[str]


def _page(
    console: Viewer,
    session: Session,
    *,
    name: str = "",
    refusal: GpuleaseError | None = None,
    notice: str = "",
) -> Response:
    settings = console.runtime.settings
    rows = [
        DatasetRow(
            DatasetPublic.model_validate(d),
            format_bytes(d.size_bytes),
            library.mounting_instances(session, d),
        )
        for d in library.list_datasets(session, console.user)
    ]
    used = quota.usage(session, console.user.id)
    context = {
        "rows": rows,
        "used": format_bytes(used),
        "quota": format_bytes(settings.storage_quota_bytes),
        "used_percent": min(100, used * 100 // max(settings.storage_quota_bytes, 1)),
        "max_files": console_push.MAX_FILES,
        "max_bytes": format_bytes(console_push.MAX_BYTES),
        "name": name,
        "notice": notice,
    }
    return console.form_page("datasets/page.html", context, refusal, page="datasets")


def _refused(console: Viewer, refusal: GpuleaseError, name: str = "") -> Response:
    """The page again with the refusal, read in a transaction of its own (the form's
    service has ended its own)."""
    with tx(console.request) as session:
        return _page(console, session, name=name, refusal=refusal)


@router.get(PATH)
def datasets_page(console: PageViewer, pushed: str = "", removed: str = "") -> Response:
    notice = ""
    if pushed:
        notice = f"Uploaded {pushed}; mount it with `--dataset {pushed}`."
    elif removed:
        notice = f"Removed {removed}."
    return _page(console, console.session, notice=notice)


def dataset_paths(names: list[str]) -> list[str]:
    """Paths inside the dataset from the browser's file names: a folder upload names files
    'folder/sub/file'; the chosen folder itself is dropped."""
    parts = [name.replace("\\", "/").split("/") for name in names]
    tops = {p[0] for p in parts}
    if parts and all(len(p) > 1 for p in parts) and len(tops) == 1 and not tops & {"", ".", ".."}:
        parts = [p[1:] for p in parts]
    return ["/".join(p) for p in parts]


@router.post(PATH)
async def upload(request: Request, console: DetachedForm) -> Response:
    """The upload form: multipart with `name` and `files` (several, or a whole folder)."""
    name = ""
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
        rt = console.runtime
        assert rt.vault is not None
        await run_in_threadpool(
            console_push.push_files,
            rt.sessions,
            rt.vault,
            console.user,
            name,
            list(zip(names, contents, strict=True)),
            quota_bytes=rt.settings.storage_quota_bytes,
        )
    except GpuleaseError as exc:
        return await run_in_threadpool(_refused, console, exc, name)
    except HTTPException as exc:  # the multipart parser's refusals (too many files, say)
        unreadable = GpuleaseError(f"the upload could not be read: {exc.detail}")  # a 400
        return await run_in_threadpool(_refused, console, unreadable, name)
    return RedirectResponse(f"{PATH}?pushed={name}", status_code=303)


@router.post(PATH + "/{name}/delete")
def delete(name: str, console: DetachedForm) -> Response:
    rt = console.runtime
    assert rt.vault is not None
    try:
        library.remove_dataset(rt.sessions, rt.vault, console.user, name)
    except GpuleaseError as exc:
        return _refused(console, exc)
    return RedirectResponse(f"{PATH}?removed={name}", status_code=303)
