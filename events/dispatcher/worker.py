"""One trigger's consumer loop: decode, validate, filter, claim, deliver, then acknowledge.

``unordered`` runs up to ``concurrency`` deliveries at once on one event loop: a poll's events
are claimed in one round trip and handed over in one go, and only what needs the bus or the
store beyond that (a reply, a dead letter, a claim someone else holds) is handled on a thread.
``ordered`` runs one at a time per partition, in offset order, on threads. Either way a record
is acknowledged only when it is fully handled (delivered, dead-lettered or filtered out), and
the bus commits only the contiguous acknowledged prefix, so a crash never skips an unfinished
event.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial

from cloudevents.http import CloudEvent

from cascade.core.errors import InvalidInput, RetryableError
from cascade.core.loops import new_loop
from cascade.events.bus import Consumer, EventBus, Record, TopicPartition
from cascade.events.dispatcher.deadletters import dead_letter
from cascade.events.dispatcher.delivery import Outcome, deliver, deliver_async
from cascade.events.dispatcher.http import AsyncHTTP, ThreadLocalHTTP
from cascade.events.envelope import check_event
from cascade.events.triggers import Trigger
from cascade.stores import StateStore
from cascade.stores.idempotency import Claim, Idempotency, Liveness

log = logging.getLogger("cascade.dispatcher")
Claimed = tuple[CloudEvent, Claim]  # an event and the claim its batch took


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
        self._slots = threading.Semaphore(buffer)  # ordered: records read ahead of their partition's turn
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
        self._room = threading.Condition()  # unordered: notified when the delivery loop has room again

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
            if self.trigger.ordering == "ordered":
                self._poll_ordered(consumer)
            else:
                self._poll_unordered(consumer)
        except Exception:
            log.exception("trigger %s: consumer loop failed", self.trigger.name)
            raise
        finally:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._drain_completions(10.0)  # what was delivered is acknowledged before the offsets are committed
            consumer.close()

    def _poll(self, consumer: Consumer) -> list[Record]:
        try:
            return consumer.poll(0.2, max_records=200)
        except RetryableError as exc:  # the broker is away for a moment: keep the trigger alive
            log.warning("trigger %s: poll failed (%s); retrying", self.trigger.name, exc)
            self.stop_event.wait(1.0)
            return []

    def _poll_ordered(self, consumer: Consumer) -> None:
        while not self.stop_event.is_set():
            for record in self._poll(consumer):
                if not self._slot():
                    return
                self._enqueue(record)

    # -- unordered: one event loop delivers -------------------------------------------
    def _poll_unordered(self, consumer: Consumer) -> None:
        """Once fewer than ``concurrency`` records are waiting or in flight, claim a poll's events in one round trip
        and hand them to the delivery loop in one go (a hand-off per poll, not per event). On stop, what is in flight
        finishes and what still waits is dropped unacknowledged, its claims given back (delivered after a
        restart)."""
        loop = new_loop()
        incoming: asyncio.Queue[tuple[Record, Claimed | None] | None] = asyncio.Queue()
        stopping = asyncio.Event()
        runner = threading.Thread(target=loop.run_until_complete, args=(self._deliveries(incoming, stopping),),
                                  name=f"trigger-{self.trigger.name}-deliveries", daemon=True)
        runner.start()
        try:
            while not self.stop_event.is_set():
                records = self._poll(consumer)
                if not records:
                    continue
                with self._room:  # room first, claims then: no claim waits behind a full loop
                    while self.stats.in_flight >= self.trigger.concurrency:  # handed to the loop, not finished
                        if self.stop_event.is_set():
                            return
                        self._room.wait(0.2)
                self.stats.add(in_flight=len(records))
                batch = list(zip(records, self._claim(records)))
                loop.call_soon_threadsafe(_put_all, incoming, batch)
        finally:
            loop.call_soon_threadsafe(stopping.set)
            runner.join()
            loop.close()

    async def _deliveries(self, incoming: asyncio.Queue[tuple[Record, Claimed | None] | None],
                          stopping: asyncio.Event) -> None:
        client = AsyncHTTP(self.trigger.concurrency)

        async def deliverer() -> None:
            while (item := await incoming.get()) is not None:
                try:
                    await self._handle_async(client, *item, stopping)
                except Exception:
                    log.exception("trigger %s: handling %s/%s failed", self.trigger.name, item[0].partition,
                                  item[0].offset)
                finally:
                    self._finished(1)

        tasks = [asyncio.create_task(deliverer()) for _ in range(self.trigger.concurrency)]
        try:
            await stopping.wait()
            dropped: list[tuple[Record, Claimed | None]] = []
            while not incoming.empty():
                if (item := incoming.get_nowait()) is not None:
                    dropped.append(item)
            self._give_back(dropped)
            self._finished(len(dropped))
            for _ in tasks:
                incoming.put_nowait(None)
            await asyncio.gather(*tasks)
        finally:
            await client.close()

    def _give_back(self, items: list[tuple[Record, Claimed | None]]) -> None:
        """Release the claims of records dropped on stop, so that whoever reads them next need not wait for the
        claims to expire (best effort: with the store away, they do)."""
        for _, claimed in items:
            if claimed is not None and claimed[1] is Claim.ACQUIRED:
                try:
                    self.idem.release(*_key(claimed[0]))
                except RetryableError:
                    return

    def _finished(self, n: int) -> None:
        if not n:
            return
        self.stats.add(in_flight=-n)
        with self._room:
            if self.stats.in_flight < self.trigger.concurrency:
                self._room.notify()

    async def _handle_async(self, client: AsyncHTTP, record: Record, claimed: Claimed | None,
                            stopping: asyncio.Event) -> None:
        """A freshly claimed event is delivered and settled here; anything else (no claim, someone else's, a
        second copy in flight) is handled on a thread, where the store may be asked and waited for."""
        loop = asyncio.get_running_loop()
        if claimed is None or claimed[1] is not Claim.ACQUIRED or _key(claimed[0]) in self._unrecorded:
            await loop.run_in_executor(self._pool, self._handle_until_done, record, claimed)
            return
        event = claimed[0]
        key = _key(event)
        try:
            outcome = await deliver_async(client, self.url, event, self.trigger.delivery, stopping, self.auth)
        except BaseException:
            self.idem.release(*key)
            raise
        if outcome.ok and not outcome.replies and self._unwritten < self._unwritten_limit:
            self._settle(record, event, key, outcome, later=True)  # no I/O on this path: the store's writer acks
            return
        # replies to publish, a dead letter, a stop, or completions piling up: bus and store calls, on a thread
        await loop.run_in_executor(self._pool, self._until_done, record, {key},
                                   lambda: self._settle(record, event, key, outcome, later=True))

    def _slot(self) -> bool:
        """Wait for room for one more record in flight; False when stopping."""
        while not self._slots.acquire(timeout=0.2):
            if self.stop_event.is_set():
                return False
        self.stats.add(in_flight=1)
        return True

    def _claim(self, records: list[Record]) -> list[Claimed | None]:
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
        out: list[Claimed | None] = [None] * len(records)
        if not wanted:
            return out
        try:
            claims = self.idem.claim_many([_key(e) for _, e in wanted])
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
    def _handle_and_ack(self, record: Record) -> None:
        try:
            self._handle_until_done(record)
        finally:
            self.stats.add(in_flight=-1)
            self._slots.release()

    def _handle_until_done(self, record: Record, claimed: Claimed | None = None) -> None:
        held: set[tuple[str, str]] = set()  # claims this record's own attempts took and still hold
        self._until_done(record, held, lambda: self.handle(record, held, claimed, later=True))

    def _until_done(self, record: Record, held: set[tuple[str, str]], attempt: Callable[[], bool]) -> None:
        """Run ``attempt`` (True: the record may be acknowledged now); while the bus or the store is away, handle the
        record again (with the claims ``held`` by the earlier attempts) until that works or the worker stops."""
        try:
            while True:
                try:
                    if attempt():
                        assert self._consumer is not None
                        self._consumer.ack(record)
                    return
                except RetryableError as exc:  # bus or store down: try again, keep the record unacked
                    log.warning("trigger %s: %s; retrying", self.trigger.name, exc)
                    if self.stop_event.wait(1.0):
                        return
                attempt = partial(self.handle, record, held, None, later=True)
        except Exception:
            log.exception("trigger %s: handling %s/%s failed", self.trigger.name, record.partition, record.offset)

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
               claimed: Claimed | None = None, *, later: bool = False) -> bool:
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
        source, ident = _key(event)
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
        except BaseException:
            self.idem.release(source, ident)
            raise
        return self._settle(record, event, (source, ident), outcome, later)

    def _settle(self, record: Record, event: CloudEvent, key: tuple[str, str], outcome: Outcome, later: bool) -> bool:
        """After a delivery: publish its replies or dead-letter it, then complete it (``later``: by the store's
        writer, which acknowledges the record; False is returned). Without replies or a dead letter, no I/O."""
        try:
            if outcome.aborted:
                self.idem.release(*key)
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
            self.idem.release(*key)
            raise
        self._unrecorded.add(key)  # until the store has it, a retry must not deliver again
        if later:
            self._complete_later(record, key)
            return False
        self.idem.complete(*key)
        self._unrecorded.discard(key)
        return True

    def _dead_letter(self, record: Record, code: int | None, error: str, attempts: int) -> None:
        letter = dead_letter(record.wire, self.trigger.name, self.url, code, error, attempts)
        self.bus.append(self.trigger.dead_letter_topic, [letter])
        self.stats.add(dead_lettered=1)

    def stop(self) -> None:
        self.stop_event.set()


def _put_all(incoming: asyncio.Queue[tuple[Record, Claimed | None] | None], batch: list[tuple[Record, Claimed | None]]
             ) -> None:
    for item in batch:
        incoming.put_nowait(item)


def _key(event: CloudEvent) -> tuple[str, str]:
    """An event's idempotency key (a replay's, ``handle`` suffixes itself)."""
    return str(event["source"]), str(event["id"])
