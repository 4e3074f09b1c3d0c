"""Gateway ingest benchmark: POST /events (single and batch of 100), validated and on Kafka.

Baselines measured in the same run: a bare FastAPI endpoint on the same server stack
(uvicorn, one worker), the same endpoint answering only once a raw librdkafka producer has
the body on Kafka (what a FastAPI route that waits for a durable append costs), and the
raw kafka-python producer. Needs Kafka up and a load generator:
Debian's ``wrk``, or ``hey`` (``scripts/tools.sh bench`` builds it).
Run:  .venv/bin/python -m bench.gateway_bench
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from bench.bus_bench import raw_throughput
from bench.common import table
from cascade.core.ports import free_port
from cascade.events.bindings import http as ce_http
from cascade.events.envelope import new_event

LUA = """wrk.method = "POST"
wrk.body = io.open("{body}", "rb"):read("*a")
{headers}
"""


LOADGEN: list[str] = []  # command prefixes: `taskset` with --pinned
SERVERS: list[str] = []


def serve(module: str, env: dict[str, str]) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    proc = subprocess.Popen([*SERVERS, sys.executable, "-m", "uvicorn", f"{module}:app", "--port", str(port), "--log-level",
                             "warning", "--no-access-log"], env={**os.environ, **env})
    for _ in range(200):
        try:
            httpx.get(f"http://127.0.0.1:{port}/docs")
            return proc, port
        except httpx.HTTPError:
            time.sleep(0.1)
    raise RuntimeError(f"{module} did not start")


def hey_path() -> str | None:
    tools = Path(os.environ.get("CASCADE_TOOLS_DIR", Path.home() / ".cache" / "cascade"))
    found = shutil.which("hey") or str(tools / "hey" / "bin" / "hey")
    return found if Path(found).exists() else None


def hey_rate(hey: str, url: str, headers: dict[str, str], body: Path, seconds: int, connections: int,
             status: str) -> float:
    """Requests per second ``hey`` gets POSTing ``body`` to ``url``; every answer must be ``status``."""
    flags = [x for k, v in headers.items() if k.lower() != "content-type" for x in ("-H", f"{k}: {v}")]
    out = subprocess.run([*LOADGEN, hey, "-z", f"{seconds}s", "-c", str(connections), "-m", "POST", "-D", str(body),
                          "-T", headers.get("content-type", "application/json"), *flags, url],
                         capture_output=True, text=True, check=True).stdout
    codes = re.findall(r"\[(\d{3})\]\s+\d+ responses", out)
    if set(codes) - {status}:
        raise RuntimeError(f"some requests were not accepted:\n{out}")
    match = re.search(r"Requests/sec:\s+([\d.]+)", out)
    assert match, out
    return float(match.group(1))


def wrk(port: int, headers: dict[str, str], body: bytes, seconds: int, connections: int, tmp: Path, *,
        path: str = "/events", status: int = 202) -> float:
    """Requests per second that got ``status`` (wrk, or hey where wrk is missing)."""
    (tmp / "body").write_bytes(body)
    lines = "\n".join(f'wrk.headers["{k}"] = "{v}"' for k, v in headers.items())
    (tmp / "post.lua").write_text(LUA.format(body=tmp / "body", headers=lines))
    url = f"http://127.0.0.1:{port}{path}"
    check = httpx.post(url, headers=headers, content=body)
    if check.status_code != status:
        raise RuntimeError(f"the endpoint answers {check.status_code}: {check.text}")
    hey = None if shutil.which("wrk") else hey_path()
    if hey is not None:
        return hey_rate(hey, url, headers, tmp / "body", seconds, connections, str(status))
    out = subprocess.run([*LOADGEN, "wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "-s", str(tmp / "post.lua"),
                          url], capture_output=True, text=True, check=True).stdout
    if "Non-2xx" in out:
        raise RuntimeError(f"some requests were not accepted:\n{out}")
    match = re.search(r"Requests/sec:\s+([\d.]+)", out)
    assert match, out
    return float(match.group(1))


@contextmanager
def platform_gateway(home: Path, workers: int, *, kafka: str = "127.0.0.1:9092", topic: str = "cascade.bench",
                     partitions: int = 4) -> Iterator[tuple[int, dict[str, str]]]:
    """``cascade gateway --workers N`` on Kafka, rate limits out of the way; its port and a token's header."""
    port = free_port()
    env = {**os.environ, "CASCADE_HOME": str(home), "CASCADE_BUS__URL": f"kafka://{kafka}",
           "CASCADE_BUS__TOPIC": topic, "CASCADE_BUS__PARTITIONS": str(partitions), "CASCADE_GATEWAY__PORT": str(port),
           "CASCADE_GATEWAY__RATE_PER_SECOND": "1e9", "CASCADE_GATEWAY__BURST": "1000000000",
           "CASCADE_SOURCES__FOLDER_ENABLED": "false"}
    proc = subprocess.Popen([*SERVERS, sys.executable, "-m", "cascade.cli", "gateway", "--workers", str(workers)], env=env,
                            stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz").status_code == 200 and (home / "token").exists():
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("cascade gateway did not start")
            time.sleep(0.1)
        time.sleep(2.0)  # the workers import and join the socket
        yield port, {"authorization": f"Bearer {(home / 'token').read_text().strip()}"}
    finally:
        proc.terminate()
        proc.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=int, default=8)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--pinned", action="store_true",
                        help="the load generator on core 0, the servers (and their workers) on the other cores")
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    if args.pinned:
        if cores < 2 or not shutil.which("taskset"):
            parser.error("--pinned needs two cores and taskset")
        LOADGEN[:] = ["taskset", "-c", "0"]
        SERVERS[:] = ["taskset", "-c", f"1-{cores - 1}"]
    tmp = Path(tempfile.mkdtemp(prefix="cascade-gw-bench-"))
    event = new_event("dataset.uploaded", {"dataset": "cats", "uri": "s3://cats/a.jpg", "size": 10, "origin": "api"},
                      source="/bench", partitionkey="cats")
    single_h, single_b = ce_http.to_binary(event)
    batch_h, batch_b = ce_http.to_batch([new_event("dataset.uploaded", {"dataset": f"d{i % 8}", "uri": "s3://d/a",
                                                                         "size": i, "origin": "api"}, source="/bench",
                                                   partitionkey=f"d{i % 8}") for i in range(100)])
    processes = cores - 1 if args.pinned else cores  # the gateway's processes: one per core it may use
    bare, bare_port = serve("bench.bare_app", {})
    durable, durable_port = serve("bench.bare_publish_app", {})
    gateway, gw_port = serve("bench.gateway_app", {"CASCADE_BENCH_HOME": str(tmp)})
    token = (tmp / "token").read_text()
    auth = {"authorization": f"Bearer {token}"}
    try:
        results = {
            "bare single": wrk(bare_port, single_h, single_b, args.seconds, args.connections, tmp),
            "durable single": wrk(durable_port, single_h, single_b, args.seconds, args.connections, tmp),
            "gateway single": wrk(gw_port, {**single_h, **auth}, single_b, args.seconds, args.connections, tmp),
            "bare batch": wrk(bare_port, batch_h, batch_b, args.seconds, args.connections // 4, tmp),
            "gateway batch": wrk(gw_port, {**batch_h, **auth}, batch_b, args.seconds, args.connections // 4, tmp),
        }
    finally:
        bare.terminate()
        durable.terminate()
        gateway.terminate()
    for n in sorted({1, processes}):  # the gateway as `cascade gateway --workers N` serves it
        with platform_gateway(tmp / f"up-{n}", n) as (port, up_auth):
            results[f"up {n}"] = wrk(port, {**single_h, **up_auth}, single_b, args.seconds, args.connections, tmp)
    raw = raw_throughput(20000)
    rows = [
        ["bare FastAPI, single event", results["bare single"], results["bare single"], 1.0, "-"],
        ["bare FastAPI route + raw librdkafka producer, acks=all before 202", results["durable single"],
         results["durable single"], results["durable single"] / results["bare single"], "-"],
        ["gateway, single event", results["gateway single"], results["gateway single"],
         results["gateway single"] / results["bare single"], ">= 0.7 of bare"],
        *[[f"cascade gateway --workers {n}, single event", results[f"up {n}"], results[f"up {n}"],
           results[f"up {n}"] / results["bare single"], ">= 0.7 of bare"] for n in sorted({1, processes})],
        ["bare FastAPI, batch of 100", results["bare batch"], results["bare batch"] * 100, 1.0, "-"],
        ["gateway, batch of 100", results["gateway batch"], results["gateway batch"] * 100,
         results["gateway batch"] / results["bare batch"], "-"],
        ["raw kafka-python producer", float("nan"), raw, 1.0, "-"],
        ["gateway batch vs raw producer", float("nan"), results["gateway batch"] * 100,
         results["gateway batch"] * 100 / raw, ">= 0.5 of raw"],
    ]
    tool = "wrk" if shutil.which("wrk") else "hey"
    pinned = f", load generator on core 0, servers on cores 1-{cores - 1}" if args.pinned else ""
    print(table(f"Gateway ingest, {args.seconds}s per run, {tool} with {args.connections} connections{pinned} "
                "(validated, durable on Kafka)", ["endpoint", "requests/s", "events/s", "ratio", "target"], rows))
    print(json.dumps({k: round(v, 1) for k, v in results.items()} | {"raw producer events/s": round(raw)}))


if __name__ == "__main__":
    main()
