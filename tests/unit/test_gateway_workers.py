"""The gateway's processes split each project's rate between them and refuse a port in use clearly."""

from __future__ import annotations

import pytest

from cascade.app.gateway_workers import Pokes, listen, share
from cascade.core.settings import GatewaySettings, Settings


def test_each_process_takes_its_share_of_the_rate_limits() -> None:
    cfg = Settings(gateway=GatewaySettings(rate_per_second=1000.0, burst=2001))
    shared = share(cfg, 4)
    assert (shared.gateway.rate_per_second, shared.gateway.burst) == (250.0, 501)
    assert share(Settings(gateway=GatewaySettings(burst=1)), 4).gateway.burst == 1, "never a bucket of 0"
    assert cfg.gateway.rate_per_second == 1000.0, "the platform's own settings are left alone"


def test_a_port_in_use_is_refused_with_the_port_named() -> None:
    taken = listen("127.0.0.1", 0)
    port = taken.getsockname()[1]
    with pytest.raises(RuntimeError, match=f"127.0.0.1:{port}.*in use"):
        listen("127.0.0.1", port)
    taken.close()


def test_a_poke_counts_only_with_the_workers_secret() -> None:
    import socket
    import threading

    got: list[str] = []
    arrived = threading.Event()
    pokes = Pokes(lambda conn_id: (got.append(conn_id), arrived.set()))
    out = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    out.sendto(b"conn-forged", pokes.address)  # another local user found the socket's name
    out.sendto(b"wrong:conn-forged", pokes.address)
    out.sendto(f"{pokes.secret}:conn-1".encode(), pokes.address)
    assert arrived.wait(5)
    assert got == ["conn-1"]
    out.close()
    pokes.close()
