"""The Kafka bus: librdkafka's idempotent ``acks=all`` producer and its group consumers, with manual commits.

Records are produced by librdkafka (confluent-kafka): it batches and sends on its own threads, off
the interpreter lock, and its delivery reports resolve each append's future, so a publisher on an
event loop (the gateway) waits for durability without a thread of its own (``append_async``). Keys are
placed by murmur2, the partitioner of Kafka's Java client and of kafka-python, so a key stays on the
partition it always had. Group members are librdkafka's consumers too; admin calls and offset queries
(``end_offsets``, ``committed``, ``seed_group``) are kafka-python's.

Topics are created on first use with the bus's partition count. Consumers never auto-commit:
an :class:`~events.bus.offsets.AckTracker` decides the contiguous acknowledged prefix, which
is committed every ``commit_interval`` seconds, when partitions are revoked and on close.
A group that has no committed offset commits its starting position as soon as it gets a
partition, so a consumer recreated under the same group resumes instead of skipping ahead.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from functools import partial
from typing import Any, TypeVar

import confluent_kafka
from kafka import KafkaAdminClient, KafkaConsumer
from kafka import TopicPartition as KTP
from kafka.admin import NewTopic
from kafka.errors import KafkaError, TopicAlreadyExistsError
from kafka.structs import OffsetAndMetadata

from cascade.core.errors import BusUnavailable, CascadeError
from cascade.events.bindings.kafka import WireRecord
from cascade.events.bus.base import BusBase, Position, Record, Start, TopicPartition
from cascade.events.bus.offsets import AckTracker

log = logging.getLogger("cascade.bus.kafka")

T = TypeVar("T")


class KafkaBus(BusBase):
    """An EventBus on Apache Kafka."""

    def __init__(
        self,
        bootstrap: str = "127.0.0.1:9092",
        *,
        partitions: int = 4,
        commit_interval: float = 0.5,
        session_timeout: float = 10.0,
        request_timeout: float = 10.0,
        linger_ms: int = 1,  # a publish waits up to 1 ms to share a request: half the CPU per record under load
    ) -> None:
        self.bootstrap = bootstrap
        self.partitions = partitions
        self.commit_interval = commit_interval
        self.session_timeout = session_timeout
        self.request_timeout = request_timeout
        self.linger_ms = linger_ms
        self._lock = threading.Lock()
        self._admin_lock = threading.Lock()
        self._producer: _Producer | None = None
        self._admin: Any = None
        self._topics: set[str] = set()
        self._replicas: int | None = None
        self._inspectors: dict[str | None, Any] = {}  # group -> idle consumer kept for offset queries
        self._in_use: dict[str | None, threading.Lock] = {}  # group -> held while its consumer answers a query
        self._inspect_lock = threading.Lock()  # guards the two dicts and _closed, never held across a request
        self._closed = False

    @property
    def timeout_ms(self) -> int:
        """Bound of every blocking consumer call (offsets, commits): none may hang a trigger."""
        return int(self.request_timeout * 1000)

    def _guard(self, what: str, call: Callable[[], T]) -> T:
        """Run a client call; whatever it raises leaves as the error tree (BusUnavailable)."""
        try:
            return call()
        except CascadeError:
            raise
        except Exception as exc:  # kafka-python raises KafkaError, but also OSError, ValueError, AssertionError
            raise BusUnavailable(f"kafka {self.bootstrap}: {what} failed: {exc!r}") from exc

    def _producer_client(self) -> _Producer:
        """The producer (made without a round trip: librdkafka connects in the background)."""
        with self._lock:
            if self._producer is None:
                ms = int(self.request_timeout * 1000)
                self._producer = self._guard("connect", lambda: _Producer(self.bootstrap, ms, self.linger_ms))
            return self._producer

    def _admin_client(self) -> Any:
        ms = int(self.request_timeout * 1000)
        with self._lock:
            if self._admin is None:
                self._admin = self._guard("connect", lambda: KafkaAdminClient(
                    bootstrap_servers=self.bootstrap, request_timeout_ms=ms, bootstrap_timeout_ms=ms,
                    client_id="cascade-admin"))
            return self._admin

    def ensure_topic(self, topic: str, partitions: int | None = None) -> None:
        if topic in self._topics:
            return
        admin = self._admin_client()
        with self._admin_lock:  # the admin client allows one request in flight
            try:
                replicas, configs = self._replication(admin)
                for attempt in range(5):
                    try:
                        admin.create_topics([NewTopic(topic, partitions or self.partitions, replicas,
                                                      topic_configs=configs)])
                        break
                    except TopicAlreadyExistsError:
                        break
                    except KafkaError as exc:
                        if attempt == 4 or not getattr(exc, "retriable", False):
                            raise BusUnavailable(f"kafka {self.bootstrap}: create topic {topic}: {exc!r}") from exc
                        time.sleep(0.1 * 2**attempt)
            except BusUnavailable:
                self._discard("_admin", admin)
                raise
            except Exception as exc:
                self._discard("_admin", admin)
                raise BusUnavailable(f"kafka {self.bootstrap}: create topic {topic}: {exc!r}") from exc
        self._topics.add(topic)

    def _replication(self, admin: Any) -> tuple[int, dict[str, str]]:
        """Replication factor 3 with min.insync.replicas 2 on a cluster of three or more brokers, else 1."""
        if self._replicas is None:
            brokers = len(self._guard("describe cluster", admin.describe_cluster).get("brokers") or [])
            self._replicas = 3 if brokers >= 3 else 1
        return self._replicas, ({"min.insync.replicas": "2"} if self._replicas == 3 else {})

    def _discard(self, which: str, client: Any) -> None:
        """Throw a failed client away (the next call builds a new one); closing it must not block.

        An idempotent producer can be left in a fatal state (librdkafka says so: its producer id
        fenced or its sequence broken), and after a broker restart kafka-python's admin client can
        point at dead connections; a new client reconnects within the request timeout.
        """
        with self._lock:
            if getattr(self, which) is not client or client is None:
                return
            setattr(self, which, None)

        def close() -> None:
            try:
                client.close(timeout=0) if which == "_producer" else client.close()
            except Exception as exc:  # it failed already; nothing it says now matters
                log.debug("closing a failed kafka client: %r", exc)

        threading.Thread(target=close, name="kafka-close", daemon=True).start()

    def append(self, topic: str, records: Sequence[WireRecord]) -> list[Position]:
        done: Future[list[Position]] = Future()
        self._produce(topic, records, lambda result: _settle(done, result))
        return self._guard(f"publish to {topic}", lambda: done.result(timeout=self.request_timeout * 2 + 2))

    async def append_async(self, topic: str, records: Sequence[WireRecord]) -> list[Position]:
        """``append`` for a caller on an event loop: produced at once, awaited without a thread (librdkafka batches
        what concurrent callers produce, so no group commit is needed in front of it)."""
        if topic not in self._topics:  # creating it is a blocking admin round trip, once per topic
            await asyncio.to_thread(self.ensure_topic, topic)
        loop = asyncio.get_running_loop()
        done: asyncio.Future[list[Position]] = loop.create_future()

        def settle(result: list[Position] | BaseException) -> None:
            try:
                loop.call_soon_threadsafe(_settle, done, result)
            except RuntimeError:  # the loop is closed: nobody waits for this publish any more
                pass

        self._produce(topic, records, settle)
        late = BusUnavailable(f"kafka {self.bootstrap}: publish to {topic}: no delivery report in time")
        timer = loop.call_later(self.request_timeout * 2 + 2, _settle, done, late)  # as append's wait, if none comes
        try:
            return await done
        finally:
            timer.cancel()

    def _produce(self, topic: str, records: Sequence[WireRecord],
                 settle: Callable[[list[Position] | BaseException], object]) -> None:
        """Hand ``records`` to the producer; ``settle`` gets their positions once all are durable, or the error (on
        the delivery thread). A producer that failed for good is replaced for the next call."""
        self.ensure_topic(topic)
        producer = self._producer_client()

        def settled(result: list[Position] | BaseException) -> None:
            if isinstance(result, BaseException) and producer.broken:
                self._discard("_producer", producer)
            settle(result)

        try:
            producer.produce(topic, records, settled)
        except BusUnavailable:
            self._discard("_producer", producer)
            raise

    def subscribe(self, topics: Sequence[str], group: str, *, start: Start = "latest") -> KafkaGroupConsumer:
        for topic in topics:
            self.ensure_topic(topic)
        return KafkaGroupConsumer(self, list(topics), group, start)

    def _inspector(self, group: str | None) -> Any:
        return self._guard("connect", lambda: KafkaConsumer(
            bootstrap_servers=self.bootstrap, group_id=group, enable_auto_commit=False,
            request_timeout_ms=int(self.request_timeout * 1000) + 1000,
            bootstrap_timeout_ms=int(self.request_timeout * 1000)))

    @contextmanager
    def _inspecting(self, group: str | None) -> Iterator[Any]:
        """A consumer for offset queries, kept per group and used by one caller at a time. A new one fetches the
        whole cluster's metadata, which with thousands of topics costs a dispatcher a fifth of its CPU when its
        lag is read every few seconds; one that failed is closed and made again next time. A query waiting on a
        dead broker holds only its group's lock, so ``close`` never waits for it; after ``close`` each consumer
        is closed when its query ends."""
        with self._inspect_lock:
            in_use = self._in_use.setdefault(group, threading.Lock())
        with in_use:
            with self._inspect_lock:
                consumer = self._inspectors.pop(group, None)
            consumer = consumer or self._inspector(group)
            try:
                yield consumer
            except BaseException:
                _close_quietly(consumer)
                raise
            with self._inspect_lock:
                keep = not self._closed
                if keep:
                    self._inspectors[group] = consumer
            if not keep:
                _close_quietly(consumer)

    def end_offsets(self, topic: str) -> dict[int, int]:
        self.ensure_topic(topic)
        with self._inspecting(None) as consumer:
            parts = [KTP(topic, p) for p in sorted(self._guard("metadata", partial(consumer.partitions_for_topic, topic))
                                                   or ())]
            ends = self._guard("end offsets", lambda: consumer.end_offsets(parts, timeout_ms=self.timeout_ms))
            return {tp.partition: int(off) for tp, off in ends.items()}

    def committed(self, topic: str, group: str) -> dict[int, int]:
        with self._inspecting(group) as consumer:
            result: dict[int, int] = {}
            for p in sorted(self._guard("metadata", partial(consumer.partitions_for_topic, topic)) or ()):
                off = self._guard("committed", lambda: consumer.committed(KTP(topic, p), timeout_ms=self.timeout_ms))
                if off is not None:
                    result[p] = int(off)
            return result

    def seed_group(self, topic: str, group: str) -> None:
        """Commit the end of each partition the group has no offset for; checked by reading it back.

        Right after a broker (re)start the group coordinator may still be loading and refuse or
        drop the commit, so it is tried until it reads back or the request timeout passes.
        """
        self.ensure_topic(topic)
        deadline = time.monotonic() + max(self.request_timeout, 10.0)
        consumer = self._inspector(group)
        try:
            parts = [KTP(topic, p) for p in sorted(self._guard("metadata", partial(consumer.partitions_for_topic, topic))
                                                   or ())]
            while True:
                missing = [tp for tp in parts if self._guard(
                    "committed", partial(consumer.committed, tp, timeout_ms=self.timeout_ms)) is None]
                if not missing:
                    return
                if time.monotonic() > deadline:
                    raise BusUnavailable(f"kafka {self.bootstrap}: could not seed group {group} on {topic}")
                ends = self._guard("end offsets", partial(consumer.end_offsets, missing, timeout_ms=self.timeout_ms))
                try:
                    consumer.commit({tp: OffsetAndMetadata(int(ends[tp]), "", -1) for tp in missing},
                                    timeout_ms=self.timeout_ms)
                except KafkaError as exc:  # coordinator loading or moving, or live members: read back and see
                    log.info("kafka group %s: seeding %s: %r; checking again", group, topic, exc)
                    time.sleep(0.2)
        finally:
            _close_quietly(consumer)

    def ping(self, timeout: float = 2.0) -> None:
        admin = self._admin_client()
        with self._admin_lock:
            try:
                self._guard("ping", admin.describe_cluster)
            except BusUnavailable:
                self._discard("_admin", admin)
                raise

    def close(self) -> None:
        """Close the clients; a dead broker makes this give up after a few seconds, never hang or raise."""
        with self._inspect_lock:
            inspectors, self._inspectors, self._closed = list(self._inspectors.values()), {}, True
        for consumer in inspectors:
            _close_quietly(consumer)
        with self._lock:
            producer, admin, self._producer, self._admin = self._producer, self._admin, None, None
        closes = ([partial(producer.close, timeout=5)] if producer is not None else []) + \
            ([admin.close] if admin is not None else [])
        for close in closes:
            try:
                close()
            except Exception as exc:
                log.warning("kafka %s: closing a client failed: %r", self.bootstrap, exc)


class _Producer:
    """librdkafka's producer and the thread that serves its delivery reports (each one settles a ``produce``)."""

    def __init__(self, bootstrap: str, timeout_ms: int, linger_ms: int) -> None:
        self.bootstrap = bootstrap
        self.client = confluent_kafka.Producer({
            "bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True, "linger.ms": linger_ms,
            "message.timeout.ms": timeout_ms + linger_ms + 1000, "socket.timeout.ms": timeout_ms,
            "partitioner": "murmur2_random", "client.id": "cascade-producer",
            "logger": logging.getLogger("cascade.bus.kafka.librdkafka")})  # its lines, through logging (not stderr)
        self.broken = False  # a fatal error: this producer can send no more (KafkaBus makes a new one)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="kafka-delivery", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            self._poll(0.1)

    def _poll(self, timeout: float) -> None:
        try:
            self.client.poll(timeout)
        except Exception:  # a report's callback failed: the other publishes' reports must still be served
            log.exception("kafka %s: settling a publish failed", self.bootstrap)

    def produce(self, topic: str, records: Sequence[WireRecord],
                settle: Callable[[list[Position] | BaseException], object]) -> None:
        """Queue ``records``; ``settle`` is called once, on the delivery thread, with their positions or the error."""
        batch = _Batch(topic, len(records), settle, self)
        if not records:
            settle([])
        for i, r in enumerate(records):
            try:
                self.client.produce(topic, r.value, r.key, headers=list(r.headers), on_delivery=partial(batch.delivered, i))
            except (BufferError, confluent_kafka.KafkaException) as exc:  # its queue is full, or it is closed
                raise BusUnavailable(f"kafka {self.bootstrap}: publish to {topic}: {exc!r}") from exc

    def close(self, timeout: float = 0) -> None:
        """Send what is queued for up to ``timeout`` seconds; what is left fails its ``produce`` at once."""
        self._stop.set()
        self._thread.join(1.0)  # reports are served by this thread from now on, one at a time as before
        if timeout:
            self.client.flush(timeout)
        self.client.purge()
        self._poll(0)


class _Batch:
    """One ``produce`` call's records as their delivery reports come in (on the delivery thread, one at a time)."""

    __slots__ = ("topic", "positions", "left", "settle", "producer")

    def __init__(self, topic: str, count: int, settle: Callable[[list[Position] | BaseException], object],
                 producer: _Producer) -> None:
        self.topic, self.left, self.settle, self.producer = topic, count, settle, producer
        self.positions: list[Position | None] = [None] * count

    def delivered(self, i: int, err: Any, msg: Any) -> None:
        if self.left <= 0:
            return  # settled already (an earlier record failed)
        if err is not None:
            self.left = 0
            self.producer.broken = self.producer.broken or bool(err.fatal())
            self.settle(BusUnavailable(f"kafka {self.producer.bootstrap}: publish to {self.topic}: {err.str()}"))
            return
        self.positions[i] = Position(msg.topic(), msg.partition(), msg.offset())
        self.left -= 1
        if not self.left:
            self.settle([p for p in self.positions if p is not None])


def _settle(future: Future[list[Position]] | asyncio.Future[list[Position]],
            result: list[Position] | BaseException) -> None:
    if future.done():
        return  # its caller stopped waiting (cancelled)
    if isinstance(result, BaseException):
        future.set_exception(result)
    else:
        future.set_result(result)


def _close_quietly(consumer: Any) -> None:
    """Close an inspecting consumer; with the broker away that must neither hang nor raise."""
    try:
        consumer.close(autocommit=False, timeout_ms=2000)
    except Exception as exc:
        log.debug("closing an inspecting kafka consumer: %r", exc)


def _offsets(positions: dict[TopicPartition, int]) -> list[confluent_kafka.TopicPartition]:
    return [confluent_kafka.TopicPartition(t, p, off) for (t, p), off in positions.items()]


class KafkaGroupConsumer:
    """A consumer-group member on Kafka with contiguous-prefix commits, on librdkafka's consumer.

    librdkafka fetches, decompresses and parses records on its own threads, off the interpreter lock (about 3 us of
    CPU per record against kafka-python's 16 us in Python), and keeps the group membership alive on them. Rebalance
    callbacks run inside ``poll`` on the polling thread, so they may call the consumer: a revoke commits what is
    acknowledged before the partitions go; an assignment resumes a partition that came straight back after the last
    record handed out, and starts one the group has no offset for at ``start`` (that position is committed at once).
    Periodic commits are sent without waiting (their results come back through a later ``poll``); commits on revoke,
    on close and through ``commit`` wait.
    """

    def __init__(self, bus: KafkaBus, topics: list[str], group: str, start: Start) -> None:
        self.bus, self.group, self.topics, self.start = bus, group, topics, start
        self._tracker = AckTracker()
        self._closing = False
        self._start: dict[TopicPartition, int] = {}  # start positions not yet committed
        self._unseeded: set[TopicPartition] = set()  # assigned without a known start (the broker did not answer)
        self._revoked: set[TopicPartition] = set()  # revoked, not yet known to be gone
        self._owned: frozenset[TopicPartition] = frozenset()  # kept by the callbacks: librdkafka's own assignment()
        # waits for its main thread while holding the interpreter lock, which a callback on the polling thread needs
        self._last_commit = time.monotonic()
        self._consumer = self._connect()

    def _connect(self) -> Any:
        bus, ms = self.bus, int(self.bus.session_timeout * 1000)
        consumer = bus._guard("connect", lambda: confluent_kafka.Consumer({
            "bootstrap.servers": bus.bootstrap, "group.id": self.group, "client.id": f"cascade-{self.group}",
            "enable.auto.commit": False, "enable.auto.offset.store": False, "auto.offset.reset": self.start,
            "session.timeout.ms": ms, "heartbeat.interval.ms": max(ms // 5, 100), "fetch.wait.max.ms": 100,
            "socket.timeout.ms": bus.timeout_ms, "queued.max.messages.kbytes": 8192,  # prefetched, per consumer
            "partition.assignment.strategy": "range",  # each member gets its share of every topic (a trigger reads
            # its topic and its retry topic: a balance over all partitions could give one member all of the first)
            "on_commit": self._committed, "logger": logging.getLogger("cascade.bus.kafka.librdkafka")}))
        consumer.subscribe(self.topics, on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost)
        return consumer

    # -- rebalances (inside poll, on the polling thread) -----------------------------------
    def _on_revoke(self, consumer: Any, revoked: list[Any]) -> None:
        tps = [(tp.topic, tp.partition) for tp in revoked]
        if not self._closing:
            try:
                self._commit_now(self._tracker.committable(tps))
            except BusUnavailable as exc:  # not committed: the next owner starts before them (at least once)
                log.warning("kafka group %s: commit on revoke failed: %s", self.group, exc)
        # Forget them only once we know they went elsewhere: one that comes straight back resumes where this member
        # stopped, and its records still in flight keep holding the commit.
        self._revoked.update(tps)
        self._owned = self._owned.difference(tps)

    def _on_lost(self, consumer: Any, lost: list[Any]) -> None:
        self._forget([(tp.topic, tp.partition) for tp in lost])

    def _forget(self, tps: Iterable[TopicPartition]) -> None:
        """The partitions went to another member: acknowledgements of their records still in flight no longer count
        (the new owner reads from the last commit)."""
        tps = list(tps)
        self._owned = self._owned.difference(tps)
        self._revoked.difference_update(tps)
        self._tracker.forget(tps)
        for tp in tps:
            self._start.pop(tp, None)
            self._unseeded.discard(tp)

    def _on_assign(self, consumer: Any, assigned: list[Any]) -> None:
        back = {(tp.topic, tp.partition) for tp in assigned}
        self._forget(self._revoked - back)
        self._revoked.clear()
        self._owned = frozenset(back)
        for tp in assigned:  # back after a revoke: on from the last record handed out, not from the last commit
            tp.offset = self._tracker.resume_at((tp.topic, tp.partition))
        fresh = {(tp.topic, tp.partition): tp for tp in assigned if tp.offset < 0}
        timeout = self.bus.request_timeout
        try:
            for tp in consumer.committed(list(fresh.values()), timeout=timeout) if fresh else []:
                offset = tp.offset
                if offset < 0:  # the group has no offset here: start at ``start`` and commit it at once
                    low, high = consumer.get_watermark_offsets(tp, timeout=timeout, cached=False)
                    offset = self._start[(tp.topic, tp.partition)] = low if self.start == "earliest" else high
                fresh[(tp.topic, tp.partition)].offset = offset
        except confluent_kafka.KafkaException as exc:  # where the group stands is unknown: the reset policy decides
            log.warning("kafka group %s: reading the starting offsets failed (%s); starting at %s", self.group, exc,
                        self.start)
            for tp in fresh.values():
                tp.offset = confluent_kafka.OFFSET_INVALID  # the committed offset, or the reset policy's
            self._unseeded |= fresh.keys()
        consumer.assign(assigned)

    def _committed(self, error: Any, partitions: list[Any]) -> None:
        """A commit sent without waiting has its answer (served inside ``poll``)."""
        if error is not None:
            log.info("kafka group %s: commit failed: %s; the next commit carries it", self.group, error)
            return
        self._tracker.mark_committed({(tp.topic, tp.partition): tp.offset for tp in partitions if tp.error is None})

    # -- commits ---------------------------------------------------------------------------
    def _commit_now(self, positions: dict[TopicPartition, int]) -> None:
        """Commit ``positions`` and wait for the answer."""
        if positions:
            self.bus._guard("commit", lambda: self._consumer.commit(offsets=_offsets(positions), asynchronous=False))
            self._tracker.mark_committed(positions)

    def _commit_start(self, records: list[Record]) -> None:
        """Commit where a partition without a committed offset started, so a restart resumes there. A partition that
        started without an answer from the broker has it once its first record comes (the record's offset)."""
        for record in records:
            if record.tp in self._unseeded:
                self._start[record.tp] = record.offset
                self._unseeded.discard(record.tp)
        try:
            self._commit_now(dict(self._start))
            self._start.clear()
        except BusUnavailable as exc:  # a rebalance or the broker in the way: tried again on the next poll
            log.info("kafka group %s: committing the start positions failed: %s", self.group, exc)

    def poll(self, timeout: float = 1.0, max_records: int = 500) -> list[Record]:
        if time.monotonic() - self._last_commit >= self.bus.commit_interval:
            self._commit_later()
        consumer = self._consumer
        # consume() waits its whole timeout unless max_records come; poll() returns with the first record.
        first = self.bus._guard("poll", lambda: consumer.poll(timeout))
        messages = [first] if first is not None else []
        if first is not None and max_records > 1:
            messages += self.bus._guard("poll", lambda: consumer.consume(max_records - 1, 0))
        out: list[Record] = []
        for m in messages:
            error = m.error()
            if error is not None:
                if error.fatal():
                    raise BusUnavailable(f"kafka {self.bus.bootstrap}: group {self.group}: {error.str()}")
                log.info("kafka group %s: %s", self.group, error.str())  # librdkafka retries by itself
                continue
            tp = (m.topic(), m.partition())
            offset = m.offset()
            out.append(Record(tp[0], tp[1], offset, m.key(), tuple(m.headers() or ()), m.value() or b"",
                              m.timestamp()[1] / 1000.0))
            self._tracker.delivered(tp, offset)
        if self._start or self._unseeded:  # rare: after an assignment, or one the broker did not answer
            self._commit_start(out)
        return out

    def ack(self, record: Record) -> None:
        self._tracker.ack(record.tp, record.offset)

    def _commit_later(self) -> None:
        """Send what is committable without waiting: the answer comes through a later ``poll`` (``poll`` commits every
        ``commit_interval`` this way, so a poll never waits for a commit)."""
        positions = self._tracker.committable(self.assignment())
        if positions:
            self.bus._guard("commit", lambda: self._consumer.commit(offsets=_offsets(positions), asynchronous=True))
        self._last_commit = time.monotonic()

    def commit(self) -> None:
        """Commit what is committable and wait for the broker's answer."""
        self._commit_now(self._tracker.committable(self.assignment()))
        self._last_commit = time.monotonic()

    def assignment(self) -> set[TopicPartition]:
        return set(self._owned)

    def close(self) -> None:
        """Commit what is acknowledged, then leave the group; with the broker away, give up within seconds (the
        uncommitted records come back to the next member: at least once) and never raise."""
        consumer = self._consumer
        try:
            positions = self._tracker.committable(self.assignment())
            positions.update(self._start)
            _bounded(partial(self._commit_now, positions), min(self.bus.request_timeout, 3.0), "final commit")
        except BusUnavailable as exc:
            log.warning("kafka group %s: final commit failed: %s", self.group, exc)
        self._closing = True  # tried once: leaving the group must not wait to commit again
        self._forget(list(self._owned))
        try:
            _bounded(consumer.close, 3.0, "leave the group")
        except BusUnavailable as exc:
            log.warning("kafka group %s: closing the consumer: %s", self.group, exc)


def _bounded(call: Callable[[], object], timeout: float, what: str) -> None:
    """Run ``call`` on a thread of its own and wait at most ``timeout`` seconds for it (librdkafka's blocking calls
    have no deadline of their own and may wait for a broker that is away); what it raises is raised here."""
    done: Future[object] = Future()

    def run() -> None:
        try:
            done.set_result(call())
        except BaseException as exc:
            done.set_exception(exc)

    threading.Thread(target=run, name=f"kafka-{what}", daemon=True).start()
    try:
        done.result(timeout)
    except TimeoutError as exc:
        raise BusUnavailable(f"kafka: {what}: no answer within {timeout:.0f}s") from exc
