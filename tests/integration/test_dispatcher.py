"""The dispatcher on the real Kafka broker and Redis: filters, retries, dead letters, replies, ordering."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from cloudevents.http import CloudEvent

from cascade.core.errors import StoreUnavailable
from cascade.events.bindings import http as ce_http
from cascade.events.bindings.kafka import WireRecord
from cascade.events.bus import EventBus
from cascade.events.dispatcher import Dispatcher
from cascade.events.dispatcher.deadletters import list_letters, replay
from cascade.events.dispatcher.service import trigger_lag
from cascade.events.envelope import new_event
from cascade.events.triggers import Trigger
from cascade.stores import StateStore
from cascade.stores.idempotency import Idempotency
from cascade.stores.redis import RedisStore
from tests.conftest import REDIS, drain, make_bus, make_store
from tests.helpers.subscriber import Answer, Delivery, Subscriber


def eventually(check: Callable[[], bool], timeout: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture
def bus(tmp_path: Path) -> Iterator[EventBus]:
    b = make_bus("kafka", tmp_path)
    yield b
    b.close()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[StateStore]:
    s = make_store("redis", tmp_path)
    yield s
    s.close()


@pytest.fixture
def sub() -> Iterator[Subscriber]:
    s = Subscriber()
    yield s
    s.close()


@contextmanager
def running(bus: EventBus, store: StateStore, topic: str, *triggers: Trigger, port: int | None = None) -> Iterator[Dispatcher]:
    dispatcher = Dispatcher(bus, store, list(triggers), topic=topic, resolve=lambda name: f"http://unused/{name}",
                            stats_interval=0.5)
    dispatcher.start(metrics_port=port)
    try:
        yield dispatcher
    finally:
        dispatcher.stop()


def trigger(name: str, url: str, **spec: Any) -> Trigger:
    return Trigger.model_validate({"name": name, "subscriber": url, "start": "earliest", **spec})


def job(i: int, key: str = "k", **ext: str) -> CloudEvent:
    return new_event("job.cancelled", {"jobId": f"job-{i}", "reason": str(i)}, source="/tests", partitionkey=key,
                     subject=f"job-{i}", extensions=ext)


@pytest.mark.slow
def test_filters_each_dialect_and_data_expressions(bus: EventBus, store: StateStore, sub: Subscriber, topic: str) -> None:
    specs = {
        "exact": [{"exact": {"type": "io.cascade.dataset.uploaded.v1"}}],
        "prefix": [{"prefix": {"subject": "train/"}}],
        "suffix": [{"suffix": {"subject": ".jpg"}}],
        "all": [{"all": [{"exact": {"type": "io.cascade.dataset.uploaded.v1"}}, {"prefix": {"subject": "train/"}}]}],
        "any": [{"any": [{"suffix": {"subject": ".csv"}}, {"exact": {"type": "io.cascade.job.cancelled.v1"}}]}],
        "not": [{"not": {"exact": {"type": "io.cascade.dataset.uploaded.v1"}}}],
        "data": [{"data": "data.size > 100 and data.origin in ['minio', 'aws-s3']"}],
        "legacy": None,
    }
    triggers = [trigger(f"{topic}-{n}", sub.url(f"/{n}"), filters=f) for n, f in specs.items() if f is not None]
    triggers.append(trigger(f"{topic}-legacy", sub.url("/legacy"), filter={"attributes": {"subject": "train/b.csv"}}))

    def up(key: str, size: int, origin: str) -> CloudEvent:
        return new_event("dataset.uploaded", {"dataset": "d", "uri": f"s3://d/{key}", "size": size, "origin": origin},
                         source="/tests", subject=key, partitionkey="d")

    events = {"a": up("train/a.jpg", 500, "minio"), "b": up("train/b.csv", 50, "aws-s3"),
              "c": up("test/c.jpg", 500, "folder"), "d": job(1)}
    bus.publish_many(topic, list(events.values()))
    with running(bus, store, topic, *triggers) as dispatcher:
        # eight consumer groups join at once: give a loaded machine time
        eventually(lambda: all(s["delivered"] + s["filtered"] == 4 for s in dispatcher.stats().values()), timeout=120,
                   what="all seen")
    got = {n: sorted(k for k, e in events.items() for d in sub.at(f"/{n}") if d.id == e["id"]) for n in specs}
    assert got == {"exact": ["a", "b", "c"], "prefix": ["a", "b"], "suffix": ["a", "c"], "all": ["a", "b"],
                   "any": ["b", "d"], "not": ["d"], "data": ["a"], "legacy": ["b"]}
    delivered = sub.at("/exact")[0]
    assert delivered.headers["ce-type"] == "io.cascade.dataset.uploaded.v1" and delivered.data["size"] in (500, 50)


def fail_first(n: int, status: int = 503) -> Callable[[Delivery, int], Answer]:
    return lambda d, i: (status, {}, b"not yet") if i < n else (200, {}, b"")


@pytest.mark.parametrize("policy, expected", [("linear", [0.1, 0.2, 0.3]), ("exponential", [0.1, 0.2, 0.4])])
def test_retry_count_and_backoff_spacing(bus: EventBus, store: StateStore, sub: Subscriber, topic: str,
                                         policy: str, expected: list[float]) -> None:
    sub.behaviours["/flaky"] = fail_first(3)
    t = trigger(f"{topic}-r", sub.url("/flaky"), delivery={"retry": 5, "backoffPolicy": policy, "backoffDelay": "PT0.1S"})
    bus.publish(topic, job(1))
    with running(bus, store, topic, t) as dispatcher:
        eventually(lambda: dispatcher.stats()[t.name]["delivered"] == 1)
        assert dispatcher.stats()[t.name]["retried"] == 3
    attempts = sub.at("/flaky")
    assert len(attempts) == 4
    gaps = [b.start - a.end for a, b in zip(attempts, attempts[1:])]
    for gap, want in zip(gaps, expected):
        assert want - 0.01 <= gap <= want + 0.5, (gaps, expected)  # never early; late only by scheduling noise


def test_timeouts_and_dead_letters_carry_error_extensions(bus: EventBus, store: StateStore, sub: Subscriber,
                                                          topic: str) -> None:
    sub.behaviours["/slow"] = lambda d, i: (time.sleep(1.0), (200, {}, b""))[1]
    sub.behaviours["/broken"] = lambda d, i: (400, {}, b"bad request: " + b"x" * 5000)
    slow = trigger(f"{topic}-slow", sub.url("/slow"), delivery={"retry": 1, "timeout": "PT0.2S", "backoffDelay": "PT0.05S"})
    broken = trigger(f"{topic}-broken", sub.url("/broken"), delivery={"retry": 3})
    event = job(7)
    bus.publish(topic, event)
    with running(bus, store, topic, slow, broken) as dispatcher:
        eventually(lambda: all(s["dead_lettered"] == 1 for s in dispatcher.stats().values()))
    assert len(sub.at("/slow")) == 2 and len(sub.at("/broken")) == 1, "400 is not retried"
    [late] = list_letters(bus, slow)
    [bad] = list_letters(bus, broken)
    assert late.record.event()["id"] == event["id"] and late.record.event().get_data() == event.get_data()
    assert late.header("ce_knativeerrordata").startswith("timed out") and late.header("ce_cascadeattempts") == "2"
    assert bad.header("ce_knativeerrorcode") == "400" and bad.header("ce_knativeerrordest") == sub.url("/broken")
    assert bad.header("ce_knativeerrordata").startswith("bad request") and len(bad.header("ce_knativeerrordata")) == 1024
    assert bad.record.key == b"k"


def test_replies_are_published_back_to_the_bus(bus: EventBus, store: StateStore, sub: Subscriber, topic: str) -> None:
    def reply(d: Delivery, i: int) -> Answer:
        answer = new_event("job.failed", {"jobId": d.data["jobId"], "reason": "replied"}, source="/subscriber")
        headers, body = ce_http.to_binary(answer)
        return 200, headers, body

    sub.behaviours["/reply"] = reply
    t = trigger(f"{topic}-reply", sub.url("/reply"), filters=[{"exact": {"type": "io.cascade.job.cancelled.v1"}}])
    bus.publish(topic, job(3, traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"))
    with running(bus, store, topic, t) as dispatcher:
        eventually(lambda: dispatcher.stats()[t.name]["delivered"] == 1)
    consumer = bus.subscribe([topic], "check", start="earliest")
    events = [r.event() for r in drain(consumer, 2)]
    consumer.close()
    [answer] = [e for e in events if e["type"] == "io.cascade.job.failed.v1"]
    assert answer.get_data() == {"jobId": "job-3", "reason": "replied"}
    assert answer["traceparent"] == "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_ordered_delivery_is_sequential_per_partition(bus: EventBus, store: StateStore, sub: Subscriber, topic: str) -> None:
    sub.delay = 0.01
    ordered = trigger(f"{topic}-ordered", sub.url("/ordered"), ordering="ordered")
    unordered = trigger(f"{topic}-unordered", sub.url("/unordered"), concurrency=8)
    bus.ensure_topic(topic, 1)
    bus.publish_many(topic, [job(i) for i in range(60)])
    with running(bus, store, topic, ordered, unordered) as dispatcher:
        eventually(lambda: all(s["delivered"] == 60 for s in dispatcher.stats().values()))
    assert [d.data["jobId"] for d in sub.at("/ordered")] == [f"job-{i}" for i in range(60)]
    assert sub.max_active["/ordered"] == 1
    assert 1 < sub.max_active["/unordered"] <= 8


def test_recreated_trigger_resumes_and_new_trigger_starts_at_its_position(
        bus: EventBus, store: StateStore, sub: Subscriber, topic: str) -> None:
    t = trigger(f"{topic}-t", sub.url("/t"))
    bus.publish_many(topic, [job(i) for i in range(5)])
    with running(bus, store, topic, t) as dispatcher:
        eventually(lambda: dispatcher.stats()[t.name]["delivered"] == 5)
    bus.publish_many(topic, [job(i) for i in range(5, 8)])  # while the trigger is gone
    latest = Trigger.model_validate({"name": f"{topic}-latest", "subscriber": sub.url("/latest"), "start": "latest"})
    with running(bus, store, topic, t, latest) as dispatcher:
        eventually(lambda: dispatcher.stats()[t.name]["delivered"] == 3)
        eventually(lambda: dispatcher.workers[latest.name]._consumer is not None
                   and bool(dispatcher.workers[latest.name]._consumer.assignment()), what="latest assigned")
        eventually(lambda: set(bus.committed(topic, latest.group(topic))) == set(bus.end_offsets(topic)),
                   what="the new trigger's start positions committed")
        bus.publish(topic, job(8))
        eventually(lambda: len(sub.at("/latest")) == 1)
        eventually(lambda: dispatcher.stats()[t.name]["delivered"] == 4)
    assert sorted(d.data["jobId"] for d in sub.at("/t")) == [f"job-{i}" for i in range(9)], "each once, none lost"
    assert [d.data["jobId"] for d in sub.at("/latest")] == ["job-8"]


def test_bad_records_are_dead_lettered_without_blocking_the_partition(
        bus: EventBus, store: StateStore, sub: Subscriber, topic: str) -> None:
    bus.ensure_topic(topic, 1)
    good = job(1)
    invalid = to_invalid(job(2))
    bus.append(topic, [WireRecord(b"k", (), b"garbage"), invalid])
    bus.publish(topic, good)
    t = trigger(f"{topic}-bad", sub.url("/bad"), ordering="ordered")
    with running(bus, store, topic, t) as dispatcher:
        eventually(lambda: dispatcher.stats()[t.name]["delivered"] == 1)
        assert dispatcher.stats()[t.name]["dead_lettered"] == 2
    assert [d.id for d in sub.at("/bad")] == [good["id"]]
    reasons = sorted(letter.header("ce_knativeerrordata") for letter in list_letters(bus, t))
    assert reasons[0].startswith("InvalidEvent") and reasons[1].startswith("SchemaViolation: /data/jobId")


def to_invalid(event: CloudEvent) -> WireRecord:
    from cascade.events.bindings.kafka import to_wire

    wire = to_wire(event)
    return WireRecord(wire.key, wire.headers, json.dumps({"reason": "no job id"}).encode())


def test_dead_letters_can_be_listed_and_replayed_after_a_fix(bus: EventBus, store: StateStore, sub: Subscriber,
                                                             topic: str) -> None:
    broken = {"on": True}
    sub.behaviours["/fixme"] = lambda d, i: (500, {}, b"down") if broken["on"] else (200, {}, b"")
    t = trigger(f"{topic}-fix", sub.url("/fixme"), delivery={"retry": 1, "backoffDelay": "PT0.01S"})
    bus.publish_many(topic, [job(i) for i in range(3)])
    with running(bus, store, topic, t) as dispatcher:
        eventually(lambda: dispatcher.stats()[t.name]["dead_lettered"] == 3)
        assert len(list_letters(bus, t)) == 3
        broken["on"] = False
        assert replay(bus, t, topic) == 3
        assert replay(bus, t, topic) == 0, "each dead letter is replayed once"
        eventually(lambda: dispatcher.stats()[t.name]["delivered"] == 3)
    ok = [d for d in sub.at("/fixme") if d.headers.get("ce-cascadereplay") == "1"]
    assert sorted(d.data["jobId"] for d in ok) == ["job-0", "job-1", "job-2"]


def test_a_duplicate_event_reaches_the_subscriber_once(bus: EventBus, store: StateStore, sub: Subscriber,
                                                       topic: str) -> None:
    event = job(1)
    bus.publish(topic, event)
    bus.publish(topic, event)  # e.g. a client retried after a 503
    t = trigger(f"{topic}-dup", sub.url("/dup"))
    with running(bus, store, topic, t) as dispatcher:
        eventually(lambda: dispatcher.stats()[t.name]["delivered"] + dispatcher.stats()[t.name]["duplicates"] == 2)
        assert dispatcher.stats()[t.name]["duplicates"] == 1
    assert len(sub.at("/dup")) == 1


def test_records_still_waiting_at_stop_give_their_claims_back_and_are_delivered_after_a_restart(
        bus: EventBus, store: StateStore, sub: Subscriber, topic: str) -> None:
    t = trigger(f"{topic}-slow", sub.url("/slow"), concurrency=1)
    events = [job(i, key=f"k{i}") for i in range(8)]
    bus.publish_many(topic, events)
    sub.delay = 0.3  # the whole poll is claimed and handed over while the first delivery takes its time
    with running(bus, store, topic, t):
        eventually(lambda: len(sub.at("/slow")) >= 1, what="the first delivery")
    sub.delay = 0.0
    claims = Idempotency(store, f"trigger:{t.group(topic)}")
    delivered = {d.id for d in sub.at("/slow")}
    waiting = [e for e in events if e["id"] not in delivered]
    assert waiting, "records were waiting for the one delivery slot at stop"
    assert [store.get(claims.key(e["source"], e["id"])) for e in waiting] == [None] * len(waiting), \
        "claims given back"
    assert all(store.get(claims.key(e["source"], e["id"])) == b"done" for e in events if e["id"] in delivered)
    with running(bus, store, topic, t):
        eventually(lambda: len(sub.at("/slow")) == len(events), what="the rest delivered")
    assert sorted(d.id for d in sub.at("/slow")) == sorted(e["id"] for e in events), "each once"


def test_metrics_and_saved_stats(bus: EventBus, store: StateStore, sub: Subscriber, topic: str) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t = trigger(f"{topic}-m", sub.url("/m"))
    bus.publish_many(topic, [job(i) for i in range(4)])
    with running(bus, store, topic, t, port=port) as dispatcher:
        eventually(lambda: dispatcher.stats()[t.name]["delivered"] == 4)
        eventually(lambda: (store.get_record("trigger-stats", t.name) or {}).get("lag") == 0, what="lag 0")
        text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    assert f'cascade_trigger_delivered_total{{trigger="{t.name}"}} 4.0' in text
    assert f'cascade_trigger_lag{{trigger="{t.name}"}}' in text
    assert store.get_record("trigger-stats", t.name)["delivered"] == 4  # type: ignore[index]


class RefusesCompletions(RedisStore):
    """Refuses ``put_many``, how completions are written, while ``down`` is set (claims still work)."""

    down = False
    refused = 0

    def put_many(self, items: Any, *, ttl: float | None = None) -> None:
        if self.down:
            self.refused += 1
            raise StoreUnavailable("the store is away")
        super().put_many(items, ttl=ttl)


def test_a_completion_the_store_refused_is_written_when_it_is_back_and_only_then_acknowledged(
        bus: EventBus, sub: Subscriber, topic: str) -> None:
    store = RefusesCompletions(REDIS, namespace=f"test-{topic}")
    store.down = True
    t = trigger(f"{topic}-rw", sub.url("/rw"))
    event = job(1)
    bus.publish(topic, event)
    with running(bus, store, topic, t) as dispatcher:
        eventually(lambda: dispatcher.stats()[t.name]["delivered"] == 1)
        eventually(lambda: store.refused >= 2, what="the refused completion tried again")
        assert trigger_lag(bus, t, topic) == 1, "acknowledged before its completion was written"
        store.down = False
        eventually(lambda: trigger_lag(bus, t, topic) == 0, what="acknowledged once the store took the completion")
        assert dispatcher.stats()[t.name]["in_flight"] == 0
    with running(bus, store, topic, trigger(f"{topic}-rw", sub.url("/rw"))) as again:
        bus.publish(topic, event)  # the same event once more: the written completion makes it a duplicate
        eventually(lambda: again.stats()[t.name]["duplicates"] == 1)
    assert len(sub.at("/rw")) == 1
    store.close()


@pytest.mark.slow
def test_two_dispatchers_share_a_trigger_and_deliver_each_event_once(bus: EventBus, store: StateStore,
                                                                     sub: Subscriber, topic: str) -> None:
    t = trigger(f"{topic}-shared", sub.url("/shared"), concurrency=16)
    with running(bus, store, topic, t) as one, running(bus, store, topic, t) as two:
        def split() -> bool:
            consumers = [d.workers[t.name]._consumer for d in (one, two)]
            owned = [c.assignment() if c is not None else set() for c in consumers]
            return all(owned) and not owned[0] & owned[1]
        sent = 0
        for _ in range(3):  # a member that missed its heartbeats on a loaded machine is rebalanced out: again
            eventually(split, 60, "the trigger's partitions split between the two dispatchers")
            bus.publish_many(topic, [job(i, key=f"k{i}") for i in range(sent, sent + 400)])
            sent += 400
            eventually(lambda: sum(d.stats()[t.name]["delivered"] for d in (one, two)) == sent, 60,  # noqa: B023
                       f"{sent} deliveries")
            counts = [d.stats()[t.name]["delivered"] for d in (one, two)]
            if all(counts):
                break
    ids = [json.loads(d.body)["jobId"] for d in sub.at("/shared")]
    assert sorted(ids) == sorted(f"job-{i}" for i in range(sent)), "each event once"
    assert all(counts), f"both dispatchers delivered: {counts}"
