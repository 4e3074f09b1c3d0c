"""The ``cascade`` command line: run the platform's parts and talk to a running one."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from cascade import __version__
from cascade.cli import wiring
from cascade.core.errors import CascadeError
from cascade.core.settings import Settings

app = typer.Typer(help="Cascade: event-driven, serverless ML.", no_args_is_help=True,
                  pretty_exceptions_enable=False)
projects_app = typer.Typer(help="Projects (one namespace, quota and set of tokens each).", no_args_is_help=True)
tokens_app = typer.Typer(help="API tokens of a project.", no_args_is_help=True)
events_app = typer.Typer(help="Look at the events on the bus.", no_args_is_help=True)
app.add_typer(projects_app, name="projects")
app.add_typer(tokens_app, name="tokens")
sources_app = typer.Typer(help="Event sources that watch or pull.", no_args_is_help=True)
triggers_app = typer.Typer(help="Triggers: which events reach which subscriber.", no_args_is_help=True)
dlq_app = typer.Typer(help="Dead letters of a trigger.", no_args_is_help=True)
app.add_typer(triggers_app, name="triggers")
app.add_typer(dlq_app, name="dlq")
app.add_typer(events_app, name="events")
app.add_typer(sources_app, name="sources")


def fail(message: str, code: int = 2) -> None:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code)


def console() -> Any:
    """A rich console; when output is piped, wide enough that tables are not cut."""
    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() else 240, highlight=False)


def settings() -> Settings:
    try:
        return Settings()
    except Exception as exc:  # pydantic's message names the bad variable
        fail(f"bad configuration: {exc}")
        raise


@app.command()
def version() -> None:
    """Print Cascade's version."""
    typer.echo(__version__)


@app.command()
def up(
    host: Annotated[Optional[str], typer.Option(help="Address to listen on.")] = None,
    port: Annotated[Optional[int], typer.Option(help="Gateway port.")] = None,
    bus: Annotated[Optional[str], typer.Option(help="kafka://HOST:PORT (default: embedded SQLite log).")] = None,
    state: Annotated[Optional[str], typer.Option(help="redis://HOST:PORT/DB (default: SQLite).")] = None,
    backend: Annotated[Optional[str], typer.Option(help="Where training jobs run: local or kubernetes.")] = None,
) -> None:
    """Run the platform on this machine: gateway, dispatcher, functions, inference, watched folder, dashboard."""
    cfg = settings()
    cfg.bus.url = bus or cfg.bus.url
    cfg.state.url = state or cfg.state.url
    if backend not in (None, "local", "kubernetes"):
        fail(f"--backend must be local or kubernetes, not {backend!r}")
    cfg.training.backend = backend or cfg.training.backend
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg.gateway.host = host or cfg.gateway.host
    cfg.gateway.port = port or cfg.gateway.port
    platform = _build(cfg)
    try:
        platform.start()
    except RuntimeError as exc:
        fail(str(exc))
    typer.secho(f"Cascade {__version__} is up", fg=typer.colors.GREEN, bold=True)
    typer.echo(f"  gateway     http://{cfg.gateway.host}:{cfg.gateway.port}  (OpenAPI: /docs)")
    typer.echo(f"  functions   http://{cfg.functions.host}:{cfg.functions.port}/functions/<name>  "
               f"({len(platform.functions)} function(s))")
    typer.echo(f"  inference   http://{cfg.functions.host}:{cfg.functions.port}/v1/models/<name>:predict  (and /v2)")
    typer.echo(f"  dispatcher  {len(platform.triggers)} trigger(s); metrics on :{cfg.dispatcher.metrics_port}")
    if platform.dashboard is not None:
        typer.echo(f"  dashboard   http://{cfg.gateway.host}:{cfg.dashboard.port}/")
    if platform.folder is not None:
        typer.echo(f"  inbox       {cfg.inbox}/<dataset>/<file>  (files become dataset.uploaded)")
    typer.echo(f"  training    {cfg.training.backend} backend")
    typer.echo(f"  bus         {cfg.bus_url}")
    typer.echo(f"  state       {cfg.state_url}")
    if platform.token:
        typer.echo(f"  token       {platform.token}  (project 'default'; saved to {wiring.token_path(cfg)})")
    try:
        platform.wait()
    finally:
        typer.echo("stopping: draining requests and instances")
        platform.stop()


@app.command()
def demo(
    timeout: Annotated[float, typer.Option(help="Seconds any one step may take.")] = 600,
    token: Annotated[Optional[str], typer.Option(envvar="CASCADE_TOKEN", help="API token (default: the saved one).")] = None,
    bus: Annotated[Optional[str], typer.Option(help="The bus `cascade up` runs on (kafka://HOST:PORT).")] = None,
    state: Annotated[Optional[str], typer.Option(help="The state store `cascade up` runs on (redis://...).")] = None,
) -> None:
    """Drive the whole story against a running `cascade up` (same --bus and --state), printing a timeline."""
    from cascade.cli import demo as story

    cfg = settings()
    cfg.bus.url = bus or cfg.bus.url
    cfg.state.url = state or cfg.state.url
    token = token or wiring.saved_token(cfg)
    if not token:
        fail("no token: run `cascade up` first (it saves one), or pass --token")
    try:
        timeline = story.run(cfg, wiring.bus(cfg), wiring.store(cfg), str(token), typer.echo, timeout)
    except (story.DemoFailed, CascadeError) as exc:
        fail(f"demo failed: {exc}", code=1)
        raise
    typer.secho(f"demo complete: {len(timeline.rows)} steps in {timeline.rows[-1][0]:.1f}s", fg=typer.colors.GREEN,
                bold=True)


def _build(cfg: Settings) -> Any:
    from cascade.cli.platform import Platform

    try:
        return Platform.build(cfg)
    except CascadeError as exc:
        fail(f"{exc} (for Kafka and Redis: scripts/services.sh start)")


@app.command()
def gateway() -> None:
    """Serve only the event gateway (webhooks, /events, /v1/jobs)."""
    platform = _build(settings())
    platform.start(runtime=False, dispatcher=False, dashboard=False)
    try:
        platform.wait()
    finally:
        platform.stop()


@app.command()
def runtime() -> None:
    """Serve only the function runtime (activator and autoscaler) for the functions found."""
    platform = _build(settings())
    platform.start(gateway=False, dispatcher=False, dashboard=False)
    try:
        platform.wait()
    finally:
        platform.stop()


@projects_app.command("create")
def projects_create(name: str) -> None:
    """Create a project."""
    from events.gateway.tokens import Projects

    try:
        Projects(wiring.store(settings())).create_project(name)
    except CascadeError as exc:
        fail(str(exc))
    typer.echo(f"project {name} created; make a token with: cascade tokens create {name}")


@projects_app.command("ls")
def projects_ls() -> None:
    """List projects."""
    from events.gateway.tokens import Projects

    for project in Projects(wiring.store(settings())).list_projects():
        typer.echo(project["name"])


@tokens_app.command("create")
def tokens_create(project: str, description: Annotated[str, typer.Option(help="What the token is for.")] = "") -> None:
    """Create an API token for PROJECT; it is printed once and stored only as a hash."""
    from events.gateway.tokens import Projects

    try:
        typer.echo(Projects(wiring.store(settings())).create_token(project, description))
    except CascadeError as exc:
        fail(str(exc))


def _load_data(data: str) -> Any:
    text = Path(data[1:]).read_text() if data.startswith("@") else data
    try:
        return json.loads(text)
    except ValueError as exc:
        fail(f"--data is not JSON ({exc}); pass a JSON object or @file.json")


@app.command()
def emit(
    type: Annotated[str, typer.Argument(help="Event type or family, e.g. dataset.uploaded")],
    data: Annotated[str, typer.Option(help="JSON object, or @file.json")],
    source: Annotated[str, typer.Option(help="The event's source.")] = "/cascade/cli",
    key: Annotated[Optional[str], typer.Option(help="partitionkey (events with one key stay ordered).")] = None,
    gateway_url: Annotated[Optional[str], typer.Option("--gateway", help="Gateway URL.")] = None,
    token: Annotated[Optional[str], typer.Option(envvar="CASCADE_TOKEN", help="API token.")] = None,
) -> None:
    """Publish one event through the gateway (validated there, like any client's)."""
    import httpx

    from events.bindings.http import to_binary
    from events.envelope import new_event

    cfg = settings()
    try:
        event = new_event(type, _load_data(data), source=source, partitionkey=key)
    except CascadeError as exc:
        fail(f"{exc} (see schemas/ for each type's fields)")
        raise
    token = token or wiring.saved_token(cfg)
    if not token:
        fail("no token: pass --token, set CASCADE_TOKEN, or run `cascade up` once to create one")
    url = gateway_url or f"http://{cfg.gateway.host}:{cfg.gateway.port}"
    headers, body = to_binary(event)
    try:
        reply = httpx.post(f"{url}/events", headers={**headers, "authorization": f"Bearer {token}"}, content=body)
    except httpx.HTTPError as exc:
        fail(f"cannot reach the gateway at {url} ({exc}); is `cascade up` running?")
        raise
    if reply.status_code != 202:
        fail(f"{reply.status_code}: {reply.text}")
    typer.echo(f"published {event['type']} id={event['id']}")


@events_app.command("tail")
def events_tail(
    type: Annotated[Optional[list[str]], typer.Option("--type", help="Only these types (prefix match).")] = None,
    from_beginning: Annotated[bool, typer.Option(help="Start at the oldest event.")] = False,
    count: Annotated[int, typer.Option(help="Stop after this many events (0: never).")] = 0,
) -> None:
    """Show events as they land on the bus."""
    import uuid

    cfg = settings()
    out = console()
    consumer = wiring.bus(cfg).subscribe([cfg.bus.topic], f"cascade-tail-{os.getpid()}-{uuid.uuid4().hex[:6]}",
                                         start="earliest" if from_beginning else "latest")
    shown = 0
    try:
        while not count or shown < count:
            for record in consumer.poll(0.5):
                consumer.ack(record)
                try:
                    event = record.event()
                except CascadeError as exc:
                    out.print(f"[red]undecodable record {record.partition}/{record.offset}: {exc}[/red]")
                    continue
                short = str(event["type"]).removeprefix("io.cascade.")
                if type and not any(short.startswith(t) or event["type"].startswith(t) for t in type):
                    continue
                out.print(f"[dim]{event.get('time', '')}[/dim] [bold cyan]{short}[/bold cyan] "
                              f"[yellow]{event.get('subject') or event.get('partitionkey') or ''}[/yellow] "
                              f"{json.dumps(event.get_data(), separators=(',', ':'))[:200]}")
                shown += 1
    except KeyboardInterrupt:
        pass
    finally:
        consumer.close()


@sources_app.command("folder")
def sources_folder(
    path: Path,
    project: Annotated[str, typer.Option(help="Project the events belong to.")] = "default",
    settle: Annotated[float, typer.Option(help="Seconds a file must stay unchanged to count as complete.")] = 1.0,
) -> None:
    """Watch PATH and publish dataset.uploaded for every completed file (PATH/<dataset>/...)."""
    from events.sources.folder import FolderSource

    cfg = settings()
    source = FolderSource(path, wiring.bus(cfg), wiring.store(cfg), topic=cfg.bus.topic, project=project, settle=settle)
    typer.echo(f"watching {source.root} -> {cfg.bus.topic}")
    try:
        source.run()
    except KeyboardInterrupt:
        source.stop()


@sources_app.command("s3-kafka")
def sources_s3_kafka(
    notifications: Annotated[str, typer.Option(help="Kafka topic MinIO publishes bucket notifications to.")],
    project: Annotated[str, typer.Option(help="Project the events belong to.")] = "default",
) -> None:
    """Turn S3 notifications on a Kafka topic into dataset.uploaded events."""
    from events.sources.s3_kafka import S3KafkaSource

    cfg = settings()
    source = S3KafkaSource(wiring.bus(cfg), wiring.store(cfg), notifications=notifications, topic=cfg.bus.topic,
                           project=project)
    try:
        source.run()
    except KeyboardInterrupt:
        source.stop()


def _triggers(cfg: Settings, paths: list[Path] | None) -> list[Any]:
    from events.triggers import load_triggers

    try:
        return load_triggers(paths or [*wiring.function_dirs(cfg), *cfg.dispatcher.triggers])
    except CascadeError as exc:
        fail(f"{exc} (see docs/dispatcher.md for the trigger format)")
        raise


@app.command()
def dispatcher(
    triggers: Annotated[Optional[list[Path]], typer.Option("--triggers", help="Trigger files or folders.")] = None,
    metrics_port: Annotated[Optional[int], typer.Option(help="Port for /metrics (0: none).")] = None,
) -> None:
    """Deliver events to the subscribers of every trigger until interrupted."""
    import signal
    import threading

    from events.dispatcher import Dispatcher

    cfg = settings()
    found = _triggers(cfg, triggers)
    port = cfg.dispatcher.metrics_port if metrics_port is None else metrics_port
    service = Dispatcher(wiring.bus(cfg), wiring.store(cfg), found, topic=cfg.bus.topic,
                         resolve=cfg.function_url)
    service.start(metrics_port=port or None)
    typer.echo(f"dispatching {len(found)} trigger(s) from {cfg.bus.topic}" + (f"; metrics on :{port}" if port else ""))
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    try:
        done.wait()
    except KeyboardInterrupt:
        pass
    finally:
        service.stop()


@triggers_app.command("ls")
def triggers_ls(
    triggers: Annotated[Optional[list[Path]], typer.Option("--triggers", help="Trigger files or folders.")] = None,
) -> None:
    """Declared triggers with their delivery counts and lag."""
    from rich.table import Table

    from events.dispatcher.service import trigger_lag

    cfg = settings()
    bus, state = wiring.bus(cfg), wiring.store(cfg)
    table = Table("trigger", "subscriber", "ordering", "filters", "delivered", "retried", "dead", "in flight", "lag")
    for t in _triggers(cfg, triggers):
        stats = state.get_record("trigger-stats", t.name) or {}
        table.add_row(t.name, t.subscriber, t.ordering, json.dumps(t.filters)[:40],
                      *(str(stats.get(k, 0)) for k in ("delivered", "retried", "dead_lettered", "in_flight")),
                      str(trigger_lag(bus, t, cfg.bus.topic)))
    console().print(table)


def _trigger(cfg: Settings, name: str, paths: list[Path] | None) -> Any:
    for t in _triggers(cfg, paths):
        if t.name == name:
            return t
    fail(f"no trigger named {name!r}; list them with: cascade triggers ls")


@dlq_app.command("ls")
def dlq_ls(
    trigger: str,
    triggers: Annotated[Optional[list[Path]], typer.Option("--triggers", help="Trigger files or folders.")] = None,
) -> None:
    """Dead letters of TRIGGER with their error code, destination and reason."""
    from rich.table import Table

    from events.dispatcher.deadletters import list_letters

    cfg = settings()
    letters = list_letters(wiring.bus(cfg), _trigger(cfg, trigger, triggers))
    table = Table("offset", "id", "type", "code", "attempts", "error")
    for letter in letters:
        s = letter.summary()
        table.add_row(s["offset"], s["id"], s["type"], s["code"], s["attempts"], s["error"])
    console().print(table)
    typer.echo(f"{len(letters)} dead letter(s); send them again with: cascade dlq replay {trigger}")


@dlq_app.command("replay")
def dlq_replay(
    trigger: str,
    triggers: Annotated[Optional[list[Path]], typer.Option("--triggers", help="Trigger files or folders.")] = None,
) -> None:
    """Send TRIGGER's dead letters to it again (each once), after fixing the subscriber."""
    from events.dispatcher.deadletters import replay

    cfg = settings()
    count = replay(wiring.bus(cfg), _trigger(cfg, trigger, triggers), cfg.bus.topic)
    typer.echo(f"replayed {count} dead letter(s) to {trigger}")


functions_app = typer.Typer(help="Functions: handlers that scale to zero.", no_args_is_help=True)
app.add_typer(functions_app, name="functions")

FUNC_YAML = """name: {name}
module: handler
triggers:
- name: {name}
  filters:
  - exact: {{type: io.cascade.dataset.uploaded.v1}}
annotations:
  autoscaling.knative.dev/min-scale: "0"
  autoscaling.knative.dev/max-scale: "10"
  autoscaling.knative.dev/target: "10"
containerConcurrency: 0
resources: {{accelerator: "0", cpu: "1", memory: 512Mi}}
env: {{}}
secrets: []
"""

HANDLER = '''"""{name}: what this function does, and for which events."""

from __future__ import annotations

from typing import Any

from cloudevents.http import CloudEvent


def start(config: dict[str, Any]) -> None:
    """Runs once per instance, before the first event (open clients, load models)."""


def handle(event: CloudEvent) -> None | CloudEvent | list[CloudEvent]:
    """Handle one event; return nothing, or events to publish as the reply."""
    print(f"{name}: {{event['type']}} {{event['id']}}", flush=True)
    return None
'''


@functions_app.command("new")
def functions_new(
    name: str,
    directory: Annotated[Optional[Path], typer.Option("--dir", help="Parent folder (default: the first functions path).")] = None,
) -> None:
    """Scaffold a function: NAME/func.yaml and NAME/handler.py."""
    import re

    if not re.match(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$", name):
        fail(f"function name {name!r} must be lowercase letters, digits and '-' (a Knative Service name)")
    cfg = settings()
    target = (directory or cfg.function_paths[0]) / name
    if target.exists():
        fail(f"{target} exists; pick another name or remove it")
    target.mkdir(parents=True)
    (target / "func.yaml").write_text(FUNC_YAML.format(name=name))
    (target / "handler.py").write_text(HANDLER.format(name=name))
    typer.echo(f"created {target}/func.yaml and handler.py; `cascade up` serves it at "
               f"http://{cfg.functions.host}:{cfg.functions.port}/functions/{name}")


@functions_app.command("serve")
def functions_serve(
    name: Annotated[str, typer.Argument(envvar="CASCADE_FUNCTION", help="The function (default: $CASCADE_FUNCTION).")],
    port: Annotated[int, typer.Option(envvar="PORT", help="Port to listen on (Knative sets $PORT).")] = 8080,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "0.0.0.0",
) -> None:
    """Serve one function at / (the function-runtime image's command in a Knative Service's pod)."""
    import uvicorn

    from functions.deploy import register
    from functions.spec import discover
    from serving.runtime.activator import Runtime

    cfg = settings()
    specs = {s.name: s for s in discover(wiring.function_dirs(cfg))}
    if name not in specs:
        fail(f"no function {name!r}; found: {', '.join(sorted(specs)) or 'none'}")
    runtime = Runtime(cfg.home / "run", tick=cfg.functions.tick_seconds, default_service=name)
    # Knative scales the pods; inside one, a single warm instance serves.
    spec = specs[name]
    pinned = spec.model_copy(update={"annotations": {**spec.annotations, "autoscaling.knative.dev/min-scale": "1",
                                                     "autoscaling.knative.dev/max-scale": "1"}})
    register(runtime, pinned, state_url=cfg.state_url, queue_timeout=cfg.functions.queue_timeout_seconds)
    uvicorn.run(runtime, host=host, port=port, log_level="warning")


@functions_app.command("ls")
def functions_ls() -> None:
    """Functions found, their triggers and live instances (when the runtime is up)."""
    import httpx
    from rich.table import Table

    from functions.spec import discover

    cfg = settings()
    try:
        specs = discover(wiring.function_dirs(cfg))
    except CascadeError as exc:
        fail(str(exc))
        raise
    try:
        live = {s["name"]: s for s in httpx.get(
            f"http://{cfg.functions.host}:{cfg.functions.port}/_runtime/services", timeout=2).json()}
    except (httpx.HTTPError, ValueError):
        live = {}
    table = Table("function", "triggers", "min", "max", "instances", "in flight", "path")
    for spec in specs:
        s = live.get(spec.name)
        instances = "-" if s is None else f"{s['ready']} ready, {s['starting']} starting"
        ann = spec.annotations
        table.add_row(spec.name, ", ".join(t["name"] for t in spec.triggers),
                      ann.get("autoscaling.knative.dev/min-scale", "0"), ann.get("autoscaling.knative.dev/max-scale", "0"),
                      instances, "-" if s is None else str(s["inflight"]), str(spec.path))
    console().print(table)
    if not live:
        typer.echo("(runtime not reachable: instance counts need `cascade up`)")


@app.command()
def render(
    out: Annotated[Path, typer.Option(help="Folder that holds knative/ and images/.")] = Path("."),
    check: Annotated[bool, typer.Option(help="Write nothing; exit 1 when the files differ from a fresh render.")] = False,
) -> None:
    """Regenerate knative/ (kustomize base and example overlay) and images/ (layered Dockerfiles, build matrix)."""
    from cascade.cli import images, manifests
    from functions.spec import discover

    try:
        specs = discover(wiring.function_dirs(settings()))
    except CascadeError as exc:
        fail(str(exc))
        raise
    texts = {**manifests.render(specs, out / "knative"), **images.render(out / "images")}
    folders = [out / "knative", out / "images"]
    if check:
        stale = manifests.stale(texts, folders)
        if stale:
            fail("out of date (run `cascade render`): " + ", ".join(map(str, stale)), code=1)
        return
    for path in manifests.write(texts, folders):
        typer.echo(f"wrote {path}")


jobs_app = typer.Typer(help="Training jobs: submit, follow, cancel.", no_args_is_help=True)
app.add_typer(jobs_app, name="jobs")


def _gateway_call(method: str, path: str, token: str | None, **kwargs: Any) -> Any:
    import httpx

    cfg = settings()
    token = token or wiring.saved_token(cfg)
    if not token:
        fail("no token: pass --token, set CASCADE_TOKEN, or run `cascade up` once to create one")
    url = f"http://{cfg.gateway.host}:{cfg.gateway.port}{path}"
    try:
        reply = httpx.request(method, url, headers={"authorization": f"Bearer {token}"}, timeout=30, **kwargs)
    except httpx.HTTPError as exc:
        fail(f"cannot reach the gateway at {url} ({exc}); is `cascade up` running?")
        raise
    if reply.status_code >= 400:
        fail(f"{reply.status_code}: {reply.text}")
    return reply.json()


@jobs_app.command("submit")
def jobs_submit(
    spec: Annotated[str, typer.Option(help="The job spec: JSON, or @file.json (see schemas/trainingjob.v1.json).")],
    kind: Annotated[str, typer.Option(help="training or finetune.")] = "training",
    wait: Annotated[bool, typer.Option(help="Follow the job until it ends.")] = False,
    token: Annotated[Optional[str], typer.Option(envvar="CASCADE_TOKEN", help="API token.")] = None,
) -> None:
    """Submit a job through the gateway (it becomes a job.submitted event)."""
    reply = _gateway_call("POST", "/v1/jobs", token, json={"kind": kind, "spec": _load_data(spec)})
    typer.echo(f"submitted {reply['jobId']}")
    if wait:
        _follow(reply["jobId"], token)


def _follow(job_id: str, token: str | None) -> None:
    import time

    from rich.live import Live

    last = None
    with Live(console=console(), refresh_per_second=4) as live:
        while True:
            job = _gateway_call("GET", f"/v1/jobs/{job_id}", token)
            status = job.get("status")
            if status != last:
                live.console.print(f"{job_id}: {status}" + (f" ({job['reason']})" if job.get("reason") else ""))
                last = status
            if status in ("succeeded", "failed", "cancelled"):
                if job.get("metrics"):
                    live.console.print(f"metrics: {json.dumps(job['metrics'])}")
                if status != "succeeded":
                    raise typer.Exit(1)
                return
            time.sleep(0.5)


@jobs_app.command("ls")
def jobs_ls(
    status: Annotated[Optional[str], typer.Option(help="Only jobs in this status.")] = None,
    token: Annotated[Optional[str], typer.Option(envvar="CASCADE_TOKEN", help="API token.")] = None,
) -> None:
    """Jobs of the token's project."""
    from rich.table import Table

    table = Table("job", "kind", "framework", "status", "submitted", "metrics")
    for job in _gateway_call("GET", "/v1/jobs" + (f"?status={status}" if status else ""), token):
        table.add_row(job["id"], job.get("kind", ""), str((job.get("spec") or {}).get("framework", "")), job["status"],
                      job.get("submitted", "")[:19], json.dumps(job.get("metrics", {}))[:60])
    console().print(table)


def _backend(cfg: Settings) -> Any:
    from functions.training.launcher import backend_for

    return backend_for(cfg, wiring.store(cfg))


@jobs_app.command("logs")
def jobs_logs(job_id: str) -> None:
    """The job's worker logs."""
    try:
        typer.echo(_backend(settings()).logs(job_id))
    except CascadeError as exc:
        fail(str(exc))


@jobs_app.command("cancel")
def jobs_cancel(job_id: str) -> None:
    """Stop a running job; it ends as job.cancelled."""
    try:
        _backend(settings()).cancel(job_id)
    except CascadeError as exc:
        fail(str(exc))
    typer.echo(f"cancelling {job_id}")


@jobs_app.command("policy")
def jobs_policy(
    dataset: str,
    spec: Annotated[str, typer.Option(help="Training spec to run when DATASET's labels are completed (JSON or @file).")],
    project: Annotated[str, typer.Option(help="Project of the jobs.")] = "default",
) -> None:
    """Attach a training policy to a dataset: labels.completed for it submits a job."""
    from functions.training.launcher import set_policy

    cfg = settings()
    try:
        set_policy(wiring.store(cfg), dataset, _load_data(spec), project)
    except CascadeError as exc:
        fail(str(exc))
    typer.echo(f"labels.completed for {dataset} now trains that spec")


models_app = typer.Typer(help="The model registry: versions, releases.", no_args_is_help=True)
app.add_typer(models_app, name="models")


@models_app.command("ls")
def models_ls() -> None:
    """Models and their versions with stage and metrics."""
    from rich.table import Table

    from serving.registry import Registry

    table = Table("model", "version", "stage", "format", "metrics", "job")
    for model, versions in sorted(Registry(wiring.store(settings())).models().items()):
        for v in sorted(versions, key=lambda r: str(r["version"]).zfill(8)):
            table.add_row(model, str(v["version"]), v.get("stage", ""), v.get("format", ""),
                          json.dumps(v.get("metrics", {}))[:50], str(v.get("lineage", {}).get("job", "")))
    console().print(table)


@models_app.command("show")
def models_show(model: str, version: str) -> None:
    """One version: artifact, checksum, lineage, metrics."""
    from serving.registry import Registry

    try:
        typer.echo(json.dumps(Registry(wiring.store(settings())).get(model, version), indent=2))
    except CascadeError as exc:
        fail(str(exc))


@models_app.command("release")
def models_release(
    model: str,
    version: str,
    canary: Annotated[Optional[int], typer.Option(help="Traffic percent for this version while the previous one is live.")] = None,
    label: Annotated[Optional[list[str]], typer.Option("--label", help="Edge clusters to target, k=v (repeatable).")] = None,
) -> None:
    """Release a version: publishes model.released (deployed centrally and on matching edge clusters)."""
    from serving.registry import Registry

    cfg = settings()
    targets = {"matchLabels": dict(item.split("=", 1) for item in label)} if label else None
    try:
        event = Registry(wiring.store(cfg)).release(model, version, targets=targets, canary=canary)
        wiring.bus(cfg).publish(cfg.bus.topic, event)
    except CascadeError as exc:
        fail(str(exc))
    typer.echo(f"released {model} {version}" + (f" ({canary}% canary)" if canary is not None else ""))


edge_app = typer.Typer(help="Edge clusters that deploy model releases themselves.", no_args_is_help=True)
app.add_typer(edge_app, name="edge")


@edge_app.command("agent")
def edge_agent(
    cluster: Annotated[str, typer.Option(help="This edge cluster's id.")],
    label: Annotated[Optional[list[str]], typer.Option("--label", help="A label k=v (repeatable; k=v1,k2=v2 too).")] = None,
    bus: Annotated[Optional[str], typer.Option(help="Bus URL (kafka://HOST:PORT); default: the configured bus.")] = None,
    port: Annotated[int, typer.Option(help="Port where this agent's models answer.")] = 8090,
    heartbeat: Annotated[float, typer.Option(help="Seconds between heartbeats.")] = 10.0,
) -> None:
    """Run an edge agent: take matching model.released events and serve them locally."""
    import signal
    import threading
    import time

    import uvicorn

    from serving.edge import EdgeAgent
    from serving.runtime.activator import Runtime

    cfg = settings()
    labels: dict[str, str] = {}
    for item in label or []:
        for pair in item.split(","):
            key, sep, value = pair.partition("=")
            if not sep:
                fail(f"label {pair!r} is not k=v")
            labels[key.strip()] = value.strip()
    home = cfg.home / "edge" / cluster
    home.mkdir(parents=True, exist_ok=True)
    from events.bus import open_bus

    the_bus = open_bus(bus or cfg.bus_url, partitions=cfg.bus.partitions, session_timeout=cfg.bus.session_timeout)
    runtime = Runtime(home / "run", tick=cfg.functions.tick_seconds, model_grace=cfg.serving.scale_to_zero_grace_seconds)
    server = uvicorn.Server(uvicorn.Config(runtime, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            fail(f"port {port} is in use")
        time.sleep(0.02)
    agent = EdgeAgent(cluster, labels, the_bus, cfg.bus.topic, home, runtime, f"http://127.0.0.1:{port}",
                      heartbeat=heartbeat, annotations=cfg.serving.annotations)
    signal.signal(signal.SIGTERM, lambda *_: agent.stop())
    typer.echo(f"edge agent {cluster} {labels} serving on :{port}", err=True)
    try:
        agent.run()
    except KeyboardInterrupt:
        pass
    finally:
        server.should_exit = True
        thread.join(60)


@edge_app.command("ls")
def edge_ls() -> None:
    """Edge clusters: labels, last heartbeat, the versions they serve."""
    import uuid

    from rich.table import Table

    from events.dispatcher.deadletters import read_to_end
    from serving.edge import fleet

    cfg = settings()
    records = read_to_end(wiring.bus(cfg), cfg.bus.topic, f"cascade-edge-ls-{uuid.uuid4().hex}", 30)
    beats = []
    for r in records:
        try:
            event = r.event()
        except CascadeError:
            continue
        if event["type"] == "io.cascade.edge.heartbeat.v1":
            beats.append(event)
    table = Table("cluster", "labels", "last heartbeat", "serving", "endpoint")
    for name, info in sorted(fleet(beats).items()):
        table.add_row(name, ",".join(f"{k}={v}" for k, v in info["labels"].items()), str(info["time"])[:19],
                      ", ".join(f"{m}:{v}" for m, v in info["serving"].items()), info.get("endpoint", ""))
    console().print(table)
