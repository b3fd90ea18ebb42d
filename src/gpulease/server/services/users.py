"""Accounts: registration, password login, the first admin."""

from __future__ import annotations

import secrets

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from gpulease.core.errors import Conflict, InvalidInput, Unauthorized
from gpulease.core.names import NameRule
from gpulease.server.db import utcnow
from gpulease.server.orm import User
from gpulease.server.security import hash_password, verify_password
from gpulease.server.services import ledger
from gpulease.server.services.rows import find_all, find_one

USER_NAME = NameRule("user name", 2, 32)
MIN_PASSWORD = 8


def validate_name(name: str) -> str:
    return USER_NAME.check(name)


def validate_password(password: str) -> str:
    if len(password) < MIN_PASSWORD:
        raise InvalidInput(f"the password is too short: use at least {MIN_PASSWORD} characters")
    if len(password) > 1024:
        raise InvalidInput("the password is too long: use at most 1024 characters")
    return password


def create_user(
    session: Session,
    name: str,
    password: str,
    *,
    email: str | None = None,
    role: str = "user",
    signup_credit_micro: int = 0,
) -> User:
    validate_name(name)
    validate_password(password)
    if session.scalar(select(User.id).where(User.name == name)) is not None:
        raise Conflict(f"the user name {name!r} is taken; choose another")
    user = User(
        name=name,
        email=email,
        password_hash=hash_password(password),
        role=role,
        created_at=utcnow(),
    )
    session.add(user)
    try:
        session.flush()
    except IntegrityError:
        raise Conflict(f"the user name {name!r} is taken; choose another") from None
    if signup_credit_micro > 0:
        ledger.grant(
            session,
            user.id,
            signup_credit_micro,
            kind="signup_credit",
            key=f"signup:{user.id}",
            memo="sign-up credit",
        )
    return user


def authenticate(session: Session, name: str, password: str) -> User:
    user = session.scalar(select(User).where(User.name == name))
    if user is None or not verify_password(user.password_hash, password):
        raise Unauthorized("wrong user name or password")
    return user


def get_user_by_name(session: Session, name: str) -> User:
    return find_one(session, User, User.name == name, missing=f"no user named {name!r}")


def list_users(session: Session) -> list[User]:
    return find_all(session, User)


def ensure_admin(session: Session, name: str, password: str | None) -> str | None:
    """Create the first admin if there is none. Returns the generated password, if any."""
    if session.scalar(select(User.id).where(User.role == "admin")) is not None:
        return None
    generated = None
    if password is None:
        generated = password = secrets.token_urlsafe(12)
    create_user(session, name, password, role="admin")
    return generated
