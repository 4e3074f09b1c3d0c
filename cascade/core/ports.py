"""Free TCP ports on the loopback interface, for processes Cascade starts on one machine."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_ports(count: int) -> int:
    """A base port with ``count`` ports after it that fit below 65000 (good enough on one machine)."""
    for _ in range(50):
        base = free_port()
        if base + count < 65000:
            return base
    raise RuntimeError("no free ports")
