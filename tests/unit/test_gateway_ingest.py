"""POST /events's plain ASGI endpoint: what it answers, and a client that leaves before its body ends."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import orjson

from cascade.core.errors import CascadeError, InvalidInput
from cascade.events.gateway.ingest import EventsEndpoint


def run(endpoint: EventsEndpoint, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/events", "headers": [(b"content-type", b"application/json")]}
    asyncio.run(endpoint(scope, receive, send))
    return sent


def test_an_accepted_body_is_answered_202_with_the_gateways_reply_and_a_refusal_with_its_problem() -> None:
    bodies: list[bytes] = []
    refused: list[tuple[str, CascadeError]] = []

    async def accept(headers: Mapping[str, str], body: bytes) -> dict[str, Any]:
        bodies.append(body)
        if body == b"bad":
            raise InvalidInput("no", field="/data")
        return {"accepted": 1, "duplicates": 0, "ids": ["e1"]}

    endpoint = EventsEndpoint(accept, lambda route, exc: refused.append((route, exc)))
    sent = run(endpoint, [{"type": "http.request", "body": b'{"a":', "more_body": True},
                          {"type": "http.request", "body": b"1}"}])
    assert bodies == [b'{"a":1}']
    assert sent[0]["status"] == 202 and orjson.loads(sent[1]["body"]) == {"accepted": 1, "duplicates": 0, "ids": ["e1"]}
    sent = run(endpoint, [{"type": "http.request", "body": b"bad"}])
    assert sent[0]["status"] == 400 and orjson.loads(sent[1]["body"])["field"] == "/data"
    assert [route for route, _ in refused] == ["/events"]


def test_a_client_that_leaves_before_its_body_ends_gets_no_answer_and_nothing_is_accepted() -> None:
    async def accept(headers: Mapping[str, str], body: bytes) -> dict[str, Any]:
        raise AssertionError("nothing was sent whole: nothing may be accepted")

    endpoint = EventsEndpoint(accept, lambda route, exc: None)
    assert run(endpoint, [{"type": "http.request", "body": b'{"a":', "more_body": True},
                          {"type": "http.disconnect"}]) == []
