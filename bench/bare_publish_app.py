"""The gateway benchmark's second baseline: the bare FastAPI endpoint plus the one thing the gateway may not skip.

It answers 202 only once Kafka has the body (``acks=all``, idempotent), like the gateway, through a raw librdkafka
producer (confluent-kafka, the client the gateway's bus produces with), which batches what concurrent requests send
(no parsing, validation, authentication or rate limits). A FastAPI route that must wait for a durable append
answers no faster than this on the same machine and broker (the gateway's own route is served as plain ASGI).
"""

from __future__ import annotations

import asyncio
import os
import threading
from typing import Any

import confluent_kafka
from fastapi import FastAPI, Request

app = FastAPI()
producer = confluent_kafka.Producer({"bootstrap.servers": os.environ.get("CASCADE_BENCH_KAFKA", "127.0.0.1:9092"),
                                     "acks": "all", "enable.idempotence": True, "linger.ms": 1})
TOPIC = os.environ.get("CASCADE_BENCH_TOPIC", "cascade.bench.bare")


def _serve_reports() -> None:
    while True:
        producer.poll(0.1)


threading.Thread(target=_serve_reports, name="kafka-delivery", daemon=True).start()


@app.post("/events", status_code=202)
async def events(request: Request) -> dict[str, int]:
    loop = asyncio.get_running_loop()
    acked: asyncio.Future[None] = loop.create_future()

    def delivered(err: Any, _msg: Any) -> None:
        loop.call_soon_threadsafe(acked.set_exception if err else acked.set_result,
                                  RuntimeError(str(err)) if err else None)

    producer.produce(TOPIC, await request.body(), on_delivery=delivered)
    await acked  # durable on the broker: only now 202
    return {"accepted": 1}
