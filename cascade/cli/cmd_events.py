"""Commands of the event plane: emit, tail, sources, the dispatcher, triggers, dead letters."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

if TYPE_CHECKING:
    from cascade.core.settings import Settings

from cascade.app import wiring
from cascade.cli.common import TriggersOption, app, console, fail, gateway_call, load_data, settings
from cascade.core.errors import CascadeError

events_app = typer.Typer(help="Look at the events on the bus.", no_args_is_help=True)
sources_app = typer.Typer(help="Event sources that watch or pull.", no_args_is_help=True)
triggers_app = typer.Typer(help="Triggers: which events reach which subscriber.", no_args_is_help=True)
dlq_app = typer.Typer(help="Dead letters of a trigger.", no_args_is_help=True)
app.add_typer(events_app, name="events")
app.add_typer(sources_app, name="sources")
app.add_typer(triggers_app, name="triggers")
app.add_typer(dlq_app, name="dlq")

@app.command()
def emit(
    type: Annotated[str, typer.Argument(help="Event type or family, e.g. dataset.uploaded")],
    data: Annotated[str, typer.Option(help="JSON object, or @file.json")],
    source: Annotated[str, typer.Option(help="The event's source.")] = "/cascade/cli",
    key: Annotated[Optional[str], typer.Option(help="partitionkey (events with one key stay ordered).")] = None,
    gateway_url: Annotated[Optional[str], typer.Option("--gateway", help="Gateway URL.")] = None,
    token: Annotated[Optional[str], typer.Option(envvar="CASCADE_TOKEN", help="API token.")] = None,
    as_platform: Annotated[bool, typer.Option("--platform", help="Publish as the platform (its credential in "
                                              "CASCADE_HOME), for the platform's own event types.")] = False,
    project: Annotated[str, typer.Option(help="With --platform: the event's project.")] = "default",
) -> None:
    """Publish one event through the gateway (validated there, like any client's)."""
    import httpx

    from cascade.core.credentials import platform_token
    from cascade.events.bindings.http import to_binary
    from cascade.events.envelope import new_event

    cfg = settings()
    try:
        event = new_event(type, load_data(data), source=source, partitionkey=key,
                          extensions={"project": project} if as_platform else None)
    except CascadeError as exc:
        fail(f"{exc} (see schemas/ for each type's fields)")
        raise
    token = platform_token(cfg.home) if as_platform else (token or wiring.saved_token(cfg))
    if not token:
        fail("no platform credential in CASCADE_HOME: run `cascade up` there first" if as_platform else
             "no token: pass --token, set CASCADE_TOKEN, or run `cascade up` once to create one")
    url = gateway_url or cfg.gateway_url
    headers, body = to_binary(event)
    try:
        reply = httpx.post(f"{url}/events", headers={**headers, "authorization": f"Bearer {token}"}, content=body,
                           verify=cfg.gateway_verify)
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
    from cascade.events.sources.folder import FolderSource

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
    from cascade.events.sources.s3_kafka import S3KafkaSource

    cfg = settings()
    source = S3KafkaSource(wiring.bus(cfg), wiring.store(cfg), notifications=notifications, topic=cfg.bus.topic,
                           project=project)
    try:
        source.run()
    except KeyboardInterrupt:
        source.stop()


label_studio_app = typer.Typer(help="Label Studio projects that feed datasets.", no_args_is_help=True)
cvat_app = typer.Typer(help="CVAT projects or tasks that feed datasets.", no_args_is_help=True)
sources_app.add_typer(label_studio_app, name="label-studio")
sources_app.add_typer(cvat_app, name="cvat")
TokenOption = Annotated[Optional[str], typer.Option(envvar="CASCADE_TOKEN", help="API token (names the project).")]


def _secret(env: str, file: Optional[Path], prompt: str) -> str:
    """A secret from a file, the environment, or a hidden prompt: never from the command line."""
    if file is not None:
        try:
            return file.read_text().strip()
        except OSError as exc:
            fail(f"cannot read {file}: {exc.strerror}")
    return os.environ.get(env) or str(typer.prompt(prompt, hide_input=True))


def _connected(record: dict[str, Any]) -> None:
    typer.echo(f"connected {record['id']}: {record['tool']} {record['url']} project {record.get('task') or record['remote']}"
               f" -> dataset {record['dataset']} of project {record['project']} (webhook {record.get('webhook')})")


@label_studio_app.command("connect")
def label_studio_connect(
    url: Annotated[str, typer.Option(help="Label Studio's URL, e.g. http://localhost:8080.")],
    project_id: Annotated[int, typer.Option(help="The Label Studio project's id (in its URL: /projects/N).")],
    dataset: Annotated[str, typer.Option(help="The Cascade dataset the labels are for (training policies key on it).")],
    api_key_file: Annotated[Optional[Path], typer.Option(help="File holding Label Studio's access token; default: "
                                                         "$LABEL_STUDIO_API_KEY, else a hidden prompt.")] = None,
    token: TokenOption = None,
) -> None:
    """Feed DATASET from a Label Studio project: registers Cascade's webhook in Label Studio."""
    key = _secret("LABEL_STUDIO_API_KEY", api_key_file, "Label Studio access token")
    _connected(gateway_call("POST", "/v1/sources/label-studio", token,
                            json={"url": url, "apiKey": key, "projectId": project_id, "dataset": dataset}))


@cvat_app.command("connect")
def cvat_connect(
    url: Annotated[str, typer.Option(help="CVAT's URL, e.g. http://localhost:8080.")],
    username: Annotated[str, typer.Option(help="A CVAT user that sees the project and may add its webhooks.")],
    dataset: Annotated[str, typer.Option(help="The Cascade dataset the labels are for (training policies key on it).")],
    project_id: Annotated[Optional[int], typer.Option(help="The CVAT project's id.")] = None,
    task_id: Annotated[Optional[int], typer.Option(help="Or one CVAT task's id (its project gets the webhook).")] = None,
    password_file: Annotated[Optional[Path], typer.Option(help="File holding the user's password; default: "
                                                          "$CVAT_PASSWORD, else a hidden prompt.")] = None,
    token: TokenOption = None,
) -> None:
    """Feed DATASET from a CVAT project or task: registers a webhook with its own signing secret in CVAT."""
    password = _secret("CVAT_PASSWORD", password_file, "CVAT password")
    _connected(gateway_call("POST", "/v1/sources/cvat", token,
                            json={"url": url, "username": username, "password": password, "projectId": project_id,
                                  "taskId": task_id, "dataset": dataset}))


@sources_app.command("ls")
def sources_ls(token: TokenOption = None) -> None:
    """The connected labelling tools: which tool project feeds which dataset, and its last completion."""
    from rich.table import Table

    table = Table("id", "tool", "url", "tool project", "dataset", "project", "last completion", "error")
    for r in gateway_call("GET", "/v1/sources", token):
        table.add_row(r["id"], r["tool"], r["url"], str(r.get("task") or r["remote"]), r["dataset"], r["project"],
                      r.get("completed") or "-", r.get("error") or "")
    console().print(table)


@sources_app.command("disconnect")
def sources_disconnect(conn_id: str, token: TokenOption = None) -> None:
    """Remove a connection: its webhook in the tool, its token, its record."""
    reply = gateway_call("DELETE", f"/v1/sources/{conn_id}", token)
    typer.echo(f"disconnected {reply['id']}: {reply['note']}")


def _triggers(cfg: Settings, paths: list[Path] | None) -> list[Any]:
    from cascade.events.triggers import load_triggers

    try:
        return load_triggers(paths or [*wiring.function_dirs(cfg), *cfg.dispatcher.triggers])
    except CascadeError as exc:
        fail(f"{exc} (see docs/dispatcher.md for the trigger format)")
        raise


@app.command()
def dispatcher(
    triggers: TriggersOption = None,
    metrics_port: Annotated[Optional[int], typer.Option(help="Port for /metrics (0: none).")] = None,
) -> None:
    """Deliver events to the subscribers of every trigger until interrupted."""
    import signal
    import threading

    from cascade.events.dispatcher import Dispatcher

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
    triggers: TriggersOption = None,
) -> None:
    """Declared triggers with their delivery counts and lag."""
    from rich.table import Table

    from cascade.events.dispatcher.service import trigger_lag

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
    triggers: TriggersOption = None,
) -> None:
    """Dead letters of TRIGGER with their error code, destination and reason."""
    from rich.table import Table

    from cascade.events.dispatcher.deadletters import list_letters

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
    triggers: TriggersOption = None,
) -> None:
    """Send TRIGGER's dead letters to it again (each once), after fixing the subscriber."""
    from cascade.events.dispatcher.deadletters import replay

    cfg = settings()
    count = replay(wiring.bus(cfg), _trigger(cfg, trigger, triggers), cfg.bus.topic)
    typer.echo(f"replayed {count} dead letter(s) to {trigger}")
