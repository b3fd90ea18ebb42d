"""The console's Content-Security-Policy: scripts only from /static on every page; inline
styles only on the pages that hold the terminal (xterm.js writes its own style sheets)."""

from __future__ import annotations

from collections.abc import Callable

from factories import BrowserFactory, Caller, RunnerDouble, logged_in, make_running_instance


def test_only_the_terminal_pages_allow_inline_styles_and_none_inline_script(
    ann: Caller,
    browser: BrowserFactory,
    tick: Callable[[], None],
    runner_for: Callable[[int], RunnerDouble],
) -> None:
    instance_id, _ = make_running_instance(ann, tick, runner_for, "cats")
    client = logged_in(browser, "ann")

    def policy(path: str) -> dict[str, str]:
        r = client.get(path)
        assert r.status_code == 200, path
        directives = r.headers["content-security-policy"].split(";")
        return dict(d.strip().split(" ", 1) for d in directives)

    for path in (f"/instances/{instance_id}", f"/instances/{instance_id}/terminal"):
        terminal = policy(path)
        assert terminal["style-src"] == "'self' 'unsafe-inline'", path
        assert terminal["script-src"] == "'self'" and terminal["default-src"] == "'self'", path
    for path in ("/", "/catalog", "/instances/new", "/billing", "/settings/notifications"):
        plain = policy(path)
        assert plain["style-src"] == "'self'" and plain["script-src"] == "'self'", path
    assert "<script>" not in client.get(f"/instances/{instance_id}").text
