"""Per-project token buckets: a project may publish ``rate`` events/s with bursts of ``burst``.

In-process and lock-protected; each gateway replica limits independently, as Knative's
activator does per pod. A rejected request consumes nothing.
"""

from __future__ import annotations

import threading
import time

from cascade.events.gateway.errors import RateLimited


class RateLimiter:
    def __init__(self, rate: float, burst: int) -> None:
        self.rate, self.burst = rate, burst
        self._buckets: dict[str, tuple[float, float]] = {}  # project -> (tokens, last refill)
        self._lock = threading.Lock()

    def take(self, project: str, count: int = 1) -> None:
        """Spend ``count`` tokens or raise RateLimited (spending none)."""
        with self._lock:
            now = time.monotonic()
            tokens, last = self._buckets.get(project, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - last) * self.rate)
            if count > tokens:
                self._buckets[project] = (tokens, now)
                wait = (count - tokens) / self.rate if count <= self.burst else float("inf")
                limit = f"{self.rate:g} events/s, bursts of {self.burst}"
                raise RateLimited(f"project {project!r} is over its rate limit ({limit})",
                                  retry_after=min(wait, 3600.0))
            self._buckets[project] = (tokens - count, now)
