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
