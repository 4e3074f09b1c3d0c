"""One trigger's consumer loop: decode, validate, filter, claim, deliver, then acknowledge.

``unordered`` runs up to ``concurrency`` deliveries at once; ``ordered`` runs one at a time
per partition, in offset order. Either way a record is acknowledged only when it is fully
handled (delivered, dead-lettered or filtered out), and the bus commits only the
contiguous acknowledged prefix, so a crash never skips an unfinished event.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from cloudevents.http import CloudEvent

from cascade.core.errors import InvalidInput, RetryableError
from cascade.events.bus import Consumer, EventBus, Record, TopicPartition
from cascade.events.dispatcher.deadletters import dead_letter
from cascade.events.dispatcher.delivery import deliver
from cascade.events.dispatcher.http import ThreadLocalHTTP
from cascade.events.envelope import check_event
from cascade.events.triggers import Trigger
from cascade.stores import StateStore
from cascade.stores.idempotency import Claim, Idempotency, Liveness

log = logging.getLogger("cascade.dispatcher")


@dataclass
class Stats:
    delivered: int = 0
    retried: int = 0
    dead_lettered: int = 0
    filtered: int = 0
    duplicates: int = 0
    in_flight: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, **counts: int) -> None:
        with self.lock:
            for name, n in counts.items():
                setattr(self, name, getattr(self, name) + n)

    def snapshot(self) -> dict[str, int]:
        with self.lock:
            return {k: getattr(self, k) for k in ("delivered", "retried", "dead_lettered", "filtered",
                                                  "duplicates", "in_flight")}


class TriggerWorker:
    def __init__(self, trigger: Trigger, bus: EventBus, store: StateStore, topic: str,
                 resolve: Callable[[str], str], client: ThreadLocalHTTP, *, liveness: Liveness | None = None,
                 buffer: int = 1000, function_auth: Mapping[str, str] | None = None) -> None:
        self.trigger, self.bus, self.topic, self.client = trigger, bus, topic, client
        self.url = trigger.subscriber if trigger.is_url else resolve(trigger.subscriber)
        # the platform credential goes to the platform's functions, never to a subscriber URL
        self.auth = {} if trigger.is_url else dict(function_auth or {})
        self.idem = Idempotency(store, f"trigger:{trigger.group(topic)}",  # per platform sharing the store
                                claim_ttl=trigger.delivery.worst_case_seconds() + 30, liveness=liveness)
        self.stats = Stats()
        self._unrecorded: set[tuple[str, str]] = set()  # delivered, but the store did not take the completion
        self.stop_event = threading.Event()
        self._slots = threading.Semaphore(buffer if trigger.ordering == "ordered" else trigger.concurrency)
        self._pool = ThreadPoolExecutor(trigger.concurrency if trigger.ordering == "unordered" else 64,
                                        thread_name_prefix=f"trigger-{trigger.name}")
        self._queues: dict[TopicPartition, deque[Record]] = {}
        self._running: set[TopicPartition] = set()
        self._lock = threading.Lock()
        self._consumer: Consumer | None = None
        self._written = threading.Condition()  # completions handed to the store's writer, not yet written
        self._unwritten, self._unwritten_limit = 0, buffer
        self._rewrites: queue.SimpleQueue[tuple[Record, tuple[str, str]]] = queue.SimpleQueue()
        self._rewriter: threading.Thread | None = None

    # -- the loop ----------------------------------------------------------------------
    def run(self) -> None:
        while True:
            try:
                consumer = self.bus.subscribe([self.topic, self.trigger.retry_topic(self.topic)],
                                              self.trigger.group(self.topic),
                                              start=self.trigger.start)
                break
            except RetryableError as exc:
                log.warning("trigger %s: cannot subscribe (%s); retrying", self.trigger.name, exc)
                if self.stop_event.wait(1.0):
                    return
        self._consumer = consumer
        try:
            while not self.stop_event.is_set():
                try:
                    records = consumer.poll(0.2, max_records=200)
                except RetryableError as exc:  # the broker is away for a moment: keep the trigger alive
                    log.warning("trigger %s: poll failed (%s); retrying", self.trigger.name, exc)
                    self.stop_event.wait(1.0)
                    continue
                if self.trigger.ordering == "ordered":
                    for record in records:
                        if not self._slot():
                            return
                        self._enqueue(record)
                    continue
                # unordered: the whole poll's events are claimed in one round trip, then each waits for a slot
                # (claiming only as many as there were free slots made a round trip per record or two: the
                # poll thread, not the deliveries, set the pace)
                for record, claimed in zip(records, self._claim(records)):
                    if not self._slot():
                        return
                    self._pool.submit(self._handle_and_ack, record, claimed)
        except Exception:
            log.exception("trigger %s: consumer loop failed", self.trigger.name)
            raise
        finally:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._drain_completions(10.0)  # what was delivered is acknowledged before the offsets are committed
            consumer.close()

    def _slot(self) -> bool:
        """Wait for room for one more record in flight; False when stopping."""
        while not self._slots.acquire(timeout=0.2):
            if self.stop_event.is_set():
                return False
        self.stats.add(in_flight=1)
        return True

    def _claim(self, records: list[Record]) -> list[tuple[CloudEvent, Claim] | None]:
        """Decode and filter ``records`` and claim the events to deliver in one round trip; None where the
        record's handler decides by itself (not an event, filtered out, a replay, the store away)."""
        wanted: list[tuple[int, CloudEvent]] = []
        for i, record in enumerate(records):
            try:
                event = record.event()
                check_event(event)
            except InvalidInput:
                continue
            if not event.get("cascadereplay") and self.trigger.matches(event.get_attributes(), event.get_data()):
                wanted.append((i, event))
        out: list[tuple[CloudEvent, Claim] | None] = [None] * len(records)
        if not wanted:
            return out
        try:
            claims = self.idem.claim_many([(str(e["source"]), str(e["id"])) for _, e in wanted])
        except RetryableError:
            return out  # each handler tries again by itself
        for (i, event), claim in zip(wanted, claims):
            out[i] = (event, claim)
        return out

    def _enqueue(self, record: Record) -> None:
        with self._lock:
            self._queues.setdefault(record.tp, deque()).append(record)
            if record.tp in self._running:
                return
            self._running.add(record.tp)
        self._pool.submit(self._drain, record.tp)

    def _drain(self, tp: TopicPartition) -> None:
        while True:
            with self._lock:
                queue = self._queues[tp]
                if not queue or self.stop_event.is_set():
                    self._running.discard(tp)
                    return
                record = queue.popleft()
            self._handle_and_ack(record)

    # -- one record --------------------------------------------------------------------
    def _handle_and_ack(self, record: Record, claimed: tuple[CloudEvent, Claim] | None = None) -> None:
        held: set[tuple[str, str]] = set()  # claims this record's own attempts took and still hold
        try:
            while not self.stop_event.is_set():
                try:
                    first, claimed = claimed, None  # a batch claim holds for the first attempt only
                    if self.handle(record, held, first, later=True):
                        assert self._consumer is not None
                        self._consumer.ack(record)
                    return
                except RetryableError as exc:  # bus or store down: try again, keep the record unacked
                    log.warning("trigger %s: %s; retrying", self.trigger.name, exc)
                    self.stop_event.wait(1.0)
        except Exception:
            log.exception("trigger %s: handling %s/%s failed", self.trigger.name, record.partition, record.offset)
        finally:
            self.stats.add(in_flight=-1)
            self._slots.release()

    # -- completions written behind the deliveries -------------------------------------
    def _complete_later(self, record: Record, key: tuple[str, str]) -> None:
        """Hand a delivered record's completion to the store's writer and go on: the writer acknowledges the record
        once the completion is written. A delivery thread thus waits for its subscriber, not for the store; at
        most ``buffer`` completions are unwritten at a time (then a delivery waits for room)."""
        with self._written:
            while self._unwritten >= self._unwritten_limit:
                self._written.wait()
            self._unwritten += 1

        def then(error: BaseException | None) -> None:  # on the writer thread: quick, never raises
            if error is None:
                self._recorded(record, key)
                self._wrote()
            else:  # the store failed the batch: write it again on the rewrite thread
                self._rewrites.put((record, key))
                with self._written:
                    if self._rewriter is None:
                        self._rewriter = threading.Thread(target=self._rewrite, daemon=True,
                                                          name=f"trigger-{self.trigger.name}-rewrite")
                        self._rewriter.start()
        self.idem.complete_later(*key, then)

    def _rewrite(self) -> None:
        """Completions whose write failed, written again one at a time until the store takes them (one thread, so
        that a store that stays away holds neither the delivery threads nor the store's writer)."""
        while True:
            record, key = self._rewrites.get()
            try:
                while True:
                    try:
                        self.idem.complete(*key)
                    except RetryableError as exc:  # the store is away: the record stays unacked until it is back
                        log.warning("trigger %s: %s; retrying the completion", self.trigger.name, exc)
                        if self.stop_event.wait(1.0):
                            break  # not acknowledged: delivered again after a restart, then completed
                        continue
                    self._recorded(record, key)
                    break
            except Exception:
                log.exception("trigger %s: completing %s/%s failed", self.trigger.name, record.partition,
                              record.offset)
            finally:
                self._wrote()

    def _recorded(self, record: Record, key: tuple[str, str]) -> None:
        """The store has the record's completion: a retry need not deliver it again, and it may be acknowledged."""
        self._unrecorded.discard(key)
        assert self._consumer is not None
        self._consumer.ack(record)

    def _wrote(self) -> None:
        with self._written:
            self._unwritten -= 1
            self._written.notify_all()

    def _drain_completions(self, timeout: float) -> None:
        """Wait (at most ``timeout`` s) until every handed-off completion is written and acknowledged."""
        with self._written:
            self._written.wait_for(lambda: self._unwritten == 0, timeout)

    def handle(self, record: Record, held: set[tuple[str, str]] | None = None,
               claimed: tuple[CloudEvent, Claim] | None = None, *, later: bool = False) -> bool:
        """Handle one record; True when it may be acknowledged. ``held``: claims an earlier attempt
        at this same record took and could not give back (the store was down). ``claimed``: the record's
        event and its claim, taken with its batch. ``later``: a delivered event's completion is handed to the
        store's writer, which acknowledges the record once it is written (False is returned)."""
        held = set() if held is None else held
        if claimed is not None:
            event = claimed[0]
        else:
            try:
                event = record.event()
                check_event(event)
            except InvalidInput as exc:
                self._dead_letter(record, None, f"{type(exc).__name__}: {exc}", 0)
                return True
            if not self.trigger.matches(event.get_attributes(), event.get_data()):
                self.stats.add(filtered=1)
                return True
        source, ident = str(event["source"]), str(event["id"])
        if event.get("cascadereplay"):
            ident += f"#replay{event['cascadereplay']}"
        if (source, ident) in self._unrecorded:  # delivered already (by this or a concurrent attempt)
            self.idem.complete(source, ident)
            self._unrecorded.discard((source, ident))
            if (source, ident) not in held:  # not this record's own retry: a second copy of the event
                self.stats.add(duplicates=1)
            return True
        if claimed is not None:
            claim = claimed[1]
        elif (source, ident) in held and self.idem.held(source, ident):
            claim = Claim.ACQUIRED  # our own earlier attempt at this record still holds it
        else:
            claim = self.idem.claim(source, ident)
        while claim is Claim.BUSY:  # another dispatcher is on it (rebalance) or crashed holding it
            if self.stop_event.wait(0.5):
                return False
            claim = self.idem.claim(source, ident)
        if claim is Claim.ACQUIRED:
            held.add((source, ident))
        if claim is Claim.DONE:
            self.stats.add(duplicates=1)
            return True
        try:
            outcome = deliver(self.client, self.url, event, self.trigger.delivery, self.stop_event, self.auth)
            if outcome.aborted:
                self.idem.release(source, ident)
                return False
            if outcome.ok:
                for reply in outcome.replies:
                    for name in ("traceparent", "tracestate", "project"):
                        if event.get(name) and not reply.get(name):
                            reply[name] = event[name]
                if outcome.replies:
                    self.bus.publish_many(self.topic, list(outcome.replies))
                self.stats.add(delivered=1, retried=outcome.attempts - 1)  # one lock round for both
            else:
                self.stats.add(retried=outcome.attempts - 1)
                self._dead_letter(record, outcome.code, outcome.error, outcome.attempts)
        except RetryableError:
            raise  # bus or store away: the claim stays ours (this record's next attempt re-takes it)
        except BaseException:
            self.idem.release(source, ident)
            raise
        self._unrecorded.add((source, ident))  # until the store has it, a retry must not deliver again
        if later:
            self._complete_later(record, (source, ident))
            return False
        self.idem.complete(source, ident)
        self._unrecorded.discard((source, ident))
        return True

    def _dead_letter(self, record: Record, code: int | None, error: str, attempts: int) -> None:
        letter = dead_letter(record.wire, self.trigger.name, self.url, code, error, attempts)
        self.bus.append(self.trigger.dead_letter_topic, [letter])
        self.stats.add(dead_lettered=1)

    def stop(self) -> None:
        self.stop_event.set()

