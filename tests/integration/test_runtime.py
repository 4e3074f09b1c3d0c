"""The scale-to-zero runtime with real instance processes: cold starts, autoscaling, limits, crashes."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from cascade.core.asgi import ServerThread
from cascade.core.ports import free_port
from cascade.events.bindings import http as ce_http
from cascade.events.envelope import new_event
from cascade.serving.runtime.activator import Runtime
from cascade.serving.runtime.policy import ScalingPolicy
from cascade.serving.runtime.service import Service
from tests.helpers.waiting import holds

PROBE = '''
import os, threading, time
from cascade.events.envelope import new_event
_lock = threading.Lock()
_active = 0
_max = 0

def handle(event):
    global _active, _max
    data = event.get_data()
    mode = data.get("reason", "")
    with _lock:
        _active += 1
        _max = max(_max, _active)
        current = _active
    try:
        if mode.startswith("sleep:"):
            time.sleep(float(mode[6:]))
        if mode == "raise":
            raise RuntimeError("the handler failed")
        if mode == "exit":
            os._exit(3)
        return new_event("job.failed", {"jobId": data["jobId"], "reason": f"{os.getpid()}:{current}"}, source="/probe")
    finally:
        with _lock:
            _active -= 1
'''


@dataclass
class Env:
    runtime: Runtime
    url: str
    service: Service
    max_live: int = 0

    def post(self, job: str, reason: str = "", client: httpx.Client | None = None) -> httpx.Response:
        headers, body = ce_http.to_binary(new_event("job.cancelled", {"jobId": job, "reason": reason}, source="/t"))
        return (client or httpx).post(f"{self.url}/functions/probe", headers=headers, content=body, timeout=60)

    def live(self) -> int:
        return len(self.service.live())

    def wait(self, check: object, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while not check():  # type: ignore[operator]
            assert time.monotonic() < deadline, "timed out"
            time.sleep(0.02)

    def call(self, coroutine: object) -> None:
        assert self.runtime.loop is not None
        asyncio.run_coroutine_threadsafe(coroutine, self.runtime.loop).result(30)  # type: ignore[arg-type]


@pytest.fixture
def make(tmp_path: Path) -> Iterator[object]:
    (tmp_path / "probe").mkdir()
    (tmp_path / "probe" / "handler.py").write_text(PROBE)
    started: list[ServerThread] = []

    def build(tick: float = 0.05, config: dict[str, object] | None = None, **policy: object) -> Env:
        runtime = Runtime(tmp_path / "run", auth=None, tick=tick)
        service = runtime.add_function("probe", ScalingPolicy(**policy),  # type: ignore[arg-type]
                                       {"path": str(tmp_path / "probe"), "module": "handler", **(config or {})})
        server = ServerThread(runtime, port=free_port(), name="runtime").start()
        started.append(server)
        return Env(runtime, server.url, service)

    yield build
    for server in started:
        server.stop(30)


def test_scales_from_zero_on_the_first_event_and_back_after_the_grace_period(make: object) -> None:
    env: Env = make(initial_scale=0, window=0.5, scale_to_zero_grace=0.5)  # type: ignore[operator]
    assert env.live() == 0
    reply = env.post("job-1")
    assert reply.status_code == 200 and reply.headers["ce-type"] == "io.cascade.job.failed.v1"
    assert reply.json()["jobId"] == "job-1"
    assert env.service.cold_starts == 1 and env.live() == 1
    env.wait(lambda: env.live() == 0)
    assert env.post("job-2").status_code == 200 and env.service.cold_starts == 2


def test_a_cold_service_queues_requests_instead_of_refusing_them(make: object) -> None:
    env: Env = make(initial_scale=0, window=1)  # type: ignore[operator]
    with ThreadPoolExecutor(20) as pool:
        replies = list(pool.map(lambda i: env.post(f"job-{i}"), range(20)))
    assert [r.status_code for r in replies] == [200] * 20


def test_concurrency_above_target_adds_instances_up_to_max_scale(make: object) -> None:
    env: Env = make(initial_scale=0, target=1, target_utilization=100, max_scale=3, window=2)  # type: ignore[operator]
    peak = 0
    stop = threading.Event()

    def watch() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, env.live())
            time.sleep(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    with ThreadPoolExecutor(12) as pool:
        replies = list(pool.map(lambda i: env.post(f"job-{i}", "sleep:0.6"), range(12)))
        # the first wave may all land on the first instance to be ready; with all three up, work spreads
        spread = list(pool.map(lambda i: env.post(f"again-{i}", "sleep:0.3"), range(12)))
    stop.set()
    watcher.join()
    assert all(r.status_code == 200 for r in replies + spread)
    assert peak == 3, f"peak {peak}: scale up to max-scale and no further"
    assert len({r.json()["reason"].split(":")[0] for r in spread}) >= 2, "work spread over instances"


def test_container_concurrency_is_never_exceeded(make: object) -> None:
    env: Env = make(initial_scale=1, max_scale=2, container_concurrency=2, window=2)  # type: ignore[operator]
    with ThreadPoolExecutor(16) as pool:
        replies = list(pool.map(lambda i: env.post(f"job-{i}", "sleep:0.15"), range(16)))
    assert all(r.status_code == 200 for r in replies)
    per_instance = defaultdict(int)
    for r in replies:
        pid, current = r.json()["reason"].split(":")
        per_instance[pid] = max(per_instance[pid], int(current))
    assert max(per_instance.values()) <= 2, per_instance


@pytest.mark.slow
def test_scale_changes_under_10000_requests_lose_none(make: object) -> None:
    env: Env = make(initial_scale=2, target=4, target_utilization=100, max_scale=4, window=1,  # type: ignore[operator]
                    scale_to_zero_grace=0.2)
    results: list[str] = []
    failures: list[str] = []
    lock = threading.Lock()

    def worker(start: int) -> None:
        with httpx.Client() as client:
            for i in range(start, 10_000, 16):
                reply = env.post(f"job-{i}", client=client)
                with lock:
                    if reply.status_code == 200:
                        results.append(reply.json()["jobId"])
                    else:
                        failures.append(f"{i}: {reply.status_code} {reply.text[:80]}")

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(16)]
    for t in threads:
        t.start()
    for want in (1, 4, 1, 3, 1):  # scale down and up while the load runs
        time.sleep(0.4)
        env.call(env.service.scale_to(want))
    for t in threads:
        t.join()
    assert failures == []
    assert sorted(results) == sorted(f"job-{i}" for i in range(10_000))


def test_a_crashing_handler_does_not_take_down_the_runtime(make: object) -> None:
    env: Env = make(initial_scale=1, window=5)  # type: ignore[operator]
    failed = env.post("job-1", "raise")
    assert failed.status_code == 500 and "the handler failed" in failed.text
    assert env.post("job-2").status_code == 200
    died = env.post("job-3", "exit")
    assert died.status_code == 502, f"the caller (the dispatcher) retries this; got {died.text[-600:]}"
    assert env.post("job-4").status_code == 200, "a new instance replaces the dead one"


def test_min_scale_one_keeps_an_instance_warm(make: object) -> None:
    env: Env = make(min_scale=1, initial_scale=0, window=0.3, scale_to_zero_grace=0.1)  # type: ignore[operator]
    env.wait(lambda: env.live() == 1)
    holds(lambda: env.live() == 1, 1.5, "one warm instance, well past the window and the grace")
    assert env.post("job-1").status_code == 200 and env.service.cold_starts == 0


def test_unknown_service_lists_the_live_ones(make: object) -> None:
    env: Env = make(initial_scale=0)  # type: ignore[operator]
    reply = httpx.post(f"{env.url}/functions/nope", content=b"{}")
    assert reply.status_code == 404 and reply.json()["services"] == ["probe"]
    assert httpx.get(f"{env.url}/_runtime/services").json()[0]["name"] == "probe"


def test_data_filters_knative_cannot_apply_are_applied_before_the_handler(make: object) -> None:
    env: Env = make(initial_scale=1, config={"data_filter": "data.reason != 'skip'"})  # type: ignore[operator]
    skipped = env.post("job-1", "skip")
    assert skipped.status_code == 200 and skipped.content == b""
    assert env.post("job-2").json()["jobId"] == "job-2"


def test_effectively_once_with_the_state_store(make: object, tmp_path: Path) -> None:
    env: Env = make(initial_scale=1, config={"idempotent": True,  # type: ignore[operator]
                                             "state_url": f"sqlite://{tmp_path}/state.db"})
    headers, body = ce_http.to_binary(new_event("job.cancelled", {"jobId": "j"}, source="/t", id="same"))
    first = httpx.post(f"{env.url}/functions/probe", headers=headers, content=body)
    again = httpx.post(f"{env.url}/functions/probe", headers=headers, content=body)
    assert first.json()["jobId"] == "j"
    assert again.status_code == 200 and again.content == b"", "a redelivered event is not handled twice"
