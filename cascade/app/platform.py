"""The platform in one process tree: gateway, dispatcher, function runtime, sources, dashboard.

``cascade up`` builds it from settings. The gateway, the runtime's activator (functions and
the inference gateway) and the dashboard are uvicorn servers in threads of their own (the
gateway also in worker processes on its socket: ``cascade.app.gateway_workers``); the
dispatcher, the folder source and the labelling reconciler are threads; function instances are processes forked from
per-function templates. Ctrl-C (or SIGTERM) stops the gateway and the folder source from
accepting, lets requests in flight finish, stops the dispatcher (unacknowledged events are
redelivered next time) and drains the instances.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
from dataclasses import dataclass, field
from typing import Any

from cascade.app import wiring
from cascade.app.dashboard import Dashboard
from cascade.app.gateway_workers import GATEWAY_GRACE, Pokes, Workers, listen, processes, share, tls
from cascade.core.asgi import ServerThread, wait_started
from cascade.core.credentials import auth_header, platform_token
from cascade.core.settings import Settings
from cascade.events.bus import EventBus
from cascade.events.dispatcher import Dispatcher
from cascade.events.gateway import create_app
from cascade.events.health import Health
from cascade.events.sources.folder import FolderSource
from cascade.events.sources.labelling import Reconciler
from cascade.events.triggers import Trigger, load_triggers
from cascade.functions.deploy import register
from cascade.functions.spec import FunctionSpec, discover
from cascade.functions.training.backends import open_backend
from cascade.functions.training.launcher import inventory
from cascade.functions.training.lint import Linter
from cascade.functions.training.policy import JobPolicy
from cascade.functions.training.watch import JobWatcher
from cascade.serving.artifacts import ArtifactPolicy
from cascade.serving.registry import Registry
from cascade.serving.runtime.activator import Runtime
from cascade.serving.targets import open_target
from cascade.stores import StateStore

log = logging.getLogger("cascade.platform")


def job_check(cfg: Settings, store: StateStore) -> Any:
    """What the gateway asks of every job it accepts: the backend's policy (refusals), then the resource
    checklist (warnings, or refusals where the project asks for them)."""
    policy, linter = JobPolicy.from_settings(cfg), Linter(inventory(cfg), store, cfg.training.queue)

    def check(kind: str, spec: dict[str, Any], project: str) -> list[str]:
        policy.check(kind, spec)
        return linter.check(kind, spec, project)
    return check


@dataclass
class Platform:
    cfg: Settings
    bus: EventBus
    state: StateStore
    functions: list[FunctionSpec]
    triggers: list[Trigger]
    token: str | None = None
    platform_token: str = ""
    servers: list[ServerThread] = field(default_factory=list)
    dispatcher: Dispatcher | None = None
    watcher: JobWatcher | None = None
    folder: FolderSource | None = None
    labelling: Reconciler | None = None
    dashboard: Dashboard | None = None
    gateway_workers: Workers | None = None
    pokes: Pokes | None = None

    @classmethod
    def build(cls, cfg: Settings) -> Platform:
        os.umask(0o077)  # state, bus log, artifacts, caches and logs: the platform's user only
        cfg.home.mkdir(parents=True, exist_ok=True)
        cfg.home.chmod(0o700)
        state, bus = wiring.store(cfg), wiring.bus(cfg)
        bus.ensure_topic(cfg.bus.topic)
        functions = discover(wiring.function_dirs(cfg))
        triggers = [t for f in functions for t in f.trigger_models()]
        triggers += load_triggers([p for p in cfg.dispatcher.triggers if p.exists()])
        return cls(cfg, bus, state, functions, triggers, token=wiring.bootstrap_default_project(cfg, state),
                   platform_token=platform_token(cfg.home, create=True))

    def _serve(self, app: Any, host: str, port: int, name: str, sock: socket.socket | None = None,
               tls: tuple[str, str] | None = None, graceful: int | None = None) -> None:
        self.servers.append(ServerThread(app, host, port, name=name, sock=sock, tls=tls, graceful=graceful,
                                         header_timeout=self.cfg.security.header_timeout_seconds).begin())

    def start(self, *, gateway: bool = True, runtime: bool = True, dispatcher: bool = True,
              dashboard: bool = True) -> None:
        cfg = self.cfg
        os.environ.update(cfg.export())  # function instances and job supervisors use the same bus and state
        auth = wiring.authenticator(self.state, self.platform_token)
        if dispatcher:  # a trigger new to this bus starts at now, not at whenever its group first joins
            for trigger in self.triggers:
                if trigger.start == "latest":
                    self.bus.seed_group(cfg.bus.topic, trigger.group(cfg.bus.topic))
        if runtime:
            rt = Runtime(cfg.home / "run", auth=auth, tick=cfg.functions.tick_seconds,
                         model_grace=cfg.serving.scale_to_zero_grace_seconds,
                         health=Health({"store": self.state.ping}))  # idempotent functions claim events there
            for spec in self.functions:
                register(rt, spec, state_url=cfg.state_url, scale_to_zero_grace=cfg.functions.scale_to_zero_grace_seconds,
                         queue_timeout=cfg.functions.queue_timeout_seconds, defaults=cfg.functions.annotations)
            self._serve(wiring.guarded(cfg, rt, cfg.functions.host), cfg.functions.host, cfg.functions.port, "runtime")
        if gateway:
            self.labelling = Reconciler(self.state, self.bus, cfg.bus.topic, interval=cfg.sources.reconcile_seconds)
            count = processes(cfg)
            shared = share(cfg, count) if count > 1 else cfg
            sock = listen(cfg.gateway.host, cfg.gateway.port) if count > 1 else None
            app = create_app(self.bus, self.state, shared.gateway, cfg.bus.topic, platform_token=self.platform_token,
                             check_job=job_check(cfg, self.state), hosts=cfg.allowed_hosts(cfg.gateway.host),
                             poke=self.labelling.poke, public_url=cfg.sources.public_url,
                             open_artifact=ArtifactPolicy.from_settings(cfg).local)
            self._serve(app, cfg.gateway.host, cfg.gateway.port, "gateway", sock, tls(cfg), GATEWAY_GRACE)
            if sock is not None:
                self.pokes = Pokes(self.labelling.poke)
                self.gateway_workers = Workers(shared, sock, count - 1, self.pokes).start()
            self.labelling.start()
            if cfg.sources.folder_enabled:
                self.folder = FolderSource(cfg.inbox, self.bus, self.state, topic=cfg.bus.topic,
                                           settle=cfg.sources.settle_seconds)
                threading.Thread(target=self.folder.run, name="folder-source", daemon=True).start()
        show = bool(dashboard and cfg.dashboard.port)
        # one training-backend client for the dashboard's job logs and the job watcher, only if either runs
        backend = open_backend(cfg, self.state) if show or dispatcher else None
        if show and backend is not None:
            self.dashboard = Dashboard(self.bus, self.state, cfg.bus.topic, self.triggers, cfg.runtime_url, auth,
                                       keep=cfg.dashboard.events, logs=backend.logs)
            self.dashboard.start()
            self._serve(wiring.guarded(cfg, self.dashboard.app(), cfg.gateway.host), cfg.gateway.host,
                        cfg.dashboard.port, "dashboard")
        try:
            wait_started(self.servers)
        except RuntimeError:
            self.stop()
            raise
        if dispatcher and backend is not None:
            self.watcher = JobWatcher(backend, self.bus, cfg.bus.topic, interval=cfg.training.watch_seconds)
            self.watcher.start()
        if runtime and cfg.serving.target == "local":
            threading.Thread(target=self.restore_models, name="restore-models", daemon=True).start()
        if dispatcher:
            self.dispatcher = Dispatcher(self.bus, self.state, self.triggers, topic=cfg.bus.topic,
                                         resolve=cfg.function_url, function_auth=auth_header(self.platform_token))
            self.dispatcher.start(metrics_port=cfg.dispatcher.metrics_port or None,
                                  metrics_host=cfg.dispatcher.metrics_host)

    def restore_models(self) -> list[str]:
        """Make every model the registry says is live serve again, with its split (a restart loses the runtime's
        model servers); returns the ``model:version`` that did not come back."""
        releases = Registry(self.state).live_releases()
        failed = open_target(self.cfg).restore(releases) if releases else []
        for name in failed:
            log.warning("model %s was live before the restart and did not load again", name)
        return failed

    def wait(self) -> None:
        """Block until SIGINT or SIGTERM."""
        done = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: done.set())
        signal.signal(signal.SIGINT, lambda *_: done.set())
        while not done.wait(0.5):
            if any(not s.alive for s in self.servers):
                break

    def _halt(self, names: tuple[str, ...]) -> None:
        picked = [s for s in self.servers if s.name in names]
        for server in picked:
            server.request_stop()
        for server in picked:
            server.stop()

    def stop(self) -> None:
        """Stop taking events and starting deliveries at once (whatever is on the bus and not acknowledged
        comes back after a restart), let what is in flight finish, then stop serving."""
        if self.dispatcher is not None:
            self.dispatcher.request_stop()
        if self.folder is not None:
            self.folder.stop()
        if self.gateway_workers is not None:
            for server in self.servers:
                if server.name == "gateway":
                    server.request_stop()
            self.gateway_workers.stop()
        self._halt(("gateway",))
        if self.pokes is not None:
            self.pokes.close()
        if self.labelling is not None:
            self.labelling.stop()
        if self.watcher is not None:
            self.watcher.stop()
        if self.dispatcher is not None:
            self.dispatcher.stop()
        self._halt(("runtime", "dashboard"))
        if self.dashboard is not None:
            self.dashboard.stop()
        self.bus.close()
