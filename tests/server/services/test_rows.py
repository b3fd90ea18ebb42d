"""services.rows: an owned row or a 404, the one row a condition picks, filtered lists, and
inserts, against the real database."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from gpulease.core.errors import NotFound
from gpulease.server.db import transaction
from gpulease.server.orm import Notification, User
from gpulease.server.runtime import Runtime
from gpulease.server.services.rows import find_all, find_one, get_owned, insert

AT = datetime(2026, 12, 1, 9, tzinfo=UTC)


def test_rows_belong_to_their_owner_and_anyone_elses_is_not_found(rt: Runtime) -> None:
    with transaction(rt.sessions) as session:
        ann = insert(session, User(name="ann", password_hash="-", created_at=AT))
        bob = insert(session, User(name="bob", password_hash="-", created_at=AT))
        first, second = (
            insert(session, Notification(user_id=ann.id, kind="t", message=m, created_at=AT))
            for m in ("first", "second")
        )
        assert first.id is not None and second.id > first.id

        assert get_owned(session, Notification, first.id, "gone", user_id=ann.id) is first
        for row_id, owner in ((first.id, bob.id), (second.id + 1000, ann.id)):
            with pytest.raises(NotFound, match="^you have no notification$"):
                get_owned(session, Notification, row_id, "you have no notification", user_id=owner)

        assert find_one(session, User, User.name == "bob", missing="no bob") is bob
        with pytest.raises(NotFound, match="^no user named 'cy'$"):
            find_one(session, User, User.name == "cy", missing="no user named 'cy'")

        assert find_all(session, Notification, Notification.user_id == ann.id) == [first, second]
        newest = find_all(
            session,
            Notification,
            Notification.user_id == ann.id,
            order_by=Notification.id.desc(),
            limit=1,
        )
        assert newest == [second]
        assert find_all(session, Notification, Notification.user_id == bob.id) == []
