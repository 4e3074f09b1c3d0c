"""Faults on Kafka + Redis: each accepted event is delivered, none twice in side effects, without an operator.

The services are this module's own processes on their own ports (tests/helpers/faults.py);
each test prints its figures (sent, accepted, delivered, lost, duplicates, dead letters,
seconds to recover).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers.faults import RedisServer, Workload, kill_tree, own_services
from tests.helpers.waiting import eventually, holds

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, RedisServer]]:
    with own_services(tmp_path_factory.mktemp("services")) as started:
        yield started


def workload(tmp_path: Path, services: tuple[Any, RedisServer], **options: Any) -> Workload:
    kafka, redis = services
    return Workload(tmp_path, f"kafka://{kafka.bootstrap}", redis.url, **options)


def check(w: Workload, what: str, repeatable: int = 0) -> None:
    """Nothing accepted is lost, nothing dead-lettered, and no side effect twice, except at most ``repeatable``: a
    SIGKILL can land in the instant between a handler's side effect and the record of its completion
    (docs/reliability.md), and that one event is handled again after the restart."""
    report = w.settle()
    print(f"\n{what}:\n{report}")
    lost_sink, lost_hook = w.lost()
    assert not lost_sink and not lost_hook, report
    effects = w.effects()
    assert len(effects) - len(set(effects)) <= repeatable, report
    assert w.dead_letters() == 0, report


def test_events_accepted_right_after_start_up_are_all_delivered(tmp_path: Path, services: tuple[Any, RedisServer]) -> None:
    w = workload(tmp_path, services, rate=400)
    with w.platform(wait_for=("gateway",)):  # as soon as /readyz says so
        w.start_sending()
        w.wait_accepted(200)
        w.stop_sending()
        check(w, "start-up")


def test_a_broker_killed_and_restarted_mid_stream(tmp_path: Path, services: tuple[Any, RedisServer]) -> None:
    kafka, _ = services
    w = workload(tmp_path, services)
    with w.platform():
        w.start_sending()
        w.wait_accepted(100)
        refused = w.report.refused
        kafka.nodes[0].kill()
        eventually(lambda: w.report.refused > refused, 60, "the gateway refusing while the broker is down")
        kafka.nodes[0].start()
        kafka.wait()
        w.fault_ended = time.monotonic()
        w.wait_accepted(len(w.report.accepted) + 100, timeout=120)
        w.stop_sending()
        assert w.report.refused > refused, "nothing was accepted while the broker was down"
        check(w, "broker killed and restarted")


def test_cascade_up_stops_promptly_while_the_broker_is_down(tmp_path: Path, services: tuple[Any, RedisServer]) -> None:
    kafka, _ = services
    w = workload(tmp_path, services)
    try:
        with w.platform() as running:
            w.start_sending()
            w.wait_accepted(20)
            w.stop_sending()
            kafka.nodes[0].kill()
            started = time.monotonic()
            running.proc.terminate()
            code = running.proc.wait(90)
            print(f"\nstopped {time.monotonic() - started:.1f}s after SIGTERM with the broker down; exit code {code}")
            log = running.log.read_text()
            assert code == 0 and "Exception in thread" not in log, log[-3000:]
            assert time.monotonic() - started < 30, "stopping waited on the dead broker"
    finally:
        kafka.nodes[0].start()
        kafka.wait()


def test_redis_killed_and_restarted_mid_stream(tmp_path: Path, services: tuple[Any, RedisServer]) -> None:
    _, redis = services
    # 3 retries (3.5 s of backoff, far less than the outage); a slow handler, so a backlog is in
    # flight (claimed, handled, being recorded) when the store goes away
    w = workload(tmp_path, services, handler_delay=0.3)
    with w.platform() as running:
        w.start_sending()
        w.wait_accepted(100)
        refused = w.report.refused
        redis.kill()
        eventually(lambda: w.report.refused > refused, 60, "the gateway refusing while the store is down")
        for url in (f"{running.gateway}/readyz", f"{running.runtime}/readyz", f"{running.dashboard}/readyz"):
            reply = httpx.get(url, timeout=30)
            assert reply.status_code == 503 and reply.json()["checks"]["store"] != "ok", (url, reply.text)
        assert reply.json()["checks"]["bus"] == "ok", "the page names the dependency that is away"
        holds(lambda: True, 10, "an outage longer than the triggers' retry budget")
        redis.start()
        for url in (f"{running.gateway}/readyz", f"{running.runtime}/readyz", f"{running.dashboard}/readyz"):
            eventually(lambda: httpx.get(url, timeout=30).status_code == 200, 30, f"{url} ready again")
        w.fault_ended = time.monotonic()
        w.wait_accepted(len(w.report.accepted) + 100, timeout=120)
        w.stop_sending()
        check(w, "redis killed and restarted")


def test_the_platform_killed_and_restarted_mid_stream(tmp_path: Path, services: tuple[Any, RedisServer]) -> None:
    w = workload(tmp_path, services, handler_delay=0.3)  # claims are held when the process tree dies
    home = tmp_path / "home"
    with w.platform(home) as running:
        w.start_sending()
        w.wait_accepted(100)
        kill_tree(running.proc)
        w.stop_sending()
    with w.platform(home):
        w.fault_ended = time.monotonic()
        w.start_sending()
        w.wait_accepted(len(w.report.accepted) + 100, timeout=120)
        w.stop_sending()
        check(w, "cascade up killed (SIGKILL to every process of its tree) and restarted", repeatable=1)
