"""Runtime benchmarks: cold start from zero instances, and the warm latency the activator adds.

Cold start: the first request at zero instances until its response, over many trials,
beside the baseline of starting a bare interpreter (``python -c pass``). Warm: the same
request through the activator and straight to an instance's socket.
Run:  .venv/bin/python -m bench.runtime_bench
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import percentile, table, timed_post
from cascade.core.asgi import ServerThread
from cascade.core.ports import free_port
from cascade.events.bindings import http as ce_http
from cascade.events.envelope import new_event
from cascade.serving.runtime.activator import Runtime
from cascade.serving.runtime.policy import ScalingPolicy

HANDLER = "from events.envelope import new_event\n\ndef handle(event):\n    return None\n"


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("instance")
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self.path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trials", type=int, default=50)
    parser.add_argument("--warm", type=int, default=2000)
    args = parser.parse_args()
    base = [(lambda t: (subprocess.run([sys.executable, "-c", "pass"], check=True), time.perf_counter() - t)[1])(
        time.perf_counter()) * 1000 for _ in range(args.trials)]

    home = Path(tempfile.mkdtemp(prefix="cascade-rt-bench-"))
    (home / "fn").mkdir()
    (home / "fn" / "handler.py").write_text(HANDLER)
    runtime = Runtime(home / "run", auth=None, tick=3600)  # no autoscaling between trials: each first request is cold
    service = runtime.add_function("fn", ScalingPolicy(initial_scale=0, window=3600, scale_to_zero_grace=3600),
                                   {"path": str(home / "fn"), "module": "handler"})
    port = free_port()
    server = ServerThread(runtime, port=port, name="runtime").start()
    assert runtime.loop is not None
    headers, body = ce_http.to_binary(new_event("job.cancelled", {"jobId": "j"}, source="/bench"))
    conn = http.client.HTTPConnection("127.0.0.1", port)
    cold = []
    for _ in range(args.trials):
        asyncio.run_coroutine_threadsafe(service.scale_to(0), runtime.loop).result()
        while service.instances:
            time.sleep(0.005)
        cold.append(timed_post(conn, "/functions/fn", headers, body))
    [instance] = service.live()
    warm_via = [timed_post(conn, "/functions/fn", headers, body) for _ in range(args.warm)]
    direct = UnixHTTPConnection(instance.socket)
    warm_direct = [timed_post(direct, "/", headers, body) for _ in range(args.warm)]
    server.stop(30)
    rows = [["python -c pass (baseline)", percentile(base, 50), percentile(base, 99), 1.0],
            ["cold start through the activator", percentile(cold, 50), percentile(cold, 99),
             percentile(cold, 50) / percentile(base, 50)]]
    print(table(f"Cold start, first request at zero instances to its response (ms, {args.trials} trials)",
                ["path", "p50", "p99", "p50 ratio"], rows))
    print()
    added = percentile(warm_via, 50) - percentile(warm_direct, 50)
    rows = [["instance socket, direct", percentile(warm_direct, 50), percentile(warm_direct, 99), 1.0],
            ["through the activator", percentile(warm_via, 50), percentile(warm_via, 99),
             percentile(warm_via, 50) / percentile(warm_direct, 50)]]
    print(table(f"Warm request latency (ms, {args.warm} requests); activator adds {added:.3f} ms at p50",
                ["path", "p50", "p99", "p50 ratio"], rows))


if __name__ == "__main__":
    main()
