"""Build a record (a dataclass or a pydantic model) from another object's attributes.

Services turn ORM rows into view dataclasses and routers turn those into wire models; most
fields carry over under the same name. `from_attributes` copies those and takes the rest as
keywords, so a conversion names only what it computes.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

T = TypeVar("T")


def field_names(cls: type[Any]) -> list[str]:
    """The fields of a dataclass or a pydantic model class, in declaration order."""
    if dataclasses.is_dataclass(cls):
        return [f.name for f in dataclasses.fields(cls)]
    model_fields = getattr(cls, "model_fields", None)
    if isinstance(model_fields, dict):
        return list(model_fields)
    raise TypeError(f"{cls.__name__} is neither a dataclass nor a pydantic model")


def from_attributes(cls: type[T], source: object, **given: Any) -> T:
    """cls built from `given` and, for each other field, source's attribute of that name.

    A field that source lacks is left to its default (a required one then fails in cls's
    constructor, naming the field), so a misspelt or renamed field is not silently copied.
    """
    copied = {
        name: getattr(source, name)
        for name in field_names(cls)
        if name not in given and hasattr(source, name)
    }
    return cls(**copied, **given)
