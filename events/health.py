"""Readiness: which of a server's dependencies answer, for ``/readyz`` and the dashboard.

Each server names what it needs to do its job (the gateway: bus and state store; the
runtime: the state store its idempotent functions claim events in; the dispatcher: both)
and ``/readyz`` answers 200 only when every one answers, with one line per dependency so
the failing one is named. Checks are blocking client calls: callers on an event loop run
``report`` in a worker thread.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from cascade.core.errors import CascadeError

Check = Callable[[], None]  # raises (BusUnavailable, StoreUnavailable...) when the dependency is away


class Health:
    def __init__(self, checks: Mapping[str, Check]) -> None:
        self.checks = dict(checks)

    def report(self) -> tuple[bool, dict[str, Any]]:
        """(ready, {"status": "ready"|"unavailable", "checks": {name: "ok" | why}})."""
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
        return ready, {"status": "ready" if ready else "unavailable", "checks": results}
