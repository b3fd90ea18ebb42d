"""A request goes back to the node it last ran on (its workspace is there) whenever it fits."""

from __future__ import annotations

import pytest

from gpulease.scheduler.model import ClusterState, Config, Request, RunningSet
from gpulease.scheduler.placement import FreeMap
from gpulease.scheduler.policy import POLICIES, schedule

A = "A100-80GB"


def starts(
    free: dict[int, int], *queue: Request, policy: str = "default"
) -> dict[int, tuple[int, ...]]:
    state = ClusterState(FreeMap({A: free}), RunningSet(), queue, {}, list(free))
    return {s.request_id: s.node_ids for s in schedule(state, 0, Config(policy)).starts}


@pytest.mark.parametrize("policy", POLICIES)
def test_a_request_starts_on_its_home_node_when_it_fits_there(policy: str) -> None:
    # best fit alone would take node 2 (the tightest); its home, node 3, has room
    assert starts({1: 4, 2: 1, 3: 2}, Request(1, "ann", A, 1, home=3), policy=policy) == {1: (3,)}


def test_a_full_or_unknown_home_leaves_the_usual_best_fit() -> None:
    assert starts({1: 4, 2: 1, 3: 0}, Request(1, "ann", A, 1, home=3)) == {1: (2,)}
    assert starts({1: 4, 2: 1}, Request(1, "ann", A, 2, home=2)) == {1: (1,)}
    assert starts({1: 4, 2: 1}, Request(1, "ann", A, 1, home=9)) == {1: (2,)}


def test_a_home_the_request_may_not_run_on_is_passed_over() -> None:
    request = Request(1, "ann", A, 1, home=3, allowed=frozenset({1, 2}))
    assert starts({1: 4, 2: 1, 3: 2}, request) == {1: (2,)}


def test_a_cpu_only_request_goes_home_too() -> None:
    assert starts({1: 0, 2: 0, 3: 0}, Request(1, "ann", A, 0, home=2)) == {1: (2,)}


def test_free_map_fit_prefers_home_for_one_node_only() -> None:
    free = FreeMap({A: {1: 2, 2: 2, 3: 8}})
    assert free.fit(A, 2, home=3) == (3,)
    assert free.fit(A, 2, nodes=2, home=3) == (1, 2)  # a gang keeps its tightest nodes
