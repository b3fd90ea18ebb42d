"""Template recipes: the built-in set, cache keys, pip options, JSON round trip."""

from __future__ import annotations

import hashlib
import json

import pytest

from gpulease.core.errors import InvalidInput
from gpulease.core.templates import BUILTIN_TEMPLATES, Template, get_template


def test_the_builtin_set_covers_python_pytorch_builds_and_jax() -> None:
    names = {t.name for t in BUILTIN_TEMPLATES}
    assert {
        "python",
        "pytorch",
        "pytorch-cpu",
        "pytorch-cpu-vision",
        "pytorch-cu130",
        "pytorch-cu130-vision",
        "pytorch-cu126",
        "pytorch-cu126-vision",
        "jax",
    } <= names
    assert len(names) == len(BUILTIN_TEMPLATES)
    for t in BUILTIN_TEMPLATES:
        vision = any(p.startswith("torchvision==") for p in t.packages)
        assert vision is t.name.endswith("-vision"), t.name
        assert all("==" in p for p in t.packages if p.startswith(("torch", "jax"))), t.name


def test_cuda_builds_and_labels() -> None:
    assert get_template("pytorch-cu130").label == "PyTorch 2.14 cu130"
    assert get_template("pytorch-cu126").cuda == "12.6"
    assert get_template("pytorch-cpu").cuda is None
    assert get_template("jax").label == "JAX 0.10"
    assert get_template("python").label == "Python 3.11"


def test_plain_recipes_keep_their_cache_key() -> None:
    """Adding pip options must not move the environments already built for old recipes."""
    pytorch = get_template("pytorch")
    old = {"python": pytorch.python, "packages": sorted(pytorch.packages)}
    expected = hashlib.sha256(json.dumps(old, sort_keys=True).encode()).hexdigest()[:16]
    assert pytorch.recipe_key() == expected


def test_the_extra_index_is_part_of_the_recipe_and_of_pip_options() -> None:
    cpu = get_template("pytorch-cpu")
    assert cpu.pip_options() == ["--extra-index-url", "https://download.pytorch.org/whl/cpu"]
    bare = Template(cpu.name, "", cpu.python, cpu.packages, cpu.cuda)
    assert bare.recipe_key() != cpu.recipe_key()
    assert get_template("pytorch").pip_options() == []


def test_json_round_trip_keeps_every_field() -> None:
    for t in BUILTIN_TEMPLATES:
        assert Template.from_json(json.loads(json.dumps(t.to_json()))) == t
    legacy = {"name": "x", "python": "3.11", "packages": ["six"], "cuda": None}
    assert Template.from_json(legacy).extra_index_urls == ()


def test_unknown_names_list_the_choices() -> None:
    with pytest.raises(InvalidInput, match="choose one of: python, pytorch"):
        get_template("tensorflow")
