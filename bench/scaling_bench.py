"""Scaling benchmark: how ingest and delivery grow with partitions and processes on the three-broker cluster.

The gateway (``cascade gateway --workers K``, single events) and the dispatcher (K processes sharing one
trigger, a no-op subscriber) against the replicated cluster of ``scripts/services.sh cluster``
(replication 3, min.insync.replicas 2, acks=all), for every pair of partition count and process count.
Each figure is a ratio against the one-process run on the same partition count in the same run.

The model (docs/throughput.md): each process is bound by one core (one GIL), so throughput grows with
processes until the cores run out, and with partitions only while some process has no partition of its
own; the brokers are far from their limit at these rates. On a 2-core machine everything shares two
cores (load generator, subscriber, brokers), so the figures show where that ceiling lies, not a cluster's.
Needs the cluster and Redis up: scripts/services.sh cluster.
Run:  .venv/bin/python -m bench.scaling_bench
"""

from __future__ import annotations

import argparse
import os
import tempfile
import uuid
from pathlib import Path

from bench.common import table
from bench.dispatcher_bench import throughput
from bench.gateway_bench import platform_gateway, wrk
from cascade.events.bindings import http as ce_http
from cascade.events.envelope import new_event

CLUSTER = "127.0.0.1:19092,127.0.0.1:19094,127.0.0.1:19096"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--partitions", default="3,6,12", help="partition counts, comma-separated")
    parser.add_argument("--processes", default=f"1,{max(2, os.cpu_count() or 1)}", help="process counts")
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--events", type=int, default=4000, help="events per delivery run")
    args = parser.parse_args()
    partitions = [int(p) for p in args.partitions.split(",")]
    processes = [int(k) for k in args.processes.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="cascade-scaling-"))
    headers, body = ce_http.to_binary(new_event("dataset.uploaded", {"dataset": "cats", "uri": "s3://cats/a.jpg",
                                                                     "size": 10, "origin": "api"}, source="/bench"))
    rows = []
    for p in partitions:
        ingest: dict[int, float] = {}
        deliver: dict[int, float] = {}
        for k in processes:
            topic = f"scaling-{uuid.uuid4().hex[:8]}"
            with platform_gateway(tmp / f"gw-{p}-{k}", k, kafka=CLUSTER, topic=topic, partitions=p) as (port, auth):
                ingest[k] = wrk(port, {**headers, **auth}, body, args.seconds, 32, tmp)
            deliver[k], _ = throughput(args.events, k, kafka=CLUSTER, partitions=p)
            rows.append([p, k, ingest[k], ingest[k] / ingest[processes[0]], deliver[k],
                         deliver[k] / deliver[processes[0]]])
    print(table(f"Three brokers (replication 3, acks=all): gateway single events and dispatcher deliveries by "
                f"partitions and processes ({os.cpu_count()} cores; ratios against {processes[0]} process(es))",
                ["partitions", "processes", "ingest events/s", "ingest ratio", "delivered events/s",
                 "delivery ratio"], rows))


if __name__ == "__main__":
    main()
