"""Sweeps' pure rules: the space, grid expansion, seeded draws, substitution, median stopping."""

from __future__ import annotations

import math

import pytest

from gpulease.core.errors import InvalidInput
from gpulease.core.sweeps import (
    Curve,
    Range,
    StopRule,
    best_trial,
    expand,
    make_space,
    median_stop,
    parse_grid,
    parse_range,
    substitute,
    trial_env,
)


def test_a_grid_is_every_combination_first_parameter_slowest() -> None:
    space = make_space({"lr": ["0.1", "0.01"], "batch": ["32", "64", "128"]}, [], None, 0)
    trials = expand(space)
    assert len(trials) == space.trial_count() == 6
    assert trials[0] == {"lr": "0.1", "batch": "32"}
    assert trials[2] == {"lr": "0.1", "batch": "128"}
    assert trials[3] == {"lr": "0.01", "batch": "32"}
    assert len({tuple(t.items()) for t in trials}) == 6


def test_grid_and_range_texts() -> None:
    assert parse_grid("lr=0.1, 0.01,0.1") == ("lr", ("0.1", "0.01"))
    assert parse_range("lr=1e-4:1e-1:log") == Range("lr", 1e-4, 0.1, "log")
    assert parse_range("dropout=0:0.5") == Range("dropout", 0.0, 0.5, "linear")
    assert parse_range("layers=2:8:int") == Range("layers", 2, 8, "int")


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("lr", "NAME=V1,V2"),
        ("lr=", "empty value"),
        ("lr=0.1,,0.2", "empty value"),
        ("1lr=0.1", "not a parameter name"),
        ("path=a,b", "PATH, which the platform sets"),
        ("gpulease_x=1", "GPULEASE_X"),
    ],
)
def test_malformed_grids_are_refused(text: str, says: str) -> None:
    with pytest.raises(InvalidInput, match=says):
        parse_grid(text)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("lr=0.1", "NAME=LOW:HIGH"),
        ("lr=a:1", "'a' is not a number"),
        ("lr=1:0.1", "low end must be below"),
        ("lr=0:1:log", "above 0"),
        ("lr=1e-4:1e-1:cubic", "not one of linear, log, int"),
        ("n=1.5:4:int", "whole ends"),
        ("lr=1:inf", "not a finite number"),
        ("lr=1:2:log:x", "NAME=LOW:HIGH"),
    ],
)
def test_malformed_ranges_are_refused(text: str, says: str) -> None:
    with pytest.raises(InvalidInput, match=says):
        parse_range(text)


def test_random_draws_repeat_with_their_seed_and_stay_in_range() -> None:
    ranges = [Range("lr", 1e-4, 1e-1, "log"), Range("layers", 2, 4, "int")]
    space = make_space({"opt": ["adam", "sgd"]}, ranges, 200, seed=7)
    first, again = expand(space), expand(space)
    assert first == again
    assert first != expand(make_space({"opt": ["adam", "sgd"]}, ranges, 200, seed=8))
    lrs = [float(t["lr"]) for t in first]
    assert all(1e-4 <= v <= 1e-1 for v in lrs)
    # log-uniform: about half the draws below the geometric middle 10^-2.5
    below = sum(v < 10**-2.5 for v in lrs)
    assert 60 < below < 140
    assert {t["layers"] for t in first} == {"2", "3", "4"}
    assert {t["opt"] for t in first} == {"adam", "sgd"}


@pytest.mark.parametrize(
    ("grid", "ranges", "random", "says"),
    [
        ({}, [], None, "0 trials"),
        ({}, [Range("lr", 0, 1)], 0, "0 trials"),
        ({}, [Range("lr", 0, 1)], None, "needs --random N"),
        ({"a": [str(i) for i in range(40)], "b": [str(i) for i in range(30)]}, [], None, "40 × 30"),
        ({}, [Range("lr", 0, 1)], 1001, "1,001 trials, above the limit of 1,000"),
        ({"lr": ["1"]}, [Range("lr", 0, 1)], 3, "lr is given more than once"),
        ({"lr": []}, [], None, "no values"),
        ({}, [], 4, "give at least one --range or --grid"),
    ],
)
def test_bad_spaces_are_refused(
    grid: dict[str, list[str]], ranges: list[Range], random: int | None, says: str
) -> None:
    with pytest.raises(InvalidInput, match=says):
        make_space(grid, ranges, random, 0)


def test_a_grid_of_exactly_the_limit_is_fine() -> None:
    space = make_space(
        {"a": [str(i) for i in range(40)], "b": [str(i) for i in range(25)]}, [], None, 0
    )
    assert space.trial_count() == 1000


def test_values_reach_the_task_as_placeholders_and_upper_case_variables() -> None:
    params = {"lr": "0.01", "batch": "64"}
    run = "python train.py --lr ${lr} --batch $BATCH --home ${HOME} ${other}"
    assert (
        substitute(run, params)
        == "python train.py --lr 0.01 --batch $BATCH --home ${HOME} ${other}"
    )
    assert trial_env(params) == {"LR": "0.01", "BATCH": "64"}


def _curve(values: list[float], start: int = 1) -> Curve:
    return Curve(tuple(range(start, start + len(values))), tuple(values))


def test_median_rule_stops_a_trial_clearly_behind() -> None:
    good = [_curve([0.5, 0.6, 0.7, 0.8, 0.85, 0.9]), _curve([0.4, 0.6, 0.7, 0.75, 0.8, 0.85])]
    behind = _curve([0.1, 0.15, 0.2, 0.2, 0.25])
    verdict = median_stop(behind, good, "max", StopRule(min_steps=5, min_trials=2))
    assert verdict is not None
    # the others' running averages at step 5: mean of their first five values
    expected = sorted([sum([0.5, 0.6, 0.7, 0.8, 0.85]) / 5, sum([0.4, 0.6, 0.7, 0.75, 0.8]) / 5])
    assert verdict.step == 5
    assert verdict.best == 0.25
    assert math.isclose(verdict.median, sum(expected) / 2)
    assert verdict.peers == 2
    assert "below the median" in verdict.reason("val_acc", "max")


def test_median_rule_keeps_leaders_and_waits_for_enough_steps_and_trials() -> None:
    rule = StopRule(min_steps=5, min_trials=2)
    others = [_curve([0.5] * 6), _curve([0.6] * 6)]
    assert median_stop(_curve([0.1, 0.9, 0.2, 0.2, 0.2]), others, "max", rule) is None  # best 0.9
    assert median_stop(_curve([0.1] * 4), others, "max", rule) is None  # 4 < min_steps
    assert median_stop(_curve([0.1] * 5), others[:1], "max", rule) is None  # 1 < min_trials
    # peers that have not reached the trial's step do not count
    short = [_curve([0.5] * 3), _curve([0.6] * 3)]
    assert median_stop(_curve([0.1] * 5), short, "max", rule) is None


def test_median_rule_for_a_metric_to_minimise() -> None:
    rule = StopRule(min_steps=3, min_trials=2)
    others = [_curve([1.0, 0.8, 0.6]), _curve([1.1, 0.9, 0.7])]
    assert median_stop(_curve([2.0, 1.9, 1.8]), others, "min", rule) is not None
    assert median_stop(_curve([0.9, 0.5, 0.4]), others, "min", rule) is None


def test_best_trial_by_goal() -> None:
    curves = {1: _curve([0.2, 0.9]), 2: _curve([0.95, 0.3]), 3: _curve([0.1])}
    assert best_trial(curves, "max") == 2
    assert best_trial(curves, "min") == 3
    assert best_trial({}, "max") is None
