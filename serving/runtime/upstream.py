"""The activator's connections to one instance: a pool of keep-alive streams.

Function instances listen on UNIX sockets; command services (model servers) on
``tcp://127.0.0.1:PORT``.
"""

from __future__ import annotations

import asyncio

from cascade.serving.runtime import http11


class Upstream:
    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def request(self, method: str, path: str, headers: list[tuple[str, str]], body: bytes,
                      timeout: float) -> http11.Message:
        """Send one request; ConnectionError if the instance is gone or hangs up."""
        for attempt in range(2):
            fresh = not self._idle
            reader, writer = self._idle.pop() if self._idle else await self._connect()
            try:
                writer.write(http11.encode(f"{method} {path} HTTP/1.1", headers, body))
                await writer.drain()
                message = await asyncio.wait_for(http11.read_message(reader), timeout)
                if message is None:
                    raise ConnectionError("instance closed the connection")
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

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self.socket_path.startswith("tcp://"):
            host, _, port = self.socket_path[len("tcp://"):].rpartition(":")
            return await asyncio.open_connection(host, int(port))
        return await asyncio.open_unix_connection(self.socket_path)

    def close(self) -> None:
        for _, writer in self._idle:
            writer.close()
        self._idle.clear()
