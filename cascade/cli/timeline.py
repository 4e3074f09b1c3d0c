"""What ``cascade demo`` watches with: a timeline of steps and a follower of the bus.

The watcher joins its own consumer group from ``latest`` and waits for its partitions, so
nothing the demo causes afterwards is missed; each step waits for the event that proves it,
looking first at what already arrived. The helpers ask the runtime how many instances run.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cloudevents.http import CloudEvent

from cascade.core.errors import CascadeError
from cascade.events.bus import EventBus
from cascade.events.envelope import event_type
from cascade.serving.runtime.admin import runtime_admin


class DemoFailed(Exception):
    """A step of the demo did not happen; the message says which and what was seen."""


@dataclass
class Timeline:
    """What the demo saw, in order: (seconds since start, what, detail)."""

    say: Callable[[str], None]
    start: float = field(default_factory=time.monotonic)
    rows: list[tuple[float, str, str]] = field(default_factory=list)

    def mark(self, what: str, detail: str = "") -> None:
        at = time.monotonic() - self.start
        since = at - self.rows[-1][0] if self.rows else at
        self.rows.append((at, what, detail))
        self.say(f"  {at:8.2f}s  (+{since:6.2f}s)  {what:<34} {detail}")


class Watcher:
    """Every event on the topic since the demo began; waits for the one a step needs."""

    def __init__(self, bus: EventBus, topic: str, timeline: Timeline) -> None:
        self.consumer = bus.subscribe([topic], f"{topic}.demo.{uuid.uuid4().hex[:12]}", start="latest")
        self.seen: list[CloudEvent] = []
        self.timeline = timeline
        deadline = time.monotonic() + 60
        while not self.consumer.assignment():  # "latest" means from when the group got its partitions
            if time.monotonic() > deadline:
                raise DemoFailed("the bus assigned no partitions to the demo's consumer within 60s")
            self._take(self.consumer.poll(0.2))

    def _take(self, records: list[Any]) -> None:
        for record in records:
            try:
                self.seen.append(record.event())
            except CascadeError:
                continue

    def wait(self, kind: str, match: Callable[[CloudEvent, dict[str, Any]], bool], timeout: float,
             detail: Callable[[dict[str, Any]], str] = lambda d: "") -> dict[str, Any]:
        wanted = event_type(kind)
        deadline, checked = time.monotonic() + timeout, 0
        while True:
            for event in self.seen[checked:]:
                raw = event.get_data()
                data: dict[str, Any] = raw if isinstance(raw, dict) else {}
                if event["type"] == wanted and match(event, data):
                    self.timeline.mark(kind, detail(data))
                    return data
            checked = len(self.seen)
            if time.monotonic() > deadline:
                raise DemoFailed(f"no {kind} within {timeout:.0f}s (saw: {', '.join(self._types()) or 'nothing'})")
            self._take(self.consumer.poll(0.2))

    def _types(self) -> list[str]:
        return sorted({str(e["type"]).removeprefix("io.cascade.").removesuffix(".v1") for e in self.seen})


def wait_until(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise DemoFailed(f"{what} did not happen within {timeout:.0f}s")
        time.sleep(0.2)


def instances(url: str, token: str) -> dict[str, int]:
    """Instances per service of the runtime at ``url`` (``token``: its platform credential)."""
    services = runtime_admin(url, "/_runtime/services", token)
    if services is None:
        return {"(unreachable)": 1}
    return {str(s["name"]): int(s["ready"]) + int(s["starting"]) for s in services}
