"""The gateway benchmark's second baseline: the bare FastAPI endpoint plus the one thing the gateway may not skip.

It answers 202 only once Kafka has the body (``acks=all``), like the gateway, through a raw kafka-python
producer that batches what concurrent requests send (no parsing, validation, authentication or rate limits).
No gateway can answer faster than this on the same machine and broker: it bounds the gateway's ratio.
"""

from __future__ import annotations

import asyncio
import os

from fastapi import FastAPI, Request
from kafka import KafkaProducer

app = FastAPI()
producer = KafkaProducer(bootstrap_servers=os.environ.get("CASCADE_BENCH_KAFKA", "127.0.0.1:9092"), acks="all",
                         linger_ms=1)
TOPIC = os.environ.get("CASCADE_BENCH_TOPIC", "cascade.bench.bare")


@app.post("/events", status_code=202)
async def events(request: Request) -> dict[str, int]:
    loop = asyncio.get_running_loop()
    acked: asyncio.Future[object] = loop.create_future()
    sent = producer.send(TOPIC, await request.body())
    sent.add_callback(lambda meta: loop.call_soon_threadsafe(acked.set_result, meta))
    sent.add_errback(lambda exc: loop.call_soon_threadsafe(acked.set_exception, exc))
    await acked  # durable on the broker: only now 202
    return {"accepted": 1}
