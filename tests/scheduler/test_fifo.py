"""FIFO placement per GPU model, as pure functions."""

from __future__ import annotations

from gpulease.scheduler.fifo import FreeGpu, Request, place_fifo, queue_positions


def gpus(node: int, model: str, n: int, start_id: int) -> list[FreeGpu]:
    return [FreeGpu(node, start_id + i, i, model) for i in range(n)]


def test_head_of_line_blocks_its_model_only() -> None:
    free = gpus(1, "A100", 2, 0) + gpus(1, "T4", 1, 10)
    queue = [Request(1, "A100", 4), Request(2, "A100", 1), Request(3, "T4", 1)]
    placed = place_fifo(queue, free, [1])
    assert [p.instance_id for p in placed] == [3]


def test_tightest_node_wins_and_gpus_are_not_given_twice() -> None:
    free = gpus(1, "A100", 4, 0) + gpus(2, "A100", 1, 10)
    placed = place_fifo(
        [Request(1, "A100", 1), Request(2, "A100", 4), Request(3, "A100", 1)], free, [1, 2]
    )
    assert placed[0].node_id == 2  # the single free GPU, keeping node 1's four together
    assert placed[1].node_id == 1 and len(placed[1].gpu_ids) == 4
    assert len(placed) == 2
    all_ids = [g for p in placed for g in p.gpu_ids]
    assert len(all_ids) == len(set(all_ids))


def test_cpu_requests_need_only_a_node() -> None:
    assert place_fifo([Request(1, "CPU", 0)], [], [3])[0].node_id == 3
    assert place_fifo([Request(1, "CPU", 0)], [], []) == []


def test_queue_positions_count_per_model() -> None:
    q = [Request(1, "A100", 1), Request(2, "T4", 1), Request(3, "A100", 2)]
    assert queue_positions(q) == {1: 1, 2: 1, 3: 2}
