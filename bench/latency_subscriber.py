"""A subscriber that notes when each event arrives: a plain ASGI app for uvicorn, in its own process.

The latency bench publishes from its own process; a subscriber there would share that process's
GIL with the publisher and stamp arrivals late under load. ``POST`` records ``ce-id`` with the
wall-clock time the request started; ``GET`` returns every arrival so far as JSON.
"""

from __future__ import annotations

import json
import time
from typing import Any

arrivals: dict[str, float] = {}


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    now = time.time()
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False)
    body = b""
    if scope["method"] == "POST":
        ident = dict(scope["headers"]).get(b"ce-id")
        if ident is not None:
            arrivals.setdefault(ident.decode(), now)
    else:
        body = json.dumps(arrivals).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", str(len(body)).encode()), (b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})
