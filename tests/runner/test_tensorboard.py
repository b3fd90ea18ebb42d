"""The TensorBoard event reader against files written by the real torch SummaryWriter."""

from __future__ import annotations

import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from gpulease.runner import tensorboard
from gpulease.runner.tensorboard import (
    EventDirectoryWatcher,
    EventFileReader,
    decode_event,
    find_event_files,
    masked_crc32c,
    metric_key,
)

pytest.importorskip("tensorboard")

WRITER = """
import torch
from torch.utils.tensorboard import SummaryWriter
w = SummaryWriter()  # default settings: ./runs/<date>_<host>/
for i in range(STEPS):
    w.add_scalar("loss", 1 / (i + 1), i)
    w.add_scalar("Acc/train", i * 0.1, i, new_style=True)
    w.add_scalar("precise", 0.1 + i, i, new_style=True, double_precision=True)
    w.add_scalars("lr", {"a": i * 2.0, "b": i * 3.0}, i)
w.add_histogram("weights", torch.arange(10.0), 0)
w.add_text("note", "hello", 0)
w.add_image("img", torch.zeros(3, 4, 4), 0)
w.close()
"""
STEPS = 50


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A workspace where SummaryWriter() wrote its runs/ tree."""
    workspace = tmp_path_factory.mktemp("workspace")
    subprocess.run(
        [sys.executable, "-c", WRITER.replace("STEPS", str(STEPS))],
        cwd=workspace,
        check=True,
        capture_output=True,
    )
    return workspace


def _main_file(workspace: Path) -> Path:
    (path,) = [p for p in find_event_files(workspace / "runs") if p.parent.parent.name == "runs"]
    return path


def test_scalars_of_a_real_summary_writer(written: Path, tmp_path: Path) -> None:
    root = tmp_path / "runs"
    watcher = EventDirectoryWatcher(root)  # made before the files exist: all are new
    shutil.copytree(written / "runs", root)
    points: dict[str, dict[int, float]] = {}
    for key, scalar in watcher.poll():
        points.setdefault(key, {})[scalar.step] = scalar.value
        assert scalar.wall_time > 1.6e9
    assert sorted(points) == ["Acc/train", "loss", "lr/a", "lr/b", "precise"]
    steps = list(range(STEPS))
    assert points["loss"] == {i: pytest.approx(1 / (i + 1), rel=1e-7) for i in steps}
    assert points["Acc/train"] == {i: pytest.approx(i * 0.1, rel=1e-7) for i in steps}
    assert points["precise"] == {i: 0.1 + i for i in steps}  # a double, exactly
    assert points["lr/a"] == {i: i * 2.0 for i in steps}
    assert points["lr/b"] == {i: i * 3.0 for i in steps}
    assert watcher.poll() == []  # nothing new


def test_a_file_read_while_it_grows_byte_by_byte_chunks(written: Path, tmp_path: Path) -> None:
    data = _main_file(written).read_bytes()
    target = tmp_path / "events.out.tfevents.1.host"
    target.write_bytes(b"")
    reader = EventFileReader(target)
    got = []
    # cut at every 97th byte: most cuts fall inside a record, which must wait, not break
    for end in [*range(0, len(data), 97), len(data)]:
        with target.open("r+b") as out:
            out.seek(0, 2)
            out.write(data[out.tell() : end])
        got += reader.read_new()
    assert not reader.broken
    complete = EventFileReader(_main_file(written)).read_new()
    assert got == complete
    assert len([s for s in got if s.tag == "loss"]) == STEPS


def test_a_truncated_file_gives_its_complete_records(written: Path, tmp_path: Path) -> None:
    data = _main_file(written).read_bytes()
    target = tmp_path / "events.out.tfevents.2.host"
    target.write_bytes(data[: len(data) // 2])
    reader = EventFileReader(target)
    first = reader.read_new()
    assert 0 < len(first) < 3 * STEPS and not reader.broken
    assert reader.read_new() == []


def record(data: bytes, crc: int | None = None) -> bytes:
    header = struct.pack("<Q", len(data))
    footer = masked_crc32c(data) if crc is None else crc
    return header + struct.pack("<I", masked_crc32c(header)) + data + struct.pack("<I", footer)


def event(step: int, tag: bytes, value: float) -> bytes:
    val = b"\x0a" + bytes([len(tag)]) + tag + b"\x15" + struct.pack("<f", value)
    summary = b"\x0a" + bytes([len(val)]) + val
    return (
        b"\x09" + struct.pack("<d", 1.7e9) + b"\x10" + bytes([step])
        + b"\x2a" + bytes([len(summary)]) + summary
    )  # fmt: skip


def test_reading_in_small_blocks_and_skipping_large_records(
    written: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tensorboard, "READ_BYTES", 100)
    complete = EventFileReader(_main_file(written)).read_new()
    assert EventFileReader(_main_file(written)).read_new() == complete
    path = tmp_path / "events.out.tfevents.4.host"
    big = b"\x00" * (tensorboard.MAX_SCALAR_RECORD_BYTES + 1)  # an image, say: never read
    path.write_bytes(record(event(1, b"x", 1.0)) + record(big) + record(event(2, b"x", 2.0)))
    reader = EventFileReader(path)
    assert [(s.step, s.value) for s in reader.read_new()] == [(1, 1.0), (2, 2.0)]
    assert reader.records == 3 and not reader.broken


def test_a_record_with_a_bad_crc_is_skipped_and_bad_framing_stops(tmp_path: Path) -> None:
    path = tmp_path / "events.out.tfevents.3.host"
    path.write_bytes(
        record(event(1, b"x", 1.0))
        + record(event(2, b"x", 2.0), crc=12345)  # data corrupted: skipped
        + record(b"\xff\xff\xff")  # not a protocol buffer: skipped
        + record(event(3, b"x", 3.0))
        + b"\x00" * 16  # framing broken: the rest of the file is not trusted
        + record(event(4, b"x", 4.0))
    )
    reader = EventFileReader(path)
    assert [(s.step, s.value) for s in reader.read_new()] == [(1, 1.0), (3, 3.0)]
    assert reader.broken


def test_decode_event_ignores_what_is_not_a_scalar() -> None:
    assert decode_event(b"") == []
    assert decode_event(b"\x1a\x0dbrain.Event:2") == []  # the file_version record
    with pytest.raises(ValueError):
        decode_event(b"\x0a\xff")


def test_metric_keys(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    run = root / "Nov30_12-00-00_host"
    assert metric_key(root, run / "events.out.tfevents.1", "loss") == "loss"
    assert metric_key(root, run / "events.out.tfevents.1", "Loss/train") == "Loss/train"
    assert metric_key(root, run / "loss_train" / "events.out.tfevents.1", "loss") == "loss/train"
    assert metric_key(root, run / "other" / "events.out.tfevents.1", "loss") == "other/loss"
    assert metric_key(root, run / "e", "bad tag!") == "bad_tag_"
    assert metric_key(root, run / "e", "1st") == "_1st"
    assert len(metric_key(root, run / "e", "x" * 100)) == 64


def test_the_watcher_reads_only_what_the_run_writes(written: Path, tmp_path: Path) -> None:
    root = tmp_path / "runs"
    writer_dir = _main_file(written).parent
    shutil.copytree(writer_dir, root / "Nov30_old")
    watcher = EventDirectoryWatcher(root)  # files there now belong to an earlier run
    assert watcher.poll() == []
    shutil.copytree(writer_dir, root / "Nov30_new")
    (root / "elsewhere").mkdir()
    (root / "elsewhere" / "events.out.tfevents.9.host").symlink_to(_main_file(written))
    keys = {key for key, _ in watcher.poll()}
    assert keys == {"Acc/train", "loss", "precise", "lr/a", "lr/b"}
    assert all("elsewhere" not in str(path) for path in watcher._readers)
