"""The dispatcher service: a worker thread per trigger, liveness, stats and Prometheus metrics.

Stats (delivered, retried, dead-lettered, filtered, duplicates, in flight, lag) are kept by
the workers, exported on ``/metrics`` by a collector that reads them at scrape time, and
written to the state store every few seconds so ``cascade triggers ls`` can show them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from http.server import ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from cascade.core.errors import RetryableError
from cascade.events.bus import EventBus
from cascade.events.dispatcher.http import ThreadLocalHTTP
from cascade.events.dispatcher.operations import serve_operations
from cascade.events.dispatcher.worker import TriggerWorker
from cascade.events.health import Health
from cascade.events.triggers import Trigger
from cascade.stores import StateStore
from cascade.stores.idempotency import Liveness

log = logging.getLogger("cascade.dispatcher")
COUNTERS = ("delivered", "retried", "dead_lettered", "filtered", "duplicates")


def trigger_lag(bus: EventBus, trigger: Trigger, topic: str) -> int:
    """Events on the trigger's topics that its group has not committed yet."""
    lag = 0
    for name in (topic, trigger.retry_topic(topic)):
        committed = bus.committed(name, trigger.group(topic))
        lag += sum(max(0, end - committed.get(p, 0)) for p, end in bus.end_offsets(name).items())
    return lag


class Dispatcher:
    def __init__(self, bus: EventBus, store: StateStore, triggers: Sequence[Trigger], *, topic: str,
                 resolve: Callable[[str], str], stats_interval: float = 2.0,
                 function_auth: Mapping[str, str] | None = None) -> None:
        self.bus, self.store, self.topic, self.stats_interval = bus, store, topic, stats_interval
        self.liveness = Liveness(store, first_beat=False)  # start() beats; a store away then is tried again
        self.health = Health({"bus": bus.ping, "store": store.ping})
        self._server: ThreadingHTTPServer | None = None
        self.client = ThreadLocalHTTP()
        self.workers = {t.name: TriggerWorker(t, bus, store, topic, resolve, self.client, liveness=self.liveness,
                                             function_auth=function_auth)
                        for t in triggers}
        self.lag: dict[str, int] = {}
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self.registry = CollectorRegistry()
        self.registry.register(_StatsCollector(self))

    def start(self, metrics_port: int | None = None, metrics_host: str = "127.0.0.1") -> None:
        self.liveness.start()
        for worker in self.workers.values():
            thread = threading.Thread(target=worker.run, name=f"trigger-{worker.trigger.name}", daemon=True)
            thread.start()
            self._threads.append(thread)
        stats = threading.Thread(target=self._stats_loop, name="dispatcher-stats", daemon=True)
        stats.start()
        self._threads.append(stats)
        if metrics_port is not None:
            self._server = serve_operations(metrics_host, metrics_port, self.registry, self.health)

    def _stats_loop(self) -> None:
        while not self._stop.wait(self.stats_interval):
            try:
                self.save_stats()
            except Exception as exc:  # stats are best effort; delivery goes on
                log.warning("saving trigger stats failed: %s", exc)

    def save_stats(self, *, lag: bool = True) -> None:
        """Write each trigger's counters to the store; ``lag`` asks the bus too (not when stopping)."""
        for name, worker in self.workers.items():
            if lag:
                self.lag[name] = trigger_lag(self.bus, worker.trigger, self.topic)
            doc: dict[str, Any] = {"name": name, "subscriber": worker.trigger.subscriber, "url": worker.url,
                                   "ordering": worker.trigger.ordering, "lag": self.lag.get(name, 0),
                                   "updated": time.time(),
                                   **worker.stats.snapshot()}
            self.store.put_record("trigger-stats", name, doc)

    def stats(self) -> dict[str, dict[str, int]]:
        return {name: {**w.stats.snapshot(), "lag": self.lag.get(name, 0)} for name, w in self.workers.items()}

    def request_stop(self) -> None:
        """Take no more records (deliveries in flight finish); ``stop`` then waits for them."""
        self._stop.set()
        for worker in self.workers.values():
            worker.stop()

    def stop(self, timeout: float = 30.0) -> None:
        self.request_stop()
        for thread in self._threads:
            thread.join(timeout)
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        try:
            self.save_stats(lag=False)
            self.liveness.stop()
        except RetryableError as exc:  # the store or bus is away: stopping must not fail on it
            log.warning("dispatcher stop: %s", exc)
        finally:
            self.client.close()


class _StatsCollector(Collector):
    def __init__(self, dispatcher: Dispatcher) -> None:
        self.dispatcher = dispatcher

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        stats = self.dispatcher.stats()
        for name in (*COUNTERS, "in_flight", "lag"):
            kind = CounterMetricFamily if name in COUNTERS else GaugeMetricFamily
            family = kind(f"cascade_trigger_{name}", f"Events {name.replace('_', ' ')} per trigger", labels=["trigger"])
            for trigger, values in stats.items():
                family.add_metric([trigger], values[name])
            yield family
