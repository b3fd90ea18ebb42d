"""FIFO placement limited to the nodes whose driver runs a request's template (pure)."""

from __future__ import annotations

from gpulease.scheduler.fifo import FreeGpu, Request, place_fifo


def gpus(node: int, model: str, n: int, start_id: int) -> list[FreeGpu]:
    return [FreeGpu(node, start_id + i, i, model) for i in range(n)]


def test_a_request_goes_only_to_its_allowed_nodes() -> None:
    free = gpus(1, "A100", 1, 0) + gpus(2, "A100", 4, 10)
    # node 1 is the tighter fit, but its driver is too old for the template
    placed = place_fifo([Request(1, "A100", 1, nodes=frozenset({2}))], free, [1, 2])
    assert [(p.node_id, len(p.gpu_ids)) for p in placed] == [(2, 1)]


def test_a_request_without_an_allowed_free_node_waits_and_holds_its_model_queue() -> None:
    free = gpus(1, "A100", 2, 0) + gpus(1, "T4", 1, 10)
    queue = [
        Request(1, "A100", 1, nodes=frozenset({2})),  # node 2 is busy
        Request(2, "A100", 1),
        Request(3, "T4", 1),
    ]
    placed = place_fifo(queue, free, [1, 2])
    assert [p.instance_id for p in placed] == [3]


def test_cpu_requests_respect_allowed_nodes() -> None:
    assert place_fifo([Request(1, "CPU", 0, nodes=frozenset({5}))], [], [3, 5])[0].node_id == 5
    assert place_fifo([Request(1, "CPU", 0, nodes=frozenset())], [], [3]) == []


def test_unrestricted_requests_are_placed_as_before() -> None:
    free = gpus(1, "A100", 1, 0) + gpus(2, "A100", 4, 10)
    placed = place_fifo([Request(1, "A100", 1)], free, [1, 2])
    assert placed[0].node_id == 1
