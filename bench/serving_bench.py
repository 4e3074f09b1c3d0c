"""Serving benchmarks: the inference gateway's warm overhead, and a cold call split in two.

Warm: V1 predict through the runtime's inference routes against the same request sent
straight to the model server, in the same run. Cold, for each format: the first call at zero
instances (the format's zygote already warm, as after the first deployment), split into model
load (timed inside the server) and instance start (the rest), with the cold call / model load
ratio and the cold call less the load (the goal: within 300 ms).
Run:  .venv/bin/python -m bench.serving_bench
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import re
import sys
import tempfile
import time
from pathlib import Path

from bench.common import percentile, table, timed_post
from cascade.core.asgi import ServerThread
from cascade.core.ports import free_port
from cascade.serving.runtime.activator import Runtime

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.helpers import models  # noqa: E402  (tiny models built from code)


def post(conn: http.client.HTTPConnection, path: str, body: bytes) -> float:
    return timed_post(conn, path, {"content-type": "application/json"}, body, ok=(200,))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--warm", type=int, default=2000)
    parser.add_argument("--cold", type=int, default=10)
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="cascade-serving-bench-"))
    runtime = Runtime(home / "run", auth=None, tick=3600, model_grace=3600)
    port = free_port()
    server = ServerThread(runtime, port=port, name="runtime").start()
    assert runtime.loop is not None
    deploy = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    artifacts = {"torchscript": models.torchscript(home), "onnx": models.onnx_model(home),
                 "sklearn": models.sklearn(home), "xgboost": models.xgboost_model(home)}
    for fmt, artifact in artifacts.items():
        deploy.request("PUT", f"/_runtime/models/{fmt}/versions/1", body=json.dumps({"artifact": str(artifact),
                                                                                     "format": fmt}))
        reply = deploy.getresponse()
        assert reply.status == 200, reply.read()
        reply.read()
    body = json.dumps({"instances": [[1.0, 2.0, 3.0, 4.0]]}).encode()
    via = http.client.HTTPConnection("127.0.0.1", port)
    [instance] = runtime.services["model-torchscript-1"].live()
    direct = http.client.HTTPConnection("127.0.0.1", int(instance.socket.rsplit(":", 1)[1]))
    for conn in (via, direct):
        post(conn, "/v1/models/torchscript:predict", body)
    warm_via = [post(via, "/v1/models/torchscript:predict", body) for _ in range(args.warm)]
    warm_direct = [post(direct, "/v1/models/torchscript:predict", body) for _ in range(args.warm)]
    rows = []
    for fmt in artifacts:
        service = runtime.services[f"model-{fmt}-1"]
        cold, loads = [], []
        for _ in range(args.cold):
            asyncio.run_coroutine_threadsafe(service.scale_to(0), runtime.loop).result()
            while service.instances:
                time.sleep(0.01)
            cold.append(post(via, f"/v1/models/{fmt}:predict", body))
            log = sorted(service.run_dir.glob("*.log"), key=lambda p: p.stat().st_mtime)[-1].read_text()
            loads.append(float(re.findall(r"model loaded in ([\d.]+)s", log)[-1]) * 1000)
        starts = [c - m for c, m in zip(cold, loads)]
        rows.append([fmt, percentile(loads, 50), percentile(starts, 50), percentile(cold, 50), max(cold),
                     percentile(cold, 50) / max(percentile(loads, 50), 1e-3)])
    server.stop(60)
    added = percentile(warm_via, 50) - percentile(warm_direct, 50)
    print(table(f"Warm V1 predict (ms, {args.warm} calls); the inference gateway adds {added:.3f} ms at p50",
                ["path", "p50", "p99", "p50 ratio"],
                [["model server, direct", percentile(warm_direct, 50), percentile(warm_direct, 99), 1.0],
                 ["through the inference gateway", percentile(warm_via, 50), percentile(warm_via, 99),
                  percentile(warm_via, 50) / percentile(warm_direct, 50)]]))
    print()
    print(table(f"Cold call at zero instances, model servers forked from a warm zygote (ms, p50 of {args.cold})",
                ["format", "model load", "cold call less load", "cold call", "cold max", "cold / load"], rows))


if __name__ == "__main__":
    main()
