"""Scalars from TensorBoard event files, read as they grow, with no TensorFlow/TensorBoard.

An event file is a sequence of TFRecords: uint64 length (little endian), uint32 masked
CRC-32C of the length, the data, uint32 masked CRC-32C of the data. Each record's data is
an `Event` protocol buffer, decoded here by hand for the few fields that carry scalars:

    Event { double wall_time = 1; int64 step = 2; Summary summary = 5; }
    Summary { repeated Value value = 1; }
    Value { string tag = 1; float simple_value = 2; TensorProto tensor = 8;
            SummaryMetadata metadata = 9; }
    TensorProto { DataType dtype = 1; TensorShapeProto tensor_shape = 2;
                  bytes tensor_content = 4; repeated float float_val = 5;
                  repeated double double_val = 6; repeated int32 int_val = 7;
                  repeated int64 int64_val = 10; }
    SummaryMetadata { PluginData plugin_data = 1; }  PluginData { string plugin_name = 1; }
"""

from __future__ import annotations

import logging
import os
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from gpulease.runner import safefs

log = logging.getLogger(__name__)

EVENT_FILE_PREFIX = "events.out.tfevents."
MAX_RECORD_BYTES = 1024 * 1024 * 1024
# An event record larger than this holds no scalars (images, audio, graphs): skipped unread.
MAX_SCALAR_RECORD_BYTES = 256 * 1024
READ_BYTES = 4 * 1024 * 1024
_MASK_DELTA = 0xA282EAD8
# TensorFlow DataType numbers of the tensors a scalar can be stored in.
_DT_FLOAT, _DT_DOUBLE, _DT_INT32, _DT_INT64, _DT_HALF = 1, 2, 3, 9, 19
_KEY_CHARS = re.compile(r"[^A-Za-z0-9_./-]")


def _crc32c_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    table = _TABLE
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


class CorruptFile(Exception):
    """The record framing is broken: nothing after this point can be trusted."""


# -- protocol buffer wire format ---------------------------------------------------------------


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ValueError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def fields(data: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) of each field: varints and fixed32/64 as ints
    (their raw little-endian bits), length-delimited fields as bytes. Raises ValueError
    on malformed data; groups (wire types 3, 4) are not supported."""
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        value: int | bytes
        if wire == 0:
            value, pos = _varint(data, pos)
        elif wire == 1:
            if pos + 8 > len(data):
                raise ValueError("truncated fixed64")
            value = int.from_bytes(data[pos : pos + 8], "little")
            pos += 8
        elif wire == 2:
            length, pos = _varint(data, pos)
            if pos + length > len(data):
                raise ValueError("truncated bytes field")
            value = data[pos : pos + length]
            pos += length
        elif wire == 5:
            if pos + 4 > len(data):
                raise ValueError("truncated fixed32")
            value = int.from_bytes(data[pos : pos + 4], "little")
            pos += 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
        yield number, wire, value


def _float32(bits: int) -> float:
    return float(struct.unpack("<f", bits.to_bytes(4, "little"))[0])


def _float64(bits: int) -> float:
    return float(struct.unpack("<d", bits.to_bytes(8, "little"))[0])


def _signed64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _packed(value: int | bytes, wire: int, size: int, fmt: str) -> list[float]:
    """A repeated fixed-size number field: packed (wire 2) or one element (wire 1/5)."""
    if isinstance(value, bytes):
        count = len(value) // size
        return [float(x) for x in struct.unpack(f"<{count}{fmt}", value[: count * size])]
    return [_float32(value) if size == 4 else _float64(value)]


def _packed_varints(value: int | bytes, signed_bits: int) -> list[float]:
    if isinstance(value, int):
        raw = [value]
    else:
        raw, pos = [], 0
        while pos < len(value):
            item, pos = _varint(value, pos)
            raw.append(item)
    out = []
    for item in raw:
        item &= (1 << 64) - 1
        item = _signed64(item)
        if signed_bits == 32:
            item = (item + (1 << 31)) % (1 << 32) - (1 << 31)
        out.append(float(item))
    return out


def _tensor_value(data: bytes) -> float | None:
    """The one number of a scalar TensorProto; None for anything else."""
    dtype = 0
    numbers: list[float] = []
    content = b""
    dims = 0
    for number, wire, value in fields(data):
        if number == 1 and isinstance(value, int):
            dtype = value
        elif number == 2 and isinstance(value, bytes):
            for dim_field, _, dim in fields(value):  # TensorShapeProto.dim = 2
                if dim_field == 2 and isinstance(dim, bytes):
                    size = next((s for f, _, s in fields(dim) if f == 1), 1)
                    if isinstance(size, int) and size != 1:
                        return None
                    dims += 1
        elif number == 4 and isinstance(value, bytes):
            content = value
        elif number == 5 and wire in (2, 5):
            numbers += _packed(value, wire, 4, "f")
        elif number == 6 and wire in (1, 2):
            numbers += _packed(value, wire, 8, "d")
        elif number == 7 and wire in (0, 2):
            numbers += _packed_varints(value, 32)
        elif number == 10 and wire in (0, 2):
            numbers += _packed_varints(value, 64)
    del dims  # any number of size-1 dimensions holds one value
    if content:
        formats = {_DT_FLOAT: "f", _DT_DOUBLE: "d", _DT_INT32: "i", _DT_INT64: "q", _DT_HALF: "e"}
        fmt = formats.get(dtype)
        if fmt is None or len(content) != struct.calcsize(f"<{fmt}"):
            return None
        return float(struct.unpack(f"<{fmt}", content)[0])
    if len(numbers) != 1:
        return None
    return numbers[0]


def _plugin_name(metadata: bytes) -> str:
    for number, _, value in fields(metadata):
        if number == 1 and isinstance(value, bytes):
            for inner, _, name in fields(value):
                if inner == 1 and isinstance(name, bytes):
                    return name.decode("utf-8", "replace")
    return ""


@dataclass(frozen=True)
class Scalar:
    tag: str
    step: int
    value: float
    wall_time: float


def decode_event(data: bytes) -> list[Scalar]:
    """The scalar summaries in one serialized Event (none for other events or values).

    A value counts when it has a simple_value, or a one-number float/double/int tensor whose
    plugin is "scalars" (or unnamed). Raises ValueError when data is not a protocol buffer.
    """
    wall_time = 0.0
    step = 0
    summaries: list[bytes] = []
    for number, wire, value in fields(data):
        if number == 1 and wire == 1 and isinstance(value, int):
            wall_time = _float64(value)
        elif number == 2 and wire == 0 and isinstance(value, int):
            step = _signed64(value)
        elif number == 5 and isinstance(value, bytes):
            summaries.append(value)
    scalars = []
    for summary in summaries:
        for number, _, value in fields(summary):
            if number != 1 or not isinstance(value, bytes):
                continue
            tag = ""
            simple: float | None = None
            tensor: bytes | None = None
            plugin = ""
            for vfield, vwire, item in fields(value):
                if vfield == 1 and isinstance(item, bytes):
                    tag = item.decode("utf-8", "replace")
                elif vfield == 2 and vwire == 5 and isinstance(item, int):
                    simple = _float32(item)
                elif vfield == 8 and isinstance(item, bytes):
                    tensor = item
                elif vfield == 9 and isinstance(item, bytes):
                    plugin = _plugin_name(item)
            if simple is None and tensor is not None and plugin in ("", "scalars"):
                simple = _tensor_value(tensor)
            if tag and simple is not None:
                scalars.append(Scalar(tag, step, simple, wall_time))
    return scalars


# -- files -------------------------------------------------------------------------------------


class EventFileReader:
    """Reads one event file incrementally: each read_new() returns the scalars of the
    records completed since the last call. A partial last record is left for later; a
    record whose data does not match its CRC is skipped; broken framing stops the file.

    The file is the job's: it is opened beneath root (its directory unless given) without
    following any link on the way (runner/safefs.py), and only when it is a regular file."""

    def __init__(self, path: Path, offset: int = 0, *, root: Path | None = None) -> None:
        self.path = path
        self.offset = offset
        self.broken = False
        self.records = 0
        self._root = root or path.parent
        self._relative = path.relative_to(self._root)

    def read_new(self) -> list[Scalar]:
        scalars: list[Scalar] = []
        while not self.broken:
            try:
                data, size = _read_from(self._root, self._relative, self.offset, READ_BYTES)
            except OSError as exc:
                log.debug("event file %s cannot be read: %s", self.path, exc)
                break
            consumed = self._records(data, size, scalars)
            if consumed == 0:
                break
            self.offset += consumed
        return scalars

    def _records(self, data: bytes, size: int, scalars: list[Scalar]) -> int:
        """Parse the complete records at the start of data (the file's bytes from offset;
        size: the file's size) into scalars; return how many bytes they took."""
        pos = 0
        while len(data) - pos >= 12:
            header = data[pos : pos + 8]
            (length,) = struct.unpack("<Q", header)
            (header_crc,) = struct.unpack("<I", data[pos + 8 : pos + 12])
            if header_crc != masked_crc32c(header) or length > MAX_RECORD_BYTES:
                log.warning("%s: broken record framing at byte %d", self.path, self.offset + pos)
                self.broken = True
                break
            end = pos + 12 + length + 4
            if self.offset + end > size:
                break  # still being written
            if length > MAX_SCALAR_RECORD_BYTES:
                pos = end  # an image, audio, a graph: skipped without reading it
                self.records += 1
                continue
            if end > len(data):
                break  # read with the next block
            self.records += 1
            record = data[pos + 12 : pos + 12 + length]
            (data_crc,) = struct.unpack("<I", data[end - 4 : end])
            pos = end
            if data_crc != masked_crc32c(record):
                log.warning("%s: a record fails its CRC and is skipped", self.path)
                continue
            try:
                scalars += decode_event(record)
            except ValueError as exc:
                log.warning("%s: a record is not an Event (%s); skipped", self.path, exc)
        return pos


def _read_from(root: Path, relative: Path, offset: int, limit: int) -> tuple[bytes, int]:
    """Up to limit bytes of the regular file root/relative from offset, and the file's
    size; never through a symlink at any component (the job owns the workspace and could
    point one at the runner's own files or another instance's), never a FIFO."""
    with safefs.opened_file(root, relative) as fd:
        size = os.fstat(fd).st_size
        data = safefs.read_fd(fd, limit, offset)
        return data, max(size, offset + len(data))


def find_event_files(root: Path, *, beneath: Path | None = None) -> dict[Path, int]:
    """Every event file under root with its size. Nothing is followed: not a link at root
    itself nor at any directory under it, down from beneath (root's parent unless given,
    a directory the runner trusts, such as the workspace)."""
    top = beneath or root.parent
    found: dict[Path, int] = {}
    try:
        for entry in safefs.walk(top, root.relative_to(top)):
            if entry.name.startswith(EVENT_FILE_PREFIX):
                found[root / entry.relative] = entry.stat.st_size
    except (OSError, ValueError):
        pass  # no such directory, or a link where it should be
    return found


def metric_key(root: Path, path: Path, tag: str) -> str:
    """The metric name of a tag in an event file under root (a workspace's `runs/`).

    A writer's own files lie in root/<run>/ and keep their tag ("loss", "Loss/train").
    add_scalars("loss", {"train": …}) writes tag "loss" into root/<run>/loss_train/: that
    becomes "loss/train"; any other subdirectory SUB gives "SUB/tag"."""
    try:
        parts = path.parent.relative_to(root).parts
    except ValueError:
        parts = ()
    key = tag
    if len(parts) > 1:
        sub = "_".join(parts[1:])
        key = f"{tag}/{sub[len(tag) + 1 :]}" if sub.startswith(f"{tag}_") else f"{sub}/{tag}"
    key = _KEY_CHARS.sub("_", key)
    if not key or not (key[0].isalpha() or key[0] == "_"):
        key = f"_{key}"
    return key[:64]


class EventDirectoryWatcher:
    """The event files written under root since the watcher was made (files there before
    are read only from their size then on): poll() returns (metric key, scalar) pairs."""

    def __init__(self, root: Path, *, beneath: Path | None = None) -> None:
        """beneath: where nothing is followed from (root's parent unless given)."""
        self.root = root
        self._beneath = beneath or root.parent
        self._readers: dict[Path, EventFileReader] = {}
        self._before = find_event_files(root, beneath=self._beneath)

    def poll(self) -> list[tuple[str, Scalar]]:
        out: list[tuple[str, Scalar]] = []
        for path, size in find_event_files(self.root, beneath=self._beneath).items():
            reader = self._readers.get(path)
            if reader is None:
                before = self._before.get(path, 0)
                if size <= before:
                    continue
                reader = EventFileReader(path, before, root=self._beneath)
                self._readers[path] = reader
            elif size <= reader.offset:
                continue
            out += [(metric_key(self.root, path, s.tag), s) for s in reader.read_new()]
        return out
