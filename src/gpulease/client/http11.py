"""One HTTP/1.1 request on a connection of its own, for the CLI's quick path.

The standard library's http.client reads headers with the email package, and importing
both took a third of `gpulease exec`'s time to its first line, more than the request did.
This sends one request (`Connection: close`) and reads its answer as RFC 9112 frames it:
the status line (1xx answers skipped), the header fields (bounded in size and number),
then a body of chunked transfer coding, of a Content-Length, or until the connection
closes. The body reads as a buffered binary stream: readline() returns as soon as a line
is in, for an event stream. TLS is the caller's: it hands over a socket already wrapped.
"""

from __future__ import annotations

import io
import socket

MAX_HEADER_LINE = 64 * 1024
MAX_HEADERS = 100
_NO_BODY = (204, 304)


class HttpError(Exception):
    """The answer is not HTTP/1.1 as this client reads it."""


class Answer:
    """An answer's status, reason and header fields (names in lower case; a field sent
    more than once joined with ", "), and its body, read from `body`."""

    def __init__(
        self,
        sock: socket.socket,
        status: int,
        reason: str,
        headers: dict[str, str],
        body: io.BufferedIOBase,
    ) -> None:
        self.sock = sock
        self.status = status
        self.reason = reason
        self.headers = headers
        self.body = body

    def read(self, limit: int = -1) -> bytes:
        """The rest of the body (at most limit bytes when limit >= 0)."""
        return self.body.read(limit)

    def readline(self) -> bytes:
        """The body's next line with its end; b"" once the body has ended."""
        return self.body.readline()

    def close(self) -> None:
        self.body.close()
        self.sock.close()


def exchange(
    sock: socket.socket,
    method: str,
    host: str,
    target: str,
    headers: dict[str, str],
    body: bytes | None = None,
) -> Answer:
    """Send the request on sock (connected, and wrapped in TLS if need be) and read its
    answer's head. HttpError for an answer that is not HTTP/1.1; OSError as sock raises."""
    for text in (method, host, target, *headers, *headers.values()):
        if "\r" in text or "\n" in text:
            raise ValueError(f"a line break in the request's head: {text[:40]!r}")
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}", "Connection: close"]
    lines += ["Accept-Encoding: identity"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    if body is not None or method in ("POST", "PUT", "PATCH"):
        lines.append(f"Content-Length: {len(body or b'')}")
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b""))
    stream = sock.makefile("rb")
    try:
        while True:
            status, reason = _status_line(stream)
            fields = _header_fields(stream)
            if not 100 <= status < 200:
                break  # 100 Continue, 103 Early Hints: the answer follows
        return Answer(sock, status, reason, fields, _body(stream, method, status, fields))
    except BaseException:
        stream.close()
        raise


def _line(stream: io.BufferedReader, within: str = "head") -> bytes:
    line = stream.readline(MAX_HEADER_LINE + 1)
    if len(line) > MAX_HEADER_LINE:
        raise HttpError(f"a line of the answer is longer than {MAX_HEADER_LINE} bytes")
    if not line:
        raise HttpError(f"the connection closed before the answer's {within} ended")
    return line


def _status_line(stream: io.BufferedReader) -> tuple[int, str]:
    text = _line(stream).decode("latin-1").rstrip("\r\n")
    version, _, rest = text.partition(" ")
    code, _, reason = rest.partition(" ")
    if not version.startswith("HTTP/1.") or len(code) != 3 or not code.isdigit():
        raise HttpError(f"not an HTTP/1.1 status line: {text[:100]!r}")
    return int(code), reason


def _header_fields(stream: io.BufferedReader) -> dict[str, str]:
    fields: dict[str, str] = {}
    last = ""
    for _ in range(MAX_HEADERS + 1):
        text = _line(stream).decode("latin-1").rstrip("\r\n")
        if not text:
            return fields
        if text[0] in " \t" and last:  # an obsolete folded line: part of the field before
            fields[last] += " " + text.strip()
            continue
        name, colon, value = text.partition(":")
        if not colon or not name or name != name.strip():
            raise HttpError(f"a malformed header field: {text[:100]!r}")
        last = name.lower()
        value = value.strip()
        fields[last] = f"{fields[last]}, {value}" if last in fields else value
    raise HttpError(f"the answer has more than {MAX_HEADERS} header fields")


def _body(
    stream: io.BufferedReader, method: str, status: int, fields: dict[str, str]
) -> io.BufferedIOBase:
    if method == "HEAD" or status in _NO_BODY:
        return _Framed(stream, 0)
    codings = [c.strip().lower() for c in fields.get("transfer-encoding", "").split(",")]
    if codings[-1] == "chunked":
        return io.BufferedReader(_Chunked(stream))
    if codings != [""]:
        raise HttpError(f"a transfer coding this client does not read: {codings[-1]!r}")
    if "content-length" in fields:
        declared = {v.strip() for v in fields["content-length"].split(",")}
        length = declared.pop()
        if declared or not length.isdigit():
            raise HttpError(f"an invalid Content-Length: {fields['content-length']!r}")
        return _Framed(stream, int(length))
    return _Framed(stream, None)


class _Framed(io.BufferedIOBase):
    """A body of `length` bytes (None: until the connection closes); an answer that ends
    early raises HttpError."""

    def __init__(self, stream: io.BufferedReader, length: int | None) -> None:
        self._stream = stream
        self._left = length

    def readable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> bytes:
        if self._left is None:
            return self._stream.read(-1 if size is None else size)
        want = self._left if size is None or size < 0 else min(size, self._left)
        data = self._stream.read(want)  # all of it, unless the connection closed first
        if len(data) < want:
            raise HttpError(f"the answer's body ended {self._left - len(data)} bytes early")
        self._left -= len(data)
        return data

    def read1(self, size: int = -1) -> bytes:
        if self._left is None:
            return self._stream.read1(size)
        want = self._left if size < 0 else min(size, self._left)
        data = self._stream.read1(want) if want else b""
        self._count(data, want)
        return data

    def readline(self, size: int | None = -1) -> bytes:
        if self._left is None:
            return self._stream.readline(-1 if size is None else size)
        want = self._left if size is None or size < 0 else min(size, self._left)
        data = self._stream.readline(want)
        self._count(data, 1 if want else 0)
        return data

    def _count(self, data: bytes, wanted: int) -> None:
        assert self._left is not None
        if wanted and not data:
            raise HttpError(f"the answer's body ended {self._left} bytes early")
        self._left -= len(data)

    def close(self) -> None:
        self._stream.close()
        super().close()


class _Chunked(io.RawIOBase):
    """The data of a body in chunked transfer coding; its trailer fields are read and
    left."""

    def __init__(self, stream: io.BufferedReader) -> None:
        self._stream = stream
        self._left = 0  # of the current chunk
        self._ended = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview | bytearray) -> int:  # type: ignore[override]
        if self._ended or not len(buffer):
            return 0
        if self._left == 0:
            size = _line(self._stream, "body").split(b";", 1)[0].strip()
            try:
                self._left = int(size, 16)
            except ValueError:
                raise HttpError(f"a malformed chunk size: {size[:40]!r}") from None
            if self._left == 0:
                _header_fields(self._stream)  # the trailer, up to its empty line
                self._ended = True
                return 0
        data = self._stream.read1(min(len(buffer), self._left))
        if not data:
            raise HttpError("the answer's body ended inside a chunk")
        buffer[: len(data)] = data
        self._left -= len(data)
        if self._left == 0 and _line(self._stream, "body") not in (b"\r\n", b"\n"):
            raise HttpError("a chunk does not end where its size says")
        return len(data)

    def close(self) -> None:
        self._stream.close()
        super().close()
