"""Wake-ups for the embedded bus's consumers in other processes: a datagram instead of a polling delay.

A consumer in another process learns of a new record only by looking; looking every millisecond
costs a core's worth of wake-ups across a few consumers, and looking less often is latency. So each
consumer has a doorbell: a Linux abstract-namespace datagram socket named after the bus file
and its member id (nothing on disk to clean up). A publisher, after each commit, sends one byte to every member the bus's
``members`` table lists. A lost byte costs nothing: a full socket buffer is a doorbell already
rung, a member that is gone refuses it. A ring carries nothing: one from anyone else (abstract
names are listed in /proc/net/unix) costs the consumer one cheap look at the log, nothing more.
Where abstract sockets do not exist, consumers poll.
"""

from __future__ import annotations

import hashlib
import os
import select
import socket
from collections.abc import Iterable

SUPPORTED = hasattr(socket, "AF_UNIX") and os.uname().sysname == "Linux"


def address(path: str, member: str) -> str:
    digest = hashlib.sha256(os.path.realpath(path).encode()).hexdigest()[:16]
    return f"\0cascade-bus-{digest}-{member}"


class Doorbell:
    """One consumer's doorbell; ``wait`` returns when it rings or after ``timeout``."""

    def __init__(self, path: str, member: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            self.sock.bind(address(path, member))
        except OSError:
            self.sock.close()
            raise
        self.sock.setblocking(False)

    def wait(self, timeout: float) -> bool:
        """True if it rang (every ring so far is taken, so the next wait waits for a new one)."""
        ready, _, _ = select.select([self.sock], [], [], max(0.0, timeout))
        rang = False
        while ready:
            try:
                self.sock.recv(64)
                rang = True
            except BlockingIOError:
                break
        return rang

    def close(self) -> None:
        self.sock.close()


class Ringer:
    """A publisher's side: rings the doorbells of the given members, never blocking, never failing."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) if SUPPORTED else None
        if self.sock is not None:
            self.sock.setblocking(False)
        self._addresses: dict[str, str] = {}

    def ring(self, members: Iterable[str]) -> None:
        if self.sock is None:
            return
        for member in members:
            target = self._addresses.get(member)
            if target is None:
                target = self._addresses[member] = address(self.path, member)
            try:
                self.sock.sendto(b"!", target)
            except OSError:  # gone (refused), or its buffer is full: rung already
                pass

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
