"""One place that picks the event loop for the platform's own loops (the dispatcher's deliveries).

uvloop (libuv; uvicorn[standard] brings it on Linux and macOS) runs the same asyncio code with
less CPU per callback and socket read than asyncio's pure-Python selector loop; a delivery
costs measurably less on it. Where it is missing (Windows), asyncio's own loop does the same work.
"""

from __future__ import annotations

import asyncio

try:
    import uvloop
except ImportError:  # pragma: no cover - not on this platform
    uvloop = None  # type: ignore[assignment]


def new_loop() -> asyncio.AbstractEventLoop:
    """A new event loop, uvloop's where it is installed."""
    return uvloop.new_event_loop() if uvloop is not None else asyncio.new_event_loop()
