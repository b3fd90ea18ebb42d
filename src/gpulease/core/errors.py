"""Errors that carry a message for people: what was wrong and what to do about it."""

from __future__ import annotations


class GpuleaseError(Exception):
    """Base of refusals that reach a user. `status` is the HTTP status the API answers with."""

    status = 400

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidInput(GpuleaseError):
    status = 422


class NotFound(GpuleaseError):
    status = 404


class Unauthorized(GpuleaseError):
    status = 401


class Forbidden(GpuleaseError):
    status = 403


class Conflict(GpuleaseError):
    status = 409


class Gone(GpuleaseError):
    """410: what was asked for existed and is no longer there."""

    status = 410


class PaymentRequired(GpuleaseError):
    status = 402


class Unavailable(GpuleaseError):
    status = 409
