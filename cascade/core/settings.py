"""Cascade's settings, one group per plane, each field documented where it is declared.

Values come from (highest first) keyword arguments, ``CASCADE_*`` environment variables
(nested with ``__``, e.g. ``CASCADE_GATEWAY__PORT=8080``), a YAML file named by
``CASCADE_CONFIG``, and the defaults below, which are the embedded laptop setup: SQLite bus
and state under ``CASCADE_HOME`` (``./.cascade``).
"""

from __future__ import annotations

import os
import ssl
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, Field
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict


class GatewaySettings(BaseModel):
    host: str = "127.0.0.1"
    """Address the gateway listens on."""
    port: int = 8070
    """Port of the event gateway (webhooks, /events, /v1/jobs)."""
    max_body_bytes: int = 1 << 20
    """Largest request body accepted; larger ones get HTTP 413."""
    rate_per_second: float = 1000.0
    """Events a project may publish per second (token bucket refill rate)."""
    burst: int = 2000
    """Token bucket size: how many events a project may send at once."""
    cvat_secret: str = ""
    """Shared secret CVAT signs webhook bodies with (X-Signature-256); empty disables /webhooks/cvat."""
    workers: int = 0
    """Gateway processes sharing its port (``cascade up --workers``); 0: one per core this process may use (its
    CPU affinity, capped by a container's CPU limit). Each takes its share of every project's rate limit."""
    tls_cert_file: Path | None = None
    """PEM certificate (its chain after it) the gateway serves HTTPS with, as edge sites reach it across the
    internet; unset: plain HTTP (a local platform, or TLS ended by an ingress in front)."""
    tls_key_file: Path | None = None
    """The certificate's private key (PEM); readable by the platform's user only."""
    dedup_capacity: int = 100_000
    """Webhook deliveries remembered per project (a ring: the oldest is forgotten only after this many newer
    ones), so a retried delivery is not published twice however late it comes."""


class BusSettings(BaseModel):
    url: str = ""
    """``kafka://host:port`` or ``embedded:///path/bus.db``; empty means ``embedded://CASCADE_HOME/bus.db``."""
    topic: str = "cascade.events"
    """The broker topic every event is published to (Knative's Kafka Broker also uses one)."""
    partitions: int = 4
    """Partitions of topics Cascade creates."""
    session_timeout: float = 10.0
    """Seconds after which a consumer that stopped heartbeating loses its partitions."""


class FunctionSettings(BaseModel):
    paths: list[Path] = Field(default_factory=list)
    """Folders searched for functions (a folder with func.yaml); empty means CASCADE_HOME/functions."""
    host: str = "127.0.0.1"
    """Address of the function runtime's activator."""
    port: int = 8071
    """Port of the activator: functions answer at /functions/<name>."""
    scale_to_zero_grace_seconds: float = 30.0
    """Knative's scale-to-zero-grace-period: how long an idle service keeps its last instance."""
    queue_timeout_seconds: float = 300.0
    """How long a request may wait for an instance (cold start included) before a 503."""
    tick_seconds: float = 0.2
    """How often the autoscaler decides."""
    annotations: dict[str, str] = Field(default_factory=dict)
    """Autoscaling annotations for every function that does not set them (Knative's config-autoscaler)."""


class DispatcherSettings(BaseModel):
    triggers: list[Path] = Field(default_factory=list)
    """Extra files or folders with triggers (*.triggers.yaml); the functions' func.yaml are always read."""
    function_url: str = ""
    """Where a trigger whose subscriber is a function name delivers ({name} is replaced); empty: the local runtime."""
    metrics_port: int = 8072
    """Port of the dispatcher's Prometheus /metrics (0 disables it)."""
    metrics_host: str = "127.0.0.1"
    """Address of the dispatcher's /metrics and /readyz (loopback unless a scraper elsewhere needs it)."""


class TrainingSettings(BaseModel):
    backend: str = "local"
    """Where jobs run: ``local`` (processes on this machine) or ``kubernetes`` (operator resources)."""
    inventory: Path | None = None
    """Accelerator inventory (YAML flavors and queues); empty means this machine: one CPU node."""
    queue: str = "default"
    """The inventory queue jobs are placed through."""
    namespace_prefix: str = ""
    """Kubernetes namespace of a project's jobs: prefix + project name."""
    artifacts: Path | None = None
    """Artifact root of the local backend; empty means CASCADE_HOME/artifacts."""
    watch_seconds: float = 10.0
    """How often ``cascade up`` compares unfinished jobs with where they run and publishes what changed."""
    workspaces: Path | None = None
    """Local backend: a job's ``entrypoint.script`` is a path inside ``<workspaces>/<project>``; empty: CASCADE_HOME/workspaces."""
    modules: list[str] = Field(default_factory=lambda: ["cascade.functions.finetune.entrypoint"])
    """Local backend: the modules an ``entrypoint.module`` may name (a trailing ``.*`` allows a package)."""
    max_workers: int = 64
    """Most workers one job may ask for."""
    max_procs_per_worker: int = 16
    """Most processes per worker one job may ask for."""
    max_retries: int = 5
    """Most restarts one job may ask for."""
    default_timeout_seconds: int = 86400
    """Wall-clock limit of a job that sets none; also the most one may set."""
    run_as: str = ""
    """When the platform runs as root: the unprivileged user local jobs and model servers run as (e.g. ``nobody``).

    That user needs read access to the workspaces; each job's output folder is handed to it."""


class ServingSettings(BaseModel):
    target: str = "local"
    """Where released models are deployed: ``local`` (model servers behind the runtime), ``kserve``
    (InferenceServices) or ``deployment`` (a Deployment and a Service per model, for clusters without KServe)."""
    storage_initializer: str = "kserve/storage-initializer:v0.15.2"
    """The image that fetches an artifact into a ``deployment`` target's pods (KServe's storage initializer)."""
    scale_to_zero_grace_seconds: float = 30.0
    """How long an idle model server keeps its last instance."""
    cache: Path | None = None
    """Artifact cache, by sha256; empty means CASCADE_HOME/cache/models."""
    annotations: dict[str, str] = Field(default_factory=dict)
    """Knative autoscaling annotations for model servers (e.g. a shorter window)."""
    cluster_labels: dict[str, str] = Field(default_factory=lambda: {"cascade.io/cluster": "central"})
    """The central deployment's labels: a release whose ``targets`` do not select them (one aimed at edge
    clusters only) is not deployed centrally; a release without ``targets`` goes everywhere."""


class SourceSettings(BaseModel):
    folder: Path | None = None
    """Watched folder ``cascade up`` announces files from (``<folder>/<dataset>/<file>``); empty: CASCADE_HOME/inbox."""
    folder_enabled: bool = True
    """Whether ``cascade up`` watches the folder at all."""
    settle_seconds: float = 1.0
    """How long a file's size and mtime must stay unchanged before it is announced."""
    reconcile_seconds: float = 60.0
    """How often each connected labelling tool is asked for its completion, so a webhook it never sent (Label
    Studio does not retry) still completes."""
    public_url: str = ""
    """The gateway's URL as labelling tools reach it, for the webhooks ``cascade sources ... connect`` registers;
    empty: http://<gateway host>:<gateway port>."""


class DashboardSettings(BaseModel):
    port: int = 8073
    """Port of the live dashboard ``cascade up`` serves (0 disables it); it listens on the gateway's host."""
    events: int = 200
    """How many recent events the dashboard keeps."""


class SecuritySettings(BaseModel):
    allowed_hosts: list[str] = Field(default_factory=list)
    """Host names every server answers besides loopback and its listen address (``*``: any; DNS rebinding)."""
    max_body_bytes: int = 1 << 20
    """Largest request body the runtime and dashboard accept (the gateway has its own limit)."""
    header_timeout_seconds: float = 10.0
    """A connection whose request head has not arrived after this long is closed."""
    artifact_hosts: list[str] = Field(default_factory=list)
    """Hosts ``http(s)://`` model artifacts may be fetched from (no redirects elsewhere); empty: none."""
    artifact_roots: list[Path] = Field(default_factory=list)
    """Folders ``file://`` artifacts may come from besides the artifact root."""


class StateSettings(BaseModel):
    url: str = ""
    """``redis://host:port/db`` or ``sqlite:///path/state.db``; empty means SQLite under CASCADE_HOME."""


class Settings(BaseSettings):
    """Everything configurable, grouped by plane."""

    model_config = SettingsConfigDict(env_prefix="CASCADE_", env_nested_delimiter="__", extra="ignore")

    home: Path = Path(".cascade")
    """Where embedded data lives: bus log, state, artifacts, function sources."""
    gateway: GatewaySettings = Field(default_factory=GatewaySettings)
    bus: BusSettings = Field(default_factory=BusSettings)
    state: StateSettings = Field(default_factory=StateSettings)
    dispatcher: DispatcherSettings = Field(default_factory=DispatcherSettings)
    functions: FunctionSettings = Field(default_factory=FunctionSettings)
    training: TrainingSettings = Field(default_factory=TrainingSettings)
    serving: ServingSettings = Field(default_factory=ServingSettings)
    sources: SourceSettings = Field(default_factory=SourceSettings)
    dashboard: DashboardSettings = Field(default_factory=DashboardSettings)
    security: SecuritySettings = Field(default_factory=SecuritySettings)

    @property
    def model_cache(self) -> Path:
        return (self.serving.cache or self.home / "cache" / "models").resolve()

    @property
    def gateway_url(self) -> str:
        scheme = "https" if self.gateway.tls_cert_file else "http"
        return f"{scheme}://{self.gateway.host}:{self.gateway.port}"

    @property
    def gateway_verify(self) -> ssl.SSLContext | bool:
        """What a local client trusts for the gateway's certificate: the certificate itself (self-signed or with
        its chain) when the gateway serves HTTPS."""
        return ssl.create_default_context(cafile=self.gateway.tls_cert_file) if self.gateway.tls_cert_file else True

    @property
    def runtime_url(self) -> str:
        return f"http://{self.functions.host}:{self.functions.port}"

    @property
    def artifact_root(self) -> Path:
        return (self.training.artifacts or self.home / "artifacts").resolve()

    def export(self) -> dict[str, str]:
        """The effective bus, state and home as CASCADE_* variables, for child processes."""
        return {"CASCADE_HOME": str(self.home.resolve()), "CASCADE_BUS__URL": self.bus_url,
                "CASCADE_STATE__URL": self.state_url, "CASCADE_BUS__TOPIC": self.bus.topic,
                "CASCADE_FUNCTIONS__PORT": str(self.functions.port), "CASCADE_FUNCTIONS__HOST": self.functions.host,
                "CASCADE_TRAINING__BACKEND": self.training.backend}

    @property
    def workspaces(self) -> Path:
        return (self.training.workspaces or self.home / "workspaces").resolve()

    def allowed_hosts(self, listen: str) -> list[str]:
        from cascade.core.httpguard import allowed_hosts

        return allowed_hosts(listen, self.security.allowed_hosts)

    @property
    def inbox(self) -> Path:
        return (self.sources.folder or self.home / "inbox").resolve()

    @property
    def function_paths(self) -> list[Path]:
        return self.functions.paths or [self.home / "functions"]

    def function_url(self, name: str) -> str:
        template = self.dispatcher.function_url or f"http://{self.functions.host}:{self.functions.port}/functions/{{name}}"
        return template.format(name=name)


    @property
    def bus_url(self) -> str:
        return self.bus.url or f"embedded://{(self.home / 'bus.db').resolve()}"

    @property
    def state_url(self) -> str:
        return self.state.url or f"sqlite://{(self.home / 'state.db').resolve()}"

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, _YamlSource(settings_cls))


class _YamlSource(PydanticBaseSettingsSource):
    """Reads the YAML file named by ``CASCADE_CONFIG`` (if any)."""

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        path = os.environ.get("CASCADE_CONFIG")
        if not path:
            return {}
        data = yaml.safe_load(Path(path).read_text()) or {}
        if not isinstance(data, dict):
            raise ValueError(f"{path}: the configuration file must be a YAML mapping")
        return data
