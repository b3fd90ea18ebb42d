"""from_attributes: a record from another object's attributes, the computed ones given."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from pydantic import BaseModel, ValidationError

from gpulease.core.records import field_names, from_attributes


@dataclass
class Row:
    id: int
    name: str
    secret: str


@dataclass(frozen=True)
class View:
    id: int
    name: str
    shown: str
    note: str = "none"


class Public(BaseModel):
    id: int
    name: str
    shown: str


def test_a_dataclass_takes_the_fields_of_the_same_name_and_the_given_ones() -> None:
    view = from_attributes(View, Row(7, "ann", "hunter2"), shown="ANN")
    assert view == View(7, "ann", "ANN")
    assert field_names(View) == ["id", "name", "shown", "note"]


def test_given_values_win_over_the_source_and_nothing_else_is_copied() -> None:
    public = from_attributes(Public, Row(7, "ann", "hunter2"), name="bob", shown="B")
    assert public.model_dump() == {"id": 7, "name": "bob", "shown": "B"}


def test_a_field_the_source_lacks_keeps_its_default_or_fails_loudly() -> None:
    assert from_attributes(View, Row(1, "a", "s"), shown="x").note == "none"
    with pytest.raises(TypeError, match="shown"):
        from_attributes(View, Row(1, "a", "s"))
    with pytest.raises(ValidationError, match="shown"):
        from_attributes(Public, Row(1, "a", "s"))


def test_only_records_have_fields() -> None:
    with pytest.raises(TypeError, match="neither a dataclass nor a pydantic model"):
        field_names(dict)
