"""Effectively-once handling on top of at-least-once delivery.

Before running a handler, claim ``(scope, source, id)`` with a TTL. A claim that already
says *done* means the event was handled: acknowledge it without a second invocation. A
claim held by someone else is *busy*. A claim left by a crashed process expires after its
TTL and the event is handled again; with a :class:`Liveness` the claim is taken over as
soon as its owner stops beating, without waiting for the TTL. An owner whose own attempt
ended without giving the claim back (the store was down) asks ``held`` before trying again:
the claim is still its own. Written once over the StateStore protocol, so Redis and SQLite
behave the same.

Under load the store's round trips, not the work, bound a dispatcher: ``claim_many`` claims a
batch of events in one round trip, and ``complete`` is a group commit (everything completed
while the previous write was in flight goes in the next ``put_many``), so a thousand events a
second cost tens of round trips, not thousands; ``complete_later`` lets the caller move on while
the write is in flight. The writer lingers a few milliseconds after the first completion of a batch
(``linger``, as a Kafka producer does) so that at a steady trickle it wakes once per batch, not once
per event: each wake-up is a thread switch and a turn of the interpreter lock, which at 1,000 events/s
cost the dispatcher more CPU than the writes. ``complete``, which its caller waits for, does not linger.
"""

from __future__ import annotations

import hashlib
import logging
import queue
import threading
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from enum import Enum

from cascade.stores import StateStore

DONE = b"done"
log = logging.getLogger("cascade.idempotency")


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
                 liveness: Liveness | None = None, linger: float = 0.005) -> None:
        self.store, self.scope = store, scope
        self.claim_ttl, self.done_ttl, self.linger = claim_ttl, done_ttl, linger
        self.liveness = liveness
        self.owner = (liveness.owner if liveness else f"owner-{uuid.uuid4().hex}").encode()
        self._done: queue.SimpleQueue[tuple[str, Callable[[BaseException | None], None]]] = queue.SimpleQueue()
        self._writer: threading.Thread | None = None  # started by the first completion
        self._waited = threading.Event()  # set by ``complete``: someone waits for the write, do not linger
        self._start = threading.Lock()

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

    def claim_many(self, events: Sequence[tuple[str, str]]) -> list[Claim]:
        """Claims for ``(source, id)`` pairs in one round trip; what is neither free nor done (held by another
        owner, perhaps a dead one) is settled one by one as ``claim`` does."""
        found = self.store.add_many([self.key(s, i) for s, i in events], self.owner, ttl=self.claim_ttl)
        return [Claim.ACQUIRED if current is None else Claim.DONE if current == DONE else self.claim(s, i)
                for (s, i), current in zip(events, found)]

    def held(self, source: str, id: str) -> bool:
        """Whether this owner holds the claim: for a caller whose own attempt ended without
        completing or releasing it (never for deciding between two concurrent attempts)."""
        return self.store.get(self.key(source, id)) == self.owner

    def complete(self, source: str, id: str) -> None:
        """Mark the event handled; returns once the store has it. Concurrent callers share one write: a writer
        thread puts everything queued while its last write was in flight in the next one."""
        future: Future[None] = Future()
        self.complete_later(source, id, lambda exc: future.set_result(None) if exc is None else future.set_exception(exc))
        self._waited.set()
        future.result()

    def complete_later(self, source: str, id: str, then: Callable[[BaseException | None], None]) -> None:
        """``complete`` without waiting: ``then`` runs on the writer thread once the write is done (None) or failed
        (the error), so a caller can go on with its next event instead of sleeping until the write is back. ``then``
        must be quick and must not raise: every completion after it waits for it."""
        with self._start:
            if self._writer is None or not self._writer.is_alive():  # not started, or lost in a fork
                self._writer = threading.Thread(target=self._write_completions, name="cascade-completions",
                                                daemon=True)
                self._writer.start()
        self._done.put((self.key(source, id), then))

    def _write_completions(self) -> None:
        while True:
            batch: dict[str, list[Callable[[BaseException | None], None]]] = {}
            key, then = self._done.get()
            if self.linger > 0 and not self._waited.is_set():  # not a blocking get: each put would wake it
                self._waited.wait(self.linger)
            self._waited.clear()  # what a waiting caller queued is in this batch
            while True:
                batch.setdefault(key, []).append(then)
                if len(batch) >= 1000:
                    break
                try:
                    key, then = self._done.get_nowait()
                except queue.Empty:
                    break
            error: BaseException | None = None
            try:
                self.store.put_many(dict.fromkeys(batch, DONE), ttl=self.done_ttl)
            except BaseException as exc:  # every caller of this batch learns of it
                error = exc
            for callbacks in batch.values():
                for call in callbacks:
                    try:
                        call(error)
                    except Exception:  # one caller's bug must not stop the completions of every other
                        log.exception("completion callback failed")

    def release(self, source: str, id: str) -> None:
        """Give a claim back after a failure so a retry can run the handler."""
        self.store.cas(self.key(source, id), self.owner, None)

