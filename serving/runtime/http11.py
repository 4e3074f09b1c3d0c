"""Just enough HTTP/1.1 for the activator <-> instance hop over a UNIX socket.

Both ends are ours: requests and responses carry ``content-length``, connections are kept
alive; the one exception is a model server's streamed answer (Server-Sent Events), which comes
``transfer-encoding: chunked`` and is read piece by piece (``read_head`` + ``chunks``). Pure
functions to read and write messages on asyncio streams, used by the instance server
(``instance``) and the activator's upstream pool (``upstream``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

MAX_HEAD = 64 * 1024
REASONS = {200: "OK", 202: "Accepted", 204: "No Content", 400: "Bad Request", 404: "Not Found",
           500: "Internal Server Error", 502: "Bad Gateway", 503: "Service Unavailable", 504: "Gateway Timeout"}


@dataclass(frozen=True)
class Message:
    start: str  # request line or status line
    headers: list[tuple[str, str]]  # names lower-cased
    body: bytes

    def header(self, name: str, default: str = "") -> str:
        for key, value in self.headers:
            if key == name:
                return value
        return default


async def read_head(reader: asyncio.StreamReader) -> Message | None:
    """A message's start line and headers (its body still on the stream), or None at a clean end of stream."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise ConnectionError("connection closed mid-message") from exc
    except asyncio.LimitOverrunError as exc:
        raise ConnectionError("message head too large") from exc
    lines = head[:-4].decode("latin-1").split("\r\n")
    headers = []
    for line in lines[1:]:
        key, _, value = line.partition(":")
        headers.append((key.strip().lower(), value.strip()))
    return Message(lines[0], headers, b"")


async def read_message(reader: asyncio.StreamReader) -> Message | None:
    """One message, or None at a clean end of stream."""
    head = await read_head(reader)
    if head is None:
        return None
    length = int(head.header("content-length", "0") or 0)
    body = await reader.readexactly(length) if length else b""
    return Message(head.start, head.headers, body)


async def chunks(reader: asyncio.StreamReader, head: Message, timeout: float) -> AsyncIterator[bytes]:
    """The body after ``head`` as it arrives: chunked transfer coding decoded, or the content-length bytes."""
    if head.header("transfer-encoding").lower() != "chunked":
        length = int(head.header("content-length", "0") or 0)
        if length:
            yield await asyncio.wait_for(reader.readexactly(length), timeout)
        return
    while True:
        size = await asyncio.wait_for(reader.readuntil(b"\r\n"), timeout)
        count = int(size.split(b";", 1)[0].strip() or b"0", 16)
        if count == 0:
            await asyncio.wait_for(reader.readuntil(b"\r\n"), timeout)  # no trailers from our servers
            return
        data = await asyncio.wait_for(reader.readexactly(count + 2), timeout)
        yield data[:-2]


def encode(start: str, headers: list[tuple[str, str]], body: bytes) -> bytes:
    lines = [start, *(f"{k}: {v}" for k, v in headers if k != "content-length"), f"content-length: {len(body)}"]
    if any("\r" in line or "\n" in line for line in lines):  # never a second message smuggled into this one
        raise ValueError("CR or LF inside a request line or header")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def response(status: int, headers: list[tuple[str, str]], body: bytes) -> bytes:
    return encode(f"HTTP/1.1 {status} {REASONS.get(status, 'Status')}", headers, body)


def status_of(message: Message) -> int:
    return int(message.start.split(" ", 2)[1])
