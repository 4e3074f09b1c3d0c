"""The activator's connections to one instance: a pool of keep-alive streams.

Function instances listen on UNIX sockets; command services (model servers) on
``tcp://127.0.0.1:PORT``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

from cascade.serving.runtime import http11


async def _exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, start: str,
                    headers: list[tuple[str, str]], body: bytes, timeout: float,
                    read: Callable[[asyncio.StreamReader], Awaitable[http11.Message | None]]) -> http11.Message:
    """Write one request and read what ``read`` reads of the answer (all of it, or its head)."""
    writer.write(http11.encode(start, headers, body))
    await writer.drain()
    message = await asyncio.wait_for(read(reader), timeout)
    if message is None:
        raise ConnectionError("instance closed the connection")
    return message


class Upstream:
    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def request(self, method: str, path: str, headers: list[tuple[str, str]], body: bytes,
                      timeout: float) -> http11.Message:
        """Send one request; ConnectionError if the instance is gone or hangs up."""
        for attempt in range(2):
            fresh = not self._idle
            try:
                reader, writer = self._idle.pop() if self._idle else await self._connect()
            except OSError as exc:  # its socket is gone or refuses: the instance died
                raise ConnectionError(str(exc) or type(exc).__name__) from exc
            try:
                message = await _exchange(reader, writer, f"{method} {path} HTTP/1.1", headers, body, timeout,
                                          http11.read_message)
            except (ConnectionError, OSError, asyncio.IncompleteReadError) as exc:
                writer.close()
                if fresh or attempt:
                    raise ConnectionError(str(exc) or type(exc).__name__) from exc
                continue  # a stale pooled connection: try a new one
            except BaseException:
                writer.close()
                raise
            self._idle.append((reader, writer))
            return message
        raise AssertionError("unreachable")

    async def stream(self, method: str, path: str, headers: list[tuple[str, str]], body: bytes,
                     timeout: float) -> AsyncIterator[http11.Message | bytes]:
        """Send one request and yield the response's head, then its body piece by piece as the instance writes
        it (a streamed answer). ``timeout`` bounds each wait; ConnectionError if the instance goes away."""
        reader, writer = await self._connect()  # a connection of its own, kept only if the stream ends cleanly
        clean = False
        try:
            head = await _exchange(reader, writer, f"{method} {path} HTTP/1.1", headers, body, timeout,
                                   http11.read_head)
            yield head
            async for piece in http11.chunks(reader, head, timeout):
                yield piece
            clean = True
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
            raise ConnectionError(str(exc) or type(exc).__name__) from exc
        finally:
            if clean:
                self._idle.append((reader, writer))
            else:
                writer.close()

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self.socket_path.startswith("tcp://"):
            host, _, port = self.socket_path[len("tcp://"):].rpartition(":")
            return await asyncio.open_connection(host, int(port))
        return await asyncio.open_unix_connection(self.socket_path)

    def close(self) -> None:
        for _, writer in self._idle:
            writer.close()
        self._idle.clear()
