"""Commands for the model registry and the edge: list, show, release; run an edge agent, list the fleet."""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer

from cascade.app import wiring
from cascade.cli.common import BusOption, app, console, fail, settings
from cascade.core.errors import CascadeError
from cascade.core.versions import version_key

models_app = typer.Typer(help="The model registry: versions, releases.", no_args_is_help=True)
app.add_typer(models_app, name="models")


@models_app.command("ls")
def models_ls() -> None:
    """Models and their versions with stage and metrics."""
    from rich.table import Table

    from cascade.serving.registry import Registry

    table = Table("model", "version", "stage", "format", "metrics", "job")
    for model, versions in sorted(Registry(wiring.store(settings())).models().items()):
        for v in sorted(versions, key=lambda r: version_key(r["version"])):
            table.add_row(model, str(v["version"]), v.get("stage", ""), v.get("format", ""),
                          json.dumps(v.get("metrics", {}))[:50], str(v.get("lineage", {}).get("job", "")))
    console().print(table)


@models_app.command("show")
def models_show(model: str, version: str) -> None:
    """One version: artifact, checksum, lineage, metrics."""
    from cascade.serving.registry import Registry

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
    from cascade.serving.registry import Registry

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
    bus: BusOption = None,
    port: Annotated[int, typer.Option(help="Port where this agent's models answer.")] = 8090,
    heartbeat: Annotated[float, typer.Option(help="Seconds between heartbeats.")] = 10.0,
) -> None:
    """Run an edge agent: take matching model.released events and serve them locally."""
    import signal

    from cascade.core.asgi import ServerThread
    from cascade.core.credentials import platform_token
    from cascade.serving.artifacts import ArtifactPolicy
    from cascade.serving.edge import EdgeAgent
    from cascade.serving.runtime.activator import Runtime

    cfg = settings(bus=bus)
    labels: dict[str, str] = {}
    for item in label or []:
        for pair in item.split(","):
            key, sep, value = pair.partition("=")
            if not sep:
                fail(f"label {pair!r} is not k=v")
            labels[key.strip()] = value.strip()
    home = cfg.home / "edge" / cluster
    home.mkdir(parents=True, exist_ok=True)
    the_bus = wiring.bus(cfg)
    token = platform_token(home, create=True)  # this edge site's own credential for its runtime
    runtime = Runtime(home / "run", auth=wiring.authenticator(wiring.store(cfg), token), tick=cfg.functions.tick_seconds,
                      model_grace=cfg.serving.scale_to_zero_grace_seconds)
    try:
        server = ServerThread(wiring.guarded(cfg, runtime, "127.0.0.1"), "127.0.0.1", port, name="edge-runtime",
                              header_timeout=cfg.security.header_timeout_seconds).start()
    except RuntimeError:
        fail(f"port {port} is in use")
        raise
    agent = EdgeAgent(cluster, labels, the_bus, cfg.bus.topic, home, runtime, f"http://127.0.0.1:{port}",
                      ArtifactPolicy.from_settings(cfg), token=token, heartbeat=heartbeat,
                      annotations=cfg.serving.annotations)
    signal.signal(signal.SIGTERM, lambda *_: agent.stop())
    typer.echo(f"edge agent {cluster} {labels} serving on :{port}", err=True)
    try:
        agent.run()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


@edge_app.command("ls")
def edge_ls() -> None:
    """Edge clusters: labels, last heartbeat, the versions they serve."""
    import uuid

    from rich.table import Table

    from cascade.events.dispatcher.deadletters import read_to_end
    from cascade.events.envelope import event_type
    from cascade.serving.edge import fleet

    cfg = settings()
    records = read_to_end(wiring.bus(cfg), cfg.bus.topic, f"cascade-edge-ls-{uuid.uuid4().hex}", 30)
    beats = []
    for r in records:
        try:
            event = r.event()
        except CascadeError:
            continue
        if event["type"] == event_type("edge.heartbeat"):
            beats.append(event)
    table = Table("cluster", "labels", "last heartbeat", "serving", "endpoint")
    for name, info in sorted(fleet(beats).items()):
        table.add_row(name, ",".join(f"{k}={v}" for k, v in info["labels"].items()), str(info["time"])[:19],
                      ", ".join(f"{m}:{v}" for m, v in info["serving"].items()), info.get("endpoint", ""))
    console().print(table)
