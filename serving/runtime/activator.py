"""The runtime's front door: an ASGI app that routes ``/functions/{name}`` to services.

Plain ASGI (no framework) because it sits on every request: it reads the body, asks the
service for an instance slot (waiting while a cold service starts), proxies over the
instance's UNIX socket and streams the answer back. ``GET /_runtime/services`` reports
instance counts; a ticker drives every service's autoscaler.

Who may call what: the admin API (``/_runtime/...``) and direct function invocation take the
platform credential only (in a function's own pod, invocation is open: Knative delivers
there, and the service is cluster-local); inference takes a project token with the ``infer``
scope, for that project's models. ``/healthz`` and ``/readyz`` are open. Served behind
:class:`~cascade.core.httpguard.HTTPGuard` (hosts, body limit, control characters).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

from cascade import __version__
from cascade.core.errors import InvalidInput
from cascade.events.gateway.errors import problem
from cascade.events.health import Health
from cascade.events.identity import PLATFORM, Authenticator, Identity
from cascade.serving import openai
from cascade.serving.inference import ModelRoutes, Route, parse_path
from cascade.serving.runtime import http11
from cascade.serving.runtime.launcher import CommandLauncher, Launcher, TemplateLauncher, ZygoteLauncher, Zygotes
from cascade.serving.runtime.policy import ScalingPolicy
from cascade.serving.runtime.service import Overloaded, Service

log = logging.getLogger("cascade.runtime")
PLATFORMS = {"onnx": "onnxruntime_onnx", "torchscript": "pytorch_torchscript", "pytorch": "pytorch_torchscript",
             "pytorch-export": "pytorch_export", "huggingface": "transformers", "lora-adapter": "transformers",
             "sklearn": "sklearn", "xgboost": "xgboost"}  # V2 metadata "platform", as Triton names backends
_METADATA = re.compile(r"^/v2/models/[^/]+(/versions/[^/]+)?$")
SERVER_PATHS: dict[str, Any] = {
    "/v2/health/live": {"live": True}, "/v2/health/ready": {"ready": True},
    "/v2": {"name": "cascade", "version": __version__, "extensions": []}}
Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "upgrade"}


class Runtime:
    """Every scale-to-zero service of this machine, behind one activator."""

    def __init__(self, run_dir: Path, *, auth: Authenticator | None, tick: float = 0.2, model_grace: float = 30.0,
                 default_service: str | None = None, health: Health | None = None, open_functions: bool = False) -> None:
        """``auth`` None serves without authentication (only for a runtime embedded in a test or a benchmark)."""
        self.run_dir, self.tick_seconds = run_dir, tick
        self.services: dict[str, Service] = {}
        self._ticker: asyncio.Task[None] | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.models = ModelRoutes()
        self.model_grace = model_grace
        self.default_service = default_service  # in a pod of one function, every other path goes to it
        self.health = health or Health({})  # what /readyz checks (the state store of idempotent functions)
        self.auth, self.open_functions = auth, open_functions
        self.owners: dict[str, str] = {}  # model -> the project whose tokens may call it
        self.platforms: dict[str, str] = {}  # model server (service name) -> V2 metadata "platform"
        self.zygotes = Zygotes()  # one warm process per model format forks the model servers

    def _add(self, name: str, policy: ScalingPolicy, make: Callable[[Service], Launcher], **options: Any) -> Service:
        if name in self.services:
            raise ValueError(f"service {name!r} exists")
        service = Service(name, policy, self.run_dir / name, **options)
        service.launcher = make(service)
        self.services[name] = service
        return service

    def add_function(self, name: str, policy: ScalingPolicy, config: dict[str, Any], **options: Any) -> Service:
        """A Python handler module served by forked instances (see ``template``)."""
        return self._add(name, policy, lambda s: TemplateLauncher({**config, "name": name}, s.ready, s.exited),
                         **options)

    def add_command(self, name: str, policy: ScalingPolicy, argv: list[str], env: dict[str, str],
                    ready_path: str = "/v2/health/ready", **options: Any) -> Service:
        """Any HTTP server listening on ``$PORT``."""
        return self._add(name, policy, lambda s: CommandLauncher(argv, env, s.ready, s.exited, ready_path,
                                                                 log_dir=str(s.run_dir)), **options)

    def add_model_server(self, name: str, policy: ScalingPolicy, fmt: str, argv: list[str], env: dict[str, str],
                         ready_path: str, **options: Any) -> Service:
        """A model server (``cascade.serving.modelserver`` arguments) forked from the format's warm zygote."""
        return self._add(name, policy, lambda s: ZygoteLauncher(self.zygotes, fmt, argv, env, s.ready, s.exited,
                                                                ready_path, str(s.run_dir)), **options)

    async def remove(self, name: str) -> None:
        service = self.services.pop(name, None)
        if service is not None and service.launcher is not None:
            await service.launcher.close()

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        for service in self.services.values():
            assert service.launcher is not None
            await service.launcher.prepare()
            initial = max(service.policy.initial_scale, service.policy.min_scale)
            if service.policy.max_scale:
                initial = min(initial, service.policy.max_scale)
            if initial:
                await service.scale_to(initial)
        self._ticker = asyncio.create_task(self._tick_forever())

    def _versions(self, model: str) -> list[Service]:
        return [s for s in (self.services.get(r.service) for r in self.models.routes.get(model, [])) if s is not None]

    async def _wake(self, model: str, service: Service) -> None:
        """A call about to wake ``service`` from zero wakes the model's other versions too: the split would send
        its next calls there, each to a cold start of its own."""
        if service.live():
            return
        for sibling in self._versions(model):
            if sibling is not service and not sibling.live():
                sibling.autoscaler.last_active = time.monotonic()  # woken now: its grace starts now
                await sibling.scale_to(1)

    def _couple_versions(self) -> None:
        """The versions of a split model scale as one: a version stays warm while another version of its model
        is active (each autoscaler sees the model's last activity)."""
        for model in list(self.models.routes):
            services = self._versions(model)
            if len(services) > 1:
                active = max(s.autoscaler.last_active for s in services)
                for service in services:
                    service.autoscaler.last_active = max(service.autoscaler.last_active, active)

    async def _tick_forever(self) -> None:
        while True:
            await asyncio.sleep(self.tick_seconds)
            self._couple_versions()
            for service in list(self.services.values()):
                try:
                    await service.tick()
                except Exception:
                    log.exception("autoscaling %s failed", service.name)

    async def stop(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
        for service in self.services.values():
            await service.scale_to(0)
        deadline = asyncio.get_running_loop().time() + 30
        while any(s.instances for s in self.services.values()) and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        for service in self.services.values():
            assert service.launcher is not None
            await service.launcher.close()
        await self.zygotes.close()

    def status(self) -> list[dict[str, object]]:
        return [s.status() for s in self.services.values()]

    # -- models -------------------------------------------------------------------------
    async def models_api(self, scope: Scope, body: bytes, send: Send) -> None:
        """GET /_runtime/models; PUT /_runtime/models/{model}/versions/{version} (deploy, wait for load);
        DELETE .../versions/{version} (withdraw: the other version takes all the traffic)."""
        match = re.match(r"^/_runtime/models/([^/]+)/versions/([^/]+)$", scope["path"])
        if scope["method"] == "GET":
            await _json(send, 200, self.models.live())
        elif scope["method"] == "DELETE" and match:
            for service in self.models.withdraw(match[1], match[2]):
                if service in self.services:
                    await self.remove(service)
            if match[1] not in self.models.routes:
                self.owners.pop(match[1], None)
            await _json(send, 200, {"model": match[1], "routes": self.models.live().get(match[1], [])})
        elif scope["method"] == "PUT" and match:
            try:
                spec = json.loads(body)
                status, reply = await self.deploy_model(match[1], match[2], spec)
            except (ValueError, KeyError) as exc:
                status, reply = 400, {"error": "InvalidInput", "message": str(exc)}
            await _json(send, status, reply)
        else:
            await _json(send, 405, {"error": "MethodNotAllowed",
                                    "message": "GET /_runtime/models, or PUT or DELETE .../versions/V"})

    async def deploy_model(self, model: str, version: str, spec: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        name = re.sub(r"[^a-z0-9-]", "-", f"model-{model}-{version}".lower())
        current = self.models.pick(model, version)
        if current is None or name not in self.services:
            if name in self.services:
                await self.remove(name)
            if not isinstance(spec.get("artifact"), str) or not Path(spec["artifact"]).is_absolute():
                raise ValueError("artifact must be the absolute path of a verified local copy")
            policy = ScalingPolicy.from_annotations(spec.get("annotations", {}), scale_to_zero_grace=self.model_grace)
            fmt = str(spec["format"])
            if fmt not in PLATFORMS:
                raise ValueError(f"format {fmt!r} is not one the model server serves ({', '.join(PLATFORMS)})")
            argv = ["--name", model, "--artifact", spec["artifact"], "--format", fmt]
            self.platforms[name] = PLATFORMS.get(fmt, "")
            env = {"CASCADE_MODEL_VERSION": version}
            if spec.get("signature"):
                env["CASCADE_MODEL_SIGNATURE"] = json.dumps(spec["signature"])
            service = self.add_model_server(name, policy, fmt, argv, env, ready_path=f"/v2/models/{model}/ready")
            started = time.monotonic()
            service.hold(+1)  # the warm-up counts as a request: the autoscaler keeps the instance
            try:
                await service.scale_to(1)
                deadline = started + float(spec.get("timeoutSeconds", 120))
                while not any(i.state == "ready" for i in service.instances.values()):
                    if not service.instances or time.monotonic() > deadline:
                        logs = sorted(service.run_dir.glob("*.log"))
                        tail = logs[-1].read_text(errors="replace")[-1500:] if logs else ""
                        await self.remove(name)
                        return 422, {"error": "ModelLoadFailed", "message": f"{model} version {version} did not load",
                                     "log": tail, "serving": [r["version"] for r in self.models.live().get(model, [])]}
                    await asyncio.sleep(0.02)
            finally:
                service.hold(-1)
            load_seconds = time.monotonic() - started
        else:
            load_seconds = 0.0
        if spec.get("project"):
            self.owners[model] = str(spec["project"])
        for dropped in self.models.promote(model, Route(version, name, 100), spec.get("canaryTrafficPercent")):
            if dropped in self.services:
                await self.services[dropped].scale_to(0)
        return 200, {"model": model, "version": version, "service": name, "loadSeconds": round(load_seconds, 3),
                     "routes": self.models.live()[model]}

    # -- ASGI ---------------------------------------------------------------------------
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path: str = scope["path"]
        caller: Identity | None = None
        if path == "/healthz":
            await _json(send, 200, {"status": "ok"})
            return
        if path == "/readyz":
            ready, report = await asyncio.to_thread(self.health.report)
            await _json(send, 200 if ready else 503, report)
            return
        if path in SERVER_PATHS:  # the Open Inference Protocol's server health and metadata: open, like /healthz
            await _json(send, 200, SERVER_PATHS[path])
            return
        if path == "/v1/models":  # KServe V1: the models this caller may call
            caller = await self._caller(scope, receive, send, "infer")
            if caller is not None:
                await _json(send, 200, {"models": sorted(m for m in self.models.routes if caller.sees(self.owners.get(m)))})
            return
        if path in (openai.COMPLETIONS, openai.CHAT, openai.MODELS):
            await self._openai(scope, receive, send, path)
            return
        inference = parse_path(path)
        if inference is not None:
            caller = await self._caller(scope, receive, send, "infer")
            if caller is None:
                return
            if not caller.sees(self.owners.get(inference[0])):
                await _json(send, 404, {"error": "ModelNotFound", "message": f"no live model {inference[0]!r} "
                                        f"in project {caller.project!r}"})
                return
        elif self.open_functions and not path.startswith("/_runtime/"):
            pass  # a function's own pod: Knative delivers without credentials to a cluster-local service
        elif await self._caller(scope, receive, send, None, platform=True) is None:
            return
        if path == "/_runtime/services":
            await _json(send, 200, self.status())
            return
        if path.startswith("/_runtime/models"):
            await self.models_api(scope, await _body(receive), send)
            return
        parts = path.split("/", 3)  # "", "functions", name, rest
        if inference is not None:
            route = self.models.pick(*inference)
            if route is None:
                missing: dict[str, Any] = {"error": "ModelNotFound", "message": f"no live model {inference[0]!r}"
                                           + (f" version {inference[1]!r}" if inference[1] else "")}
                if caller is not None and caller.platform:  # a project token learns nothing of other projects'
                    missing["models"] = self.models.live()
                await _json(send, 404, missing)
                return
            if path.endswith(":explain"):
                await _json(send, 501, {"error": f"model {inference[0]!r} has no explainer"})
                return
            # each model server holds one version: a pinned version is routed here, not there
            service, upstream_path = self.services.get(route.service), re.sub(r"/versions/[^/]+", "", path)
            if service is not None:
                await self._wake(inference[0], service)
        else:
            live = len(parts) > 2 and parts[1] in ("functions", "services")
            service, upstream_path = (self.services.get(parts[2]) if live else None), "/" + (parts[3] if len(parts) > 3 else "")
            if not live and self.default_service:
                service, upstream_path = self.services.get(self.default_service), path
        if service is None:
            await _json(send, 404, {"error": "NotFound", "message": f"no service at {path}",
                                    "services": sorted(self.services)})
            return
        body = await _body(receive)
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]
                   if k.decode("latin-1") not in HOP_BY_HOP]
        if inference is not None and body and not any(k.lower() == "content-type" for k, _ in headers):
            # however the client labelled it (tritonclient sends none): the binary tensor extension, or JSON
            binary = any(k.lower() == "inference-header-content-length" for k, _ in headers)
            headers.append(("content-type", "application/octet-stream" if binary else "application/json"))
        if scope.get("query_string"):
            upstream_path += "?" + scope["query_string"].decode("latin-1")
        try:
            answer = await service.handle(scope["method"], upstream_path, headers, body)
        except Overloaded as exc:
            await _reply(send, 503, [(b"retry-after", b"1")], str(exc).encode())
            return
        status = int(answer.start.split(" ", 2)[1])
        if inference is not None and path.startswith("/v2/") and status == 422:  # FastAPI's shape -> the protocol's
            await _json(send, 400, {"error": f"malformed inference request: {_detail(answer.body)}"})
            return
        if inference is not None and status == 200 and scope["method"] == "GET" and _METADATA.match(path):
            await _json(send, 200, {**json.loads(answer.body), "platform": self.platforms.get(service.name, "")})
            return
        out = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in answer.headers if k not in HOP_BY_HOP]
        await _reply(send, status, out, answer.body)

    async def _openai(self, scope: Scope, receive: Receive, send: Send, path: str) -> None:
        """OpenAI-compatible text generation, routed by the body's ``model`` as V1/V2 calls are by their path; a
        streamed answer (Server-Sent Events) is passed on piece by piece as the model server writes it."""
        caller = await self._caller(scope, receive, send, "infer")
        if caller is None:
            return
        if path == openai.MODELS:
            await _json(send, 200, openai.model_list(sorted(
                (m, self.owners.get(m) or "default") for m in self.models.routes if caller.sees(self.owners.get(m)))))
            return
        if scope["method"] != "POST":
            await _json(send, 405, openai.error(f"{path} takes POST"))
            return
        body = await _body(receive)
        try:
            name = json.loads(body or b"{}").get("model")
        except (ValueError, AttributeError):
            name = None
        if not isinstance(name, str) or not name:
            await _json(send, 400, openai.error("model: the request names no model (a JSON body with \"model\")",
                                                "model"))
            return
        route = self.models.pick(name) if caller.sees(self.owners.get(name)) else None
        service = self.services.get(route.service) if route is not None else None
        if service is None:
            await _json(send, 404, openai.error(f"no live model {name!r} in project {caller.project!r}", "model",
                                                "not_found_error"))
            return
        await self._wake(name, service)
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]
                   if k.decode("latin-1") not in HOP_BY_HOP and k.decode("latin-1") != "content-type"]
        answer = service.stream("POST", path, [*headers, ("content-type", "application/json")], body)
        try:
            head = await anext(answer)
        except Overloaded as exc:
            await _reply(send, 503, [(b"retry-after", b"1")], str(exc).encode())
            return
        assert isinstance(head, http11.Message)
        await send({"type": "http.response.start", "status": http11.status_of(head),
                    "headers": [(k.encode("latin-1"), v.encode("latin-1")) for k, v in head.headers
                                if k not in HOP_BY_HOP]})
        async for piece in answer:
            if isinstance(piece, bytes) and piece:
                await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    async def _caller(self, scope: Scope, receive: Receive, send: Send, need: str | None, *,
                      platform: bool = False) -> Identity | None:
        """Who is calling, or None once a 401/403 has been answered (the gateway's error bodies)."""
        if self.auth is None:
            return PLATFORM
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        try:
            if platform:  # no store round trip: the platform credential or nothing
                return self.auth.require_platform(headers)
            return await asyncio.to_thread(self.auth.require, headers, need)
        except InvalidInput as exc:
            await problem(exc)(scope, receive, send)
            return None

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.start()
                except Exception as exc:
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.stop()
                await send({"type": "lifespan.shutdown.complete"})
                return


def _detail(body: bytes) -> str:
    """FastAPI's validation errors, as one line."""
    try:
        errors = json.loads(body).get("detail") or []
        return "; ".join(f"{'/'.join(str(p) for p in e.get('loc', []))}: {e.get('msg')}" for e in errors)[:500]
    except (ValueError, AttributeError):
        return body[:200].decode("utf-8", "replace")


async def _body(receive: Receive) -> bytes:
    chunks, more = [], True
    while more:
        message = await receive()
        chunks.append(message.get("body", b""))
        more = message.get("more_body", False)
    return b"".join(chunks)


async def _json(send: Send, status: int, body: Any) -> None:
    await _reply(send, status, [(b"content-type", b"application/json")], json.dumps(body).encode())


async def _reply(send: Send, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [*headers, (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
