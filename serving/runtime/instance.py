"""Inside an instance: serve one function's ``handle(event)`` over the CloudEvents HTTP binding.

Runs in a process forked from the function's template (``template``), on a UNIX socket the
activator names. ``start(config)`` runs here, after the fork; sync handlers run in a thread
pool so one slow call does not stall the others; ``stop()`` runs after draining on SIGTERM.
A handler's exception answers 500 with the error; the instance keeps serving.

Effectively once (``idempotent: true``): the instance claims ``(source, id)`` under its own
liveness key, so a claim left by an instance that died is taken over within seconds. A state
store that is down never kills the instance: the claim answers 503 marked ``infrastructure``
(the dispatcher retries it without spending the trigger's retries), and a completion that
could not be recorded after the handler ran is answered as handled and recorded by a
background retry once the store is back, so the side effect never runs twice.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import signal
import traceback
from collections.abc import Callable
from types import ModuleType
from typing import Any

from cloudevents.http import CloudEvent

from cascade.core.errors import CascadeError, InvalidInput, RetryableError
from cascade.events.bindings import http as ce_http
from cascade.events.envelope import check_event
from cascade.events.expressions import Expression
from cascade.serving.runtime import http11
from cascade.stores import StateStore, open_store
from cascade.stores.idempotency import Claim, Idempotency, Liveness

INFRASTRUCTURE = ("x-cascade-error", "infrastructure")  # a 503 the dispatcher retries without counting it


def control(message: dict[str, Any], fd: int = 1) -> None:
    """A line on the control channel (the template's stdout), written without Python locks."""
    os.write(fd, (json.dumps(message) + "\n").encode())


class Instance:
    def __init__(self, module: ModuleType, name: str, config: dict[str, Any]) -> None:
        self.module, self.name, self.config = module, name, config
        self.handle: Callable[..., Any] = getattr(module, "handle")
        self.is_async = inspect.iscoroutinefunction(self.handle)
        self.active = 0
        self.connections: set[asyncio.StreamWriter] = set()
        self.idle = asyncio.Event()
        self.idle.set()
        expression = config.get("data_filter") or os.environ.get("CASCADE_DATA_FILTER")
        self.data_filter = Expression.compile(expression) if expression else None
        self.store: StateStore | None = None
        self.idem: Idempotency | None = None
        self.liveness: Liveness | None = None
        self.unrecorded: set[tuple[str, str]] = set()  # handled; completion not yet recorded in the store
        self.unreleased: set[tuple[str, str]] = set()  # failed; the claim could not be given back
        if config.get("idempotent") and config.get("state_url"):
            self.store = open_store(config["state_url"])
            self.liveness = Liveness(self.store, f"fn:{name}:{os.getpid()}:{os.urandom(4).hex()}", ttl=5.0,
                                     first_beat=False)
            self.idem = Idempotency(self.store, f"fn:{name}", claim_ttl=float(config.get("claim_ttl", 300)),
                                    liveness=self.liveness)

    def _handle_and_record(self, event: CloudEvent, source: str, ident: str) -> tuple[Any, bool]:
        """Run a sync handler, then record its completion at once (False: not recorded yet)."""
        result = self.handle(event)
        if self.idem is None:
            return result, False
        try:
            self.idem.complete(source, ident)
        except RetryableError:
            return result, False
        return result, True

    async def _record_done(self, source: str, ident: str) -> None:
        """Record a completion, retrying while the store is away."""
        assert self.idem is not None
        delay = 0.2
        while True:
            try:
                await asyncio.to_thread(self.idem.complete, source, ident)
                self.unrecorded.discard((source, ident))
                return
            except RetryableError:
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def invoke(self, event: CloudEvent) -> tuple[int, list[tuple[str, str]], bytes]:
        if self.data_filter is not None and not self.data_filter.matches(event.get_data()):
            return 200, [], b""  # a data filter Knative could not apply (see functions.render)
        source, ident = str(event["source"]), str(event["id"])
        if self.idem is not None:
            if (source, ident) in self.unrecorded:
                return 200, [], b""  # handled here already; its completion is on its way to the store
            try:
                if (source, ident) in self.unreleased and await asyncio.to_thread(self.idem.held, source, ident):
                    claim = Claim.ACQUIRED  # our failed attempt's claim, still ours: the retry runs here
                else:
                    claim = await asyncio.to_thread(self.idem.claim, source, ident)
                self.unreleased.discard((source, ident))
            except RetryableError as exc:
                return 503, [("retry-after", "1"), INFRASTRUCTURE], f"state store unavailable: {exc}".encode()
            if claim is Claim.DONE:
                return 200, [], b""
            if claim is Claim.BUSY:
                return 503, [("retry-after", "1"), INFRASTRUCTURE], b"this event is being handled by another instance"
        recorded = False
        try:
            if self.is_async:
                result = await self.handle(event)
            else:  # the completion follows in the same thread: the window where a crash duplicates is minimal
                result, recorded = await asyncio.to_thread(self._handle_and_record, event, source, ident)
        except Exception:
            if self.idem is not None:
                try:
                    await asyncio.to_thread(self.idem.release, source, ident)
                except RetryableError:
                    self.unreleased.add((source, ident))  # still ours: a retry that comes back here runs it
            return 500, [("content-type", "text/plain")], traceback.format_exc()[-2000:].encode()
        if self.idem is not None and not recorded:
            try:
                await asyncio.to_thread(self.idem.complete, source, ident)
            except RetryableError:
                self.unrecorded.add((source, ident))
                asyncio.get_running_loop().create_task(self._record_done(source, ident))
        if result is None:
            return 202, [], b""
        if isinstance(result, CloudEvent):
            headers, body = ce_http.to_binary(result)
        elif isinstance(result, list) and all(isinstance(e, CloudEvent) for e in result):
            headers, body = ce_http.to_batch(result)
        else:
            return 500, [], f"handle() returned {type(result).__name__}; expected None, a CloudEvent or a list".encode()
        return 200, list(headers.items()), body

    async def respond(self, request: http11.Message) -> bytes:
        method, path, _ = (request.start.split(" ") + ["", ""])[:3]
        if method == "GET" and path in ("/healthz", "/readyz"):
            return http11.response(200, [], b"ok")
        if method != "POST":
            return http11.response(405, [], b"POST a CloudEvent")
        try:
            events = ce_http.parse(dict(request.headers), request.body)
            if len(events) != 1:
                raise InvalidInput("send one event per request")
            check_event(events[0])
        except CascadeError as exc:
            status = 415 if isinstance(exc, ce_http.UnsupportedMediaType) else 400
            return http11.response(status, [("content-type", "text/plain")], str(exc).encode())
        self.active += 1
        self.idle.clear()
        try:
            status, headers, body = await self.invoke(events[0])
        finally:
            self.active -= 1
            if not self.active:
                self.idle.set()
        return http11.response(status, headers, body)

    async def connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections.add(writer)
        try:
            while True:
                request = await http11.read_message(reader)
                if request is None:
                    break
                writer.write(await self.respond(request))
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self.connections.discard(writer)
            writer.close()

    async def serve(self, socket_path: str, instance_id: str) -> None:
        start = getattr(self.module, "start", None)
        if start is not None:
            result = start(self.config)
            if inspect.isawaitable(result):
                await result
        if self.liveness is not None:
            self.liveness.start()
        server = await asyncio.start_unix_server(self.connection, path=socket_path)
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, stopping.set)
        control({"ready": instance_id, "pid": os.getpid()})
        await stopping.wait()
        server.close()  # no new connections; requests in flight finish
        await self.idle.wait()
        for writer in list(self.connections):  # idle keep-alive connections end cleanly
            writer.transport.abort()
        await asyncio.sleep(0.01)
        stop = getattr(self.module, "stop", None)
        if stop is not None:
            result = stop()
            if inspect.isawaitable(result):
                await result
        if self.liveness is not None:
            try:
                self.liveness.stop()
            except RetryableError:
                pass
        if self.store is not None:
            self.store.close()
