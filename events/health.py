"""Readiness: which of a server's dependencies answer, for ``/readyz`` and the dashboard.

Each server names what it needs to do its job (the gateway: bus and state store; the
runtime: the state store its idempotent functions claim events in; the dispatcher: both)
and ``/readyz`` answers 200 only when every one answers, with one line per dependency so
the failing one is named. Checks are blocking client calls: callers on an event loop run
``report`` in a worker thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from cascade.core.errors import CascadeError

Check = Callable[[], None]  # raises (BusUnavailable, StoreUnavailable...) when the dependency is away


class Health:
    def __init__(self, checks: Mapping[str, Check]) -> None:
        self.checks = dict(checks)
        self._last: tuple[float, tuple[bool, dict[str, Any]]] | None = None

    def report(self, max_age: float = 0.0) -> tuple[bool, dict[str, Any]]:
        """(ready, {"status": "ready"|"unavailable", "checks": {name: "ok" | why}}).

        ``max_age``: a report at most that many seconds old may be returned instead of asking
        again (for a page polled several times a second; ``/readyz`` always asks).
        """
        last = self._last
        if max_age > 0 and last is not None and time.monotonic() - last[0] <= max_age:
            return last[1]
        results: dict[str, str] = {}
        for name, check in self.checks.items():
            try:
                check()
                results[name] = "ok"
            except CascadeError as exc:
                results[name] = str(exc)[:300]
            except Exception as exc:  # a client that raises outside the error tree is still "down"
                results[name] = f"{type(exc).__name__}: {exc}"[:300]
        ready = all(v == "ok" for v in results.values())
        report = ready, {"status": "ready" if ready else "unavailable", "checks": results}
        self._last = (time.monotonic(), report)
        return report
