"""JupyterLab's tickets and cookies: a new ticket deletes those that expired or were used."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select, update

from factories import Caller
from gpulease.server.db import utcnow
from gpulease.server.orm import ApiToken, User
from gpulease.server.runtime import Runtime
from gpulease.server.security import hash_token
from gpulease.server.services import jupyter_access


def _rows(rt: Runtime) -> dict[str, tuple[str, bool]]:
    """token hash -> (kind, used) of every api_tokens row."""
    with rt.sessions.begin() as session:
        return {
            row.token_hash: (row.kind, row.revoked_at is not None)
            for row in session.scalars(select(ApiToken))
        }


def test_a_new_ticket_deletes_expired_and_used_ones_and_keeps_live_ones(
    rt: Runtime, ann: Caller, bob: Caller
) -> None:
    with rt.sessions.begin() as session:
        users = {u.name: u for u in session.scalars(select(User))}
        expired = jupyter_access.mint_ticket(session, users["ann"], 1)
        used = jupyter_access.mint_ticket(session, users["bob"], 2)
        third = jupyter_access.mint_ticket(session, users["ann"], 3)
        live = jupyter_access.mint_ticket(session, users["bob"], 4)
        cookie = jupyter_access.redeem_ticket(session, used, 2)
        stale_cookie = jupyter_access.redeem_ticket(session, third, 3)
        assert cookie is not None and stale_cookie is not None
    past = utcnow() - timedelta(seconds=1)
    with rt.sessions.begin() as session:
        session.execute(
            update(ApiToken)
            .where(ApiToken.token_hash.in_([hash_token(expired), hash_token(stale_cookie)]))
            .values(expires_at=past)
        )
    before = _rows(rt)
    assert {
        hash_token(s) for s in (expired, used, third, live, cookie, stale_cookie)
    } <= before.keys()

    with rt.sessions.begin() as session:
        fresh = jupyter_access.mint_ticket(session, users["ann"], 5)

    after = _rows(rt)
    for gone in (expired, used, third, stale_cookie):
        assert hash_token(gone) not in after
    for kept in (live, cookie, fresh, ann.token, bob.token):
        assert hash_token(kept) in after
    # the users' own tokens and sessions are not the pruner's
    assert sum(kind not in jupyter_access.KINDS for kind, _ in after.values()) == sum(
        kind not in jupyter_access.KINDS for kind, _ in before.values()
    )
    with rt.sessions.begin() as session:
        assert jupyter_access.resolve_access(session, cookie, 2) is not None


def test_pruning_is_batched(rt: Runtime, ann: Caller, monkeypatch: pytest.MonkeyPatch) -> None:
    with rt.sessions.begin() as session:
        user = session.scalars(select(User).where(User.name == "ann")).one()
        for instance_id in range(5):
            jupyter_access.mint_ticket(session, user, instance_id)
        session.execute(
            update(ApiToken)
            .where(ApiToken.kind == jupyter_access.TICKET_KIND)
            .values(expires_at=utcnow() - timedelta(seconds=1))
        )
    monkeypatch.setattr(jupyter_access, "PRUNE_BATCH", 3)
    with rt.sessions.begin() as session:
        assert jupyter_access.prune(session, utcnow()) == 3
        assert jupyter_access.prune(session, utcnow()) == 2
        assert jupyter_access.prune(session, utcnow()) == 0
