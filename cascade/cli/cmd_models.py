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


def _targets(label: list[str] | None) -> dict[str, dict[str, str]] | None:
    """``--label k=v ...`` as a release's ``targets`` selector (none: everywhere)."""
    if not label:
        return None
    if any("=" not in item for item in label):
        fail("--label takes k=v, e.g. --label region=eu")
    return {"matchLabels": dict(item.split("=", 1) for item in label)}


def _split(traffic: dict[str, int], version: str) -> str:
    return f"{traffic[version]}%" if version in traffic else ""


@models_app.command("ls")
def models_ls() -> None:
    """Models and their versions: stage, metrics, and traffic desired, recorded live, and serving now."""
    import httpx
    from rich.table import Table

    from cascade.core.credentials import auth_header, platform_token
    from cascade.serving.registry import DESIRED, LIVE, Registry

    cfg = settings()
    registry = Registry(wiring.store(cfg))
    try:  # the runtime's own routes, when it runs here
        serving = httpx.get(f"{cfg.runtime_url}/_runtime/models", headers=auth_header(platform_token(cfg.home)),
                            timeout=5).json() if cfg.serving.target == "local" else {}
    except (httpx.HTTPError, ValueError, OSError):
        serving = {}
    table = Table("model", "version", "stage", "format", "desired", "live", "serving", "metrics", "job")
    for model, versions in sorted(registry.models().items()):
        desired, live = registry.traffic(DESIRED, model), registry.traffic(LIVE, model)
        now = {str(r["version"]): int(r["percent"]) for r in serving.get(model, [])} if isinstance(serving, dict) else {}
        for v in sorted(versions, key=lambda r: version_key(r["version"])):
            version = str(v["version"])
            table.add_row(model, version, v.get("stage", ""), v.get("format", ""), _split(desired, version),
                          _split(live, version), _split(now, version) if serving else "?",
                          json.dumps(v.get("metrics", {}))[:40], str(v.get("lineage", {}).get("job", "")))
    console().print(table)


@models_app.command("show")
def models_show(model: str, version: str) -> None:
    """One version: artifact, checksum, lineage, metrics."""
    from cascade.serving.registry import Registry

    try:
        typer.echo(json.dumps(Registry(wiring.store(settings())).get(model, version), indent=2))
    except CascadeError as exc:
        fail(str(exc))


def _command(model: str, version: str, canary: int | None, label: list[str] | None, verb: str,
             accelerator: str = "0", resources: dict[str, str] | None = None) -> None:
    """Release ``version`` (``canary`` percent, or all): a command with an id of its own, so it always takes
    effect; one that asks for the split that is both desired and live already publishes nothing and says so."""
    from cascade.functions.models import Models
    from cascade.scheduling.accelerators import parse
    from cascade.serving.registry import DESIRED, LIVE, Registry, traffic_after

    cfg = settings()
    if canary is not None and not 0 < canary < 100:
        fail("--canary is a percent between 1 and 99 (a full release has no --canary)")
    targets = _targets(label)
    registry = Registry(wiring.store(cfg))
    central = Models.central_for(cfg, targets)
    try:
        record = registry.get(model, version)
        desired = registry.traffic(DESIRED, model)
        if verb == "rolled back" and version not in desired and record.get("stage") != "released":
            fail(f"{model} {version} was never released; roll back to a version that was (cascade models ls)")
        if central and targets is None and traffic_after(desired, version, canary) == desired == \
                registry.traffic(LIVE, model):
            typer.echo(f"nothing to do: {model} already sends " +
                       ", ".join(f"{p}% to {v}" for v, p in sorted(desired.items())))
            return
        if accelerator != "0":
            parse(accelerator)  # a clear error now, not a failed deployment later
        event = registry.release(model, version, targets=targets, canary=canary, central=central,
                                 accelerator=accelerator, resources=resources)
        wiring.bus(cfg).publish(cfg.bus.topic, event)
    except CascadeError as exc:
        fail(str(exc))
    typer.echo(f"{verb} {model} {version}" + (f" ({canary}% canary)" if canary is not None else "") +
               ("" if central else " to edge clusters only"))


CanaryOption = Annotated[Optional[int], typer.Option(help="Traffic percent for this version while the other one "
                                                     "stays live (1-99).")]
LabelOption = Annotated[Optional[list[str]], typer.Option("--label", help="Edge clusters to target, k=v (repeatable).")]


@models_app.command("release")
def models_release(
    model: str, version: str, canary: CanaryOption = None, label: LabelOption = None,
    accelerator: Annotated[str, typer.Option(help="Accelerator to serve on, as for jobs: 0, 1(T4), 0.5, 1(npu,910B).")]
    = "0",
    cpu: Annotated[Optional[str], typer.Option(help="CPU per serving replica on a cluster (e.g. 2, 500m).")] = None,
    memory: Annotated[Optional[str], typer.Option(help="Memory per serving replica on a cluster (e.g. 4Gi).")] = None,
) -> None:
    """Release a version: publishes model.released (deployed centrally and on matching edge clusters)."""
    resources = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v}
    _command(model, version, canary, label, "released", accelerator, resources or None)


@models_app.command("rollback")
def models_rollback(model: str, version: str, label: LabelOption = None) -> None:
    """Send all traffic back to VERSION, released before (the canary, or the newer version, stops serving)."""
    _command(model, version, None, label, "rolled back")


@models_app.command("undeploy")
def models_undeploy(model: str, version: str, label: LabelOption = None) -> None:
    """Withdraw VERSION: it stops taking traffic; the other live version, if any, takes all of it."""
    from cascade.events.envelope import new_event
    from cascade.functions.models import Models
    from cascade.serving.registry import DESIRED, LIVE, SOURCE, Registry

    cfg = settings()
    registry = Registry(wiring.store(cfg))
    targets = _targets(label)
    try:
        record = registry.get(model, version)
        if Models.central_for(cfg, targets):
            desired, live = registry.traffic(DESIRED, model), registry.traffic(LIVE, model)
            if version not in desired and version not in live and targets is None:
                typer.echo(f"nothing to do: {model} {version} takes no traffic")
                return
            rest = [v for v in desired if v != version]
            registry.set_traffic(DESIRED, model, {rest[0]: 100} if rest else {}, str(record.get("project") or "default"))
        data = {"model": model, "version": version, **({"targets": targets} if targets else {})}
        wiring.bus(cfg).publish(cfg.bus.topic, new_event("model.withdrawn", data, source=SOURCE, partitionkey=model,
                                                         subject=f"{model}:{version}",
                                                         extensions={"project": str(record.get("project") or "default")}))
    except CascadeError as exc:
        fail(str(exc))
    typer.echo(f"withdrew {model} {version}")


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
