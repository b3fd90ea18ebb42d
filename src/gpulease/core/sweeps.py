"""Hyperparameter sweeps as pure logic: the search space (`--grid`, `--range`), the trials it
expands to (every combination of a grid, or N draws from a seed), how a trial's task receives
its values, the best trial by a metric, and the median stopping rule.

A trial's values reach its task two ways (docs/sweeps.md): as environment variables named
after the parameter in upper case (`lr` → `LR`), and written into the task's `run:`,
`setup:` and `envs:` wherever `${lr}` (the name as the sweep wrote it) appears.
"""

from __future__ import annotations

import itertools
import math
import random
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpulease.core.errors import InvalidInput

MAX_TRIALS = 1000
MAX_PARAMS = 20
MAX_VALUES = 1000
MAX_VALUE_LEN = 200
SCALES = ("linear", "log", "int")
GOALS = ("max", "min")
PARAM_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,31}$")
# Variables the platform sets itself: a parameter may not take their names.
_RESERVED_PREFIXES = ("GPULEASE_", "SKYPILOT_")
_RESERVED_NAMES = {"PATH", "HOME", "USER", "SHELL", "PWD", "CUDA_VISIBLE_DEVICES"}


@dataclass(frozen=True)
class Range:
    """One parameter drawn from [low, high]: uniformly (linear), uniformly in its logarithm
    (log: learning rates), or as a whole number with both ends included (int)."""

    name: str
    low: float
    high: float
    scale: str = "linear"

    def draw(self, rng: random.Random) -> str:
        if self.scale == "int":
            return str(rng.randint(int(self.low), int(self.high)))
        if self.scale == "log":
            value = math.exp(rng.uniform(math.log(self.low), math.log(self.high)))
        else:
            value = rng.uniform(self.low, self.high)
        return f"{value:.6g}"

    def __str__(self) -> str:
        return f"{self.name}={self.low:g}:{self.high:g}:{self.scale}"


@dataclass(frozen=True)
class Space:
    """What a sweep searches: grid parameters (each with its values), ranges, and `random`,
    the number of random trials (None: every combination of the grid)."""

    grid: tuple[tuple[str, tuple[str, ...]], ...] = ()
    ranges: tuple[Range, ...] = ()
    random: int | None = None
    seed: int = 0

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.grid] + [r.name for r in self.ranges]

    def trial_count(self) -> int:
        if self.random is not None:
            return self.random
        return math.prod(len(values) for _, values in self.grid) if self.grid else 0


def check_name(name: str, where: str) -> str:
    if not PARAM_NAME.match(name):
        raise InvalidInput(
            f"{where}: {name!r} is not a parameter name; start with a letter or _, then up to "
            "31 letters, digits or _ (it becomes an environment variable: lr → LR)"
        )
    upper = name.upper()
    if upper in _RESERVED_NAMES or upper.startswith(_RESERVED_PREFIXES):
        raise InvalidInput(
            f"{where}: {name!r} would set the variable {upper}, which the platform sets itself; "
            "name the parameter otherwise"
        )
    return name


def _check_value(value: str, where: str) -> str:
    if not value:
        raise InvalidInput(f"{where}: an empty value; write values separated by commas")
    if len(value) > MAX_VALUE_LEN:
        raise InvalidInput(f"{where}: a value is longer than {MAX_VALUE_LEN} characters")
    if not value.isprintable():
        raise InvalidInput(f"{where}: {value!r} holds a control character")
    return value


def parse_grid(text: str) -> tuple[str, tuple[str, ...]]:
    """`lr=0.1,0.01` → ("lr", ("0.1", "0.01")): the values as written, in order, once each."""
    name, sep, rest = text.partition("=")
    where = f"--grid {text!r}"
    if not sep:
        raise InvalidInput(f"{where}: write NAME=V1,V2,..., e.g. --grid lr=0.1,0.01")
    check_name(name.strip(), where)
    values = tuple(dict.fromkeys(_check_value(v.strip(), where) for v in rest.split(",")))
    return name.strip(), values


def _number(text: str, where: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise InvalidInput(f"{where}: {text!r} is not a number") from None
    if not math.isfinite(value):
        raise InvalidInput(f"{where}: {text!r} is not a finite number")
    return value


def make_range(name: str, low: float, high: float, scale: str, where: str) -> Range:
    """A Range whose ends make sense for its scale, or a refusal that says why."""
    check_name(name, where)
    if scale not in SCALES:
        raise InvalidInput(f"{where}: the scale {scale!r} is not one of {', '.join(SCALES)}")
    if not (math.isfinite(low) and math.isfinite(high)) or not low < high:
        raise InvalidInput(f"{where}: the low end must be below the high end (LOW:HIGH)")
    if scale == "log" and low <= 0:
        raise InvalidInput(f"{where}: a log range needs a low end above 0, e.g. 1e-4:1e-1:log")
    if scale == "int" and (low != int(low) or high != int(high)):
        raise InvalidInput(f"{where}: an int range needs whole ends, e.g. layers=2:8:int")
    return Range(name, low, high, scale)


def parse_range(text: str) -> Range:
    """`lr=1e-4:1e-1:log`, `dropout=0:0.5` (linear), `layers=2:8:int`."""
    name, sep, rest = text.partition("=")
    where = f"--range {text!r}"
    parts = rest.split(":")
    if not sep or len(parts) not in (2, 3):
        raise InvalidInput(
            f"{where}: write NAME=LOW:HIGH[:linear|log|int], e.g. --range lr=1e-4:1e-1:log"
        )
    scale = parts[2].strip() if len(parts) == 3 else "linear"
    low, high = (_number(p.strip(), where) for p in parts[:2])
    return make_range(name.strip(), low, high, scale, where)


def make_space(
    grid: Mapping[str, Sequence[str]],
    ranges: Sequence[Range],
    trials: int | None,
    seed: int,
) -> Space:
    """The space of a sweep, checked: at least one trial, at most MAX_TRIALS, each parameter
    once, ranges only with random trials."""
    names = [*grid, *(r.name for r in ranges)]
    for name in grid:
        check_name(name, f"grid parameter {name!r}")
    if len(names) > MAX_PARAMS:
        raise InvalidInput(f"a sweep takes at most {MAX_PARAMS} parameters; it has {len(names)}")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise InvalidInput(
            f"parameter {', '.join(repeated)} is given more than once; give each parameter in "
            "one --grid or one --range"
        )
    for name, values in grid.items():
        if not values:
            raise InvalidInput(f"--grid {name}: no values; write --grid {name}=V1,V2")
        if len(values) > MAX_VALUES:
            raise InvalidInput(f"--grid {name}: at most {MAX_VALUES} values")
        for value in values:
            _check_value(value, f"--grid {name}")
    space = Space(
        grid=tuple((n, tuple(dict.fromkeys(v))) for n, v in grid.items()),
        ranges=tuple(ranges),
        random=trials,
        seed=seed,
    )
    if not names and trials:
        raise InvalidInput(
            "--random N draws values of parameters: give at least one --range or --grid"
        )
    if trials is None and ranges:
        raise InvalidInput(
            "a --range is drawn from, so it needs --random N (the number of trials); "
            "for fixed values use --grid"
        )
    count = space.trial_count()
    if count < 1:
        raise InvalidInput(
            "this sweep has 0 trials: give --grid NAME=V1,V2 (every combination is a trial) "
            "or --random N with --range or --grid"
        )
    if count > MAX_TRIALS:
        shape = " × ".join(str(len(v)) for _, v in space.grid)
        what = f"the grid is {shape} = {count:,} trials" if trials is None else f"{count:,} trials"
        raise InvalidInput(
            f"{what}, above the limit of {MAX_TRIALS:,}; use fewer values, or --random N to "
            "sample N of them"
        )
    return space


def expand(space: Space) -> list[dict[str, str]]:
    """Each trial's values, in trial order. A grid: every combination, the first parameter
    varying slowest. Random: `random` draws from `seed` (the same seed, the same trials),
    a grid parameter taking one of its values with equal chance."""
    if space.random is None:
        names = [name for name, _ in space.grid]
        return [
            dict(zip(names, combo, strict=True))
            for combo in itertools.product(*(values for _, values in space.grid))
        ]
    rng = random.Random(space.seed)
    trials = []
    for _ in range(space.random):
        values = {name: rng.choice(choices) for name, choices in space.grid}
        values.update({r.name: r.draw(rng) for r in space.ranges})
        trials.append(values)
    return trials


_PLACEHOLDER = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def substitute(text: str, params: Mapping[str, str]) -> str:
    """`${lr}` → the trial's value of lr, for each parameter; any other `${...}` is left to
    the shell."""
    return _PLACEHOLDER.sub(lambda m: params.get(m.group(1), m.group(0)), text)


def trial_env(params: Mapping[str, str]) -> dict[str, str]:
    """The trial's parameters as environment variables: `lr` → `LR`."""
    return {name.upper(): value for name, value in params.items()}


def params_text(params: Mapping[str, str]) -> str:
    """'lr=0.1 batch=32': a trial's values on one line."""
    return " ".join(f"{name}={value}" for name, value in params.items())


# -- a metric's curves: the best trial and the median stopping rule ------------------------


@dataclass(frozen=True)
class Curve:
    """One trial's values of the sweep's metric, by step, in step order."""

    steps: tuple[int, ...]
    values: tuple[float, ...]

    def best(self, goal: str) -> float | None:
        if not self.values:
            return None
        return max(self.values) if goal == "max" else min(self.values)

    def running_average(self, step: int) -> float | None:
        """The mean of the values up to and including `step`."""
        upto = [v for s, v in zip(self.steps, self.values, strict=True) if s <= step]
        return sum(upto) / len(upto) if upto else None


def better(a: float, b: float, goal: str) -> bool:
    return a > b if goal == "max" else a < b


def best_trial(curves: Mapping[int, Curve], goal: str) -> int | None:
    """The trial whose best value of the metric is best (the lower index on a tie); None
    when no trial reported it."""
    found: tuple[int, float] | None = None
    for index in sorted(curves):
        value = curves[index].best(goal)
        if value is not None and (found is None or better(value, found[1], goal)):
            found = (index, value)
    return found[0] if found else None


@dataclass(frozen=True)
class StopRule:
    """When the median rule may judge a trial: once it reported `min_steps` points of the
    metric, and `min_trials` other trials reached its latest step."""

    min_steps: int = 5
    min_trials: int = 2


@dataclass(frozen=True)
class Verdict:
    """Why a trial is stopped: at `step` its best value is worse than `median`, the median
    of `peers` other trials' running averages at that step."""

    step: int
    best: float
    median: float
    peers: int

    def reason(self, metric: str, goal: str) -> str:
        side = "below" if goal == "max" else "above"
        return (
            f"stopped early at step {self.step}: its best {metric} {self.best:.6g} is {side} "
            f"the median {self.median:.6g} of {self.peers} other trials' running averages "
            "(median stopping rule)"
        )


def median_stop(curve: Curve, others: Sequence[Curve], goal: str, rule: StopRule) -> Verdict | None:
    """The median stopping rule (Golovin et al., Google Vizier, 2017): a trial whose best
    value at its latest step s is worse than the median of the other trials' running
    averages at s is stopped. Only other trials that reached s count; None: keep it."""
    if len(curve.steps) < max(rule.min_steps, 1):
        return None
    step = curve.steps[-1]
    peers = [
        average
        for other in others
        if other.steps and other.steps[-1] >= step
        if (average := other.running_average(step)) is not None
    ]
    if len(peers) < max(rule.min_trials, 1):
        return None
    median = statistics.median(peers)
    best = curve.best(goal)
    if best is None or not better(median, best, goal):
        return None
    return Verdict(step, best, median, len(peers))
