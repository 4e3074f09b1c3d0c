"""Effectively-once handling on top of at-least-once delivery.

Before running a handler, claim ``(scope, source, id)`` with a TTL. A claim that already
says *done* means the event was handled: acknowledge it without a second invocation. A
claim held by someone else is *busy*. A claim left by a crashed process expires after its
TTL and the event is handled again; with a :class:`Liveness` the claim is taken over as
soon as its owner stops beating, without waiting for the TTL. An owner whose own attempt
ended without giving the claim back (the store was down) asks ``held`` before trying again:
the claim is still its own. Written once over the StateStore protocol, so Redis and SQLite
behave the same.
"""

from __future__ import annotations

import hashlib
import threading
import uuid
from enum import Enum

from cascade.stores import StateStore

DONE = b"done"


class Claim(Enum):
    ACQUIRED = "acquired"  # run the handler, then complete() or release()
    DONE = "done"  # handled before: acknowledge, do not run again
    BUSY = "busy"  # another live worker holds it: try later


class Liveness:
    """A process's heartbeat in the store: ``alive:<owner>`` that expires ``ttl`` s after the last beat."""

    def __init__(self, store: StateStore, owner: str | None = None, *, ttl: float = 5.0,
                 first_beat: bool = True) -> None:
        self.store, self.ttl = store, ttl
        self.owner = owner or f"owner-{uuid.uuid4().hex}"
        self._stop = threading.Event()
        if first_beat:
            self.beat()

    def beat(self) -> None:
        self.store.put(f"alive:{self.owner}", b"1", ttl=self.ttl)

    def alive(self, owner: str) -> bool:
        return self.store.get(f"alive:{owner}") is not None

    def start(self) -> None:
        """Beat now (before any claim of ours can be looked at) and every ttl/3 seconds in a daemon
        thread until stop(); a failed beat (store away) is tried again at the next tick."""
        def loop() -> None:
            while not self._stop.wait(self.ttl / 3):
                try:
                    self.beat()
                except Exception:  # a store hiccup: the next beat may work
                    pass
        try:
            self.beat()
        except Exception:
            pass
        threading.Thread(target=loop, name="cascade-liveness", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()
        self.store.delete(f"alive:{self.owner}")


class Idempotency:
    """Claims for one scope (e.g. a trigger name)."""

    def __init__(self, store: StateStore, scope: str, *, claim_ttl: float = 60.0, done_ttl: float = 7 * 86400.0,
                 liveness: Liveness | None = None) -> None:
        self.store, self.scope = store, scope
        self.claim_ttl, self.done_ttl = claim_ttl, done_ttl
        self.liveness = liveness
        self.owner = (liveness.owner if liveness else f"owner-{uuid.uuid4().hex}").encode()

    def key(self, source: str, id: str) -> str:
        digest = hashlib.sha256(f"{source}\x00{id}".encode()).hexdigest()[:32]
        return f"idem:{self.scope}:{digest}"

    def claim(self, source: str, id: str) -> Claim:
        key = self.key(source, id)
        for _ in range(3):
            if self.store.cas(key, None, self.owner, ttl=self.claim_ttl):
                return Claim.ACQUIRED
            current = self.store.get(key)
            if current == DONE:
                return Claim.DONE
            if current is None:
                continue  # expired or released meanwhile: try again
            if self.liveness and current != self.owner and not self.liveness.alive(current.decode()):
                if self.store.cas(key, current, self.owner, ttl=self.claim_ttl):
                    return Claim.ACQUIRED  # its owner died: take it over now
                continue
            return Claim.BUSY
        return Claim.BUSY

    def held(self, source: str, id: str) -> bool:
        """Whether this owner holds the claim: for a caller whose own attempt ended without
        completing or releasing it (never for deciding between two concurrent attempts)."""
        return self.store.get(self.key(source, id)) == self.owner

    def complete(self, source: str, id: str) -> None:
        self.store.put(self.key(source, id), DONE, ttl=self.done_ttl)

    def release(self, source: str, id: str) -> None:
        """Give a claim back after a failure so a retry can run the handler."""
        self.store.cas(self.key(source, id), self.owner, None)
