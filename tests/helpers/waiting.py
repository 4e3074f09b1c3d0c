"""Waiting in tests: on a condition, with one deadline, never for a fixed time.

``until`` polls a check and says whether it came true in time; ``eventually`` fails the
test when it did not; ``events_until`` reads a topic from the beginning with a fresh
consumer group until the events seen so far satisfy ``done``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from cascade.events.bus import EventBus


def until(check: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    """True once ``check()`` is true; False when ``timeout`` seconds passed first."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)
    return True


def eventually(check: Callable[[], bool], timeout: float = 30.0, what: str = "condition",
               interval: float = 0.05) -> None:
    """Return once ``check()`` is true; fail after ``timeout`` seconds."""
    if not until(check, timeout, interval):
        pytest.fail(f"{what} did not happen within {timeout:g}s")


def holds(check: Callable[[], bool], duration: float, what: str = "condition", interval: float = 0.05) -> None:
    """Fail if ``check()`` is ever false during ``duration`` seconds (for 'nothing else happens')."""
    until = time.monotonic() + duration
    while time.monotonic() < until:
        assert check(), f"{what} stopped holding"
        time.sleep(interval)


def events_until(bus: EventBus, topic: str, done: Callable[[list[Any]], bool], timeout: float = 180,
                 keep: Callable[[Any], bool] = lambda e: True, what: str = "events") -> list[Any]:
    """Events on ``topic`` (from the start) that ``keep`` accepts, once ``done(seen)``; fail after ``timeout``."""
    consumer = bus.subscribe([topic], f"check-{uuid.uuid4().hex}", start="earliest")
    seen: list[Any] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            for record in consumer.poll(0.5):
                event = record.event()
                if keep(event):
                    seen.append(event)
            if done(seen):
                return seen
    finally:
        consumer.close()
    pytest.fail(f"waited {timeout:g}s for {what}; saw {[(e['type'], e.get('subject')) for e in seen]}")
