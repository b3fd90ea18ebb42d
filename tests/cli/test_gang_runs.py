"""The other ranks' output in `gpulease run`: whole lines, each prefixed with its rank."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from gpulease.cli.gang_runs import RankPrinter
from gpulease.schemas.runs import LogChunkPublic


def chunk(seq: int, data: str, stream: str = "stdout") -> LogChunkPublic:
    return LogChunkPublic(seq=seq, stream=stream, data=data, time=datetime.now(UTC))


def test_a_ranks_lines_are_prefixed_whole_even_when_chunks_split_them(
    capsys: pytest.CaptureFixture[str],
) -> None:
    printer = RankPrinter(1)
    printer.write(chunk(0, "epoch 1 lo"))
    assert capsys.readouterr().out == ""  # half a line waits for the rest
    printer.write(chunk(1, "ss 0.5\nepoch 2\n"))
    printer.write(chunk(2, "warn", "stderr"))
    printer.write(chunk(3, "last"))
    printer.close()
    got = capsys.readouterr()
    assert got.out == "(rank 1) epoch 1 loss 0.5\n(rank 1) epoch 2\n(rank 1) last\n"
    assert got.err == "(rank 1) warn\n"


def test_rank_0_unprefixed_and_rank_1_never_share_a_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`print` writes its text and its newline apart, so rank 0's line may reach the CLI in
    two chunks with rank 1's whole line between them."""
    leader, other = RankPrinter(0, prefixed=False), RankPrinter(1)
    leader.write(chunk(0, "sum=3 rank=0"))
    other.write(chunk(0, "sum=3 rank=1\n"))
    leader.write(chunk(1, "\n"))
    leader.close()
    other.close()
    assert capsys.readouterr().out.splitlines() == ["(rank 1) sum=3 rank=1", "sum=3 rank=0"]
