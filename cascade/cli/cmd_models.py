"""Commands for the model registry and the edge: list, show, release; run an edge agent, list the fleet."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Optional

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
             accelerator: str = "0", resources: dict[str, str] | None = None,
             edge: dict[str, Any] | None = None) -> None:
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
        if central and targets is None and not edge and traffic_after(desired, version, canary) == desired == \
                registry.traffic(LIVE, model):
            typer.echo(f"nothing to do: {model} already sends " +
                       ", ".join(f"{p}% to {v}" for v, p in sorted(desired.items())))
            return
        if accelerator != "0":
            parse(accelerator)  # a clear error now, not a failed deployment later
        event = registry.release(model, version, targets=targets, canary=canary, central=central,
                                 accelerator=accelerator, resources=resources, edge=edge)
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
    not_after: Annotated[Optional[str], typer.Option(
        help="Edge clusters that get the release after this instant (RFC 3339, or a duration from now such as "
             "PT6H) skip it.")] = None,
    wave: Annotated[Optional[list[str]], typer.Option(
        "--wave", help="A staged rollout over edge clusters: the clusters of one wave, comma-separated "
                       "(repeatable, in order; targeted clusters not named come last).")] = None,
    percent: Annotated[Optional[str], typer.Option(
        help="A staged rollout by cumulative share of the targeted edge clusters, e.g. 20,100.")] = None,
) -> None:
    """Release a version: publishes model.released (deployed centrally and on matching edge clusters)."""
    resources = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v}
    _command(model, version, canary, label, "released", accelerator, resources or None,
             _edge_options(not_after, wave, percent))


def _edge_options(not_after: str | None, wave: list[str] | None, percent: str | None) -> dict[str, Any] | None:
    """``notAfter`` and ``rollout`` of a release, checked here so a mistake is named before anything is sent."""
    from datetime import datetime, timedelta, timezone

    from cascade.events.durations import seconds

    out: dict[str, Any] = {}
    if not_after:
        try:
            when = (datetime.now(timezone.utc) + timedelta(seconds=seconds(not_after, "--not-after"))
                    if not_after.upper().startswith("P") else datetime.fromisoformat(not_after.replace("Z", "+00:00")))
        except (ValueError, CascadeError):
            fail(f"--not-after {not_after!r}: give an RFC 3339 time (2026-12-01T18:00:00Z) or a duration (PT6H)")
            raise
        out["notAfter"] = (when if when.tzinfo else when.replace(tzinfo=timezone.utc)).isoformat()
    if wave and percent:
        fail("a staged rollout takes --wave or --percent, not both")
    if wave:
        out["rollout"] = {"waves": [[c.strip() for c in w.split(",") if c.strip()] for w in wave]}
    elif percent:
        try:
            steps = [int(p) for p in percent.split(",")]
        except ValueError:
            steps = []
        if not steps or any(not 0 < p <= 100 for p in steps) or steps != sorted(steps):
            fail("--percent takes rising percentages between 1 and 100, e.g. 20,100")
        out["rollout"] = {"percent": steps}
    return out or None


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


def _labels(label: list[str] | None) -> dict[str, str]:
    labels: dict[str, str] = {}
    for item in label or []:
        for pair in item.split(","):
            key, sep, value = pair.partition("=")
            if not sep:
                fail(f"label {pair!r} is not k=v")
            labels[key.strip()] = value.strip()
    return labels


def _rate(text: str) -> float:
    """``500k`` / ``2M`` / ``1000`` bytes per second."""
    units = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}
    number, unit = text.rstrip("kKmMgGbB/s"), text[len(text.rstrip("kKmMgGbB/s")):].lower().rstrip("b/s")
    try:
        return float(number) * units[unit]
    except (ValueError, KeyError):
        fail(f"--max-rate {text!r}: bytes per second, e.g. 500k or 2M")
        raise


@edge_app.command("register")
def edge_register(
    cluster: str,
    label: Annotated[Optional[list[str]], typer.Option("--label", help="A label k=v (repeatable; k=v1,k2=v2 too).")]
    = None,
) -> None:
    """Register an edge cluster (again: a new credential replaces the old one) and print its credential, once.
    Give it to the cluster's agent in a file (--credential-file) or CASCADE_EDGE_CREDENTIAL."""
    from cascade.events.edge import Clusters

    try:
        typer.echo(Clusters(wiring.store(settings())).register(cluster, _labels(label)))
    except CascadeError as exc:
        fail(str(exc))


@edge_app.command("revoke")
def edge_revoke(cluster: str) -> None:
    """Revoke an edge cluster's credential: its stream ends and it is refused from then on."""
    from cascade.events.edge import Clusters

    try:
        Clusters(wiring.store(settings())).revoke(cluster)
    except CascadeError as exc:
        fail(str(exc))
    typer.echo(f"revoked {cluster}")


@edge_app.command("agent")
def edge_agent(
    cluster: Annotated[str, typer.Option(help="This edge cluster's id.")],
    label: Annotated[Optional[list[str]], typer.Option("--label", help="A label k=v (repeatable; k=v1,k2=v2 too).")] = None,
    bus: BusOption = None,
    port: Annotated[int, typer.Option(help="Port where this agent's models answer.")] = 8090,
    heartbeat: Annotated[float, typer.Option(help="Seconds between heartbeats.")] = 10.0,
    gateway: Annotated[Optional[str], typer.Option(
        help="Follow the gateway's release feed over HTTPS (https://host:port) instead of joining the bus.")] = None,
    credential_file: Annotated[Optional[Path], typer.Option(
        help="File holding the credential from `cascade edge register` (else CASCADE_EDGE_CREDENTIAL).")] = None,
    ca_file: Annotated[Optional[Path], typer.Option(help="CA certificate that signed the gateway's (PEM).")] = None,
    max_rate: Annotated[Optional[str], typer.Option(help="Bandwidth limit for artifact downloads, e.g. 2M (bytes/s).")]
    = None,
    target: Annotated[str, typer.Option(
        help="Where releases serve: local (this agent's runtime), kserve (InferenceServices) or deployment "
             "(a Deployment and a Service per model, without KServe) in the cluster KUBECONFIG names.")] = "local",
    smoke_input: Annotated[Optional[Path], typer.Option(
        help="This site's own smoke test: a JSON input (V1 instances list or V2 body) each release must answer "
             "before it takes traffic, instead of the release's sample.")] = None,
) -> None:
    """Run an edge agent: take the model releases meant for this cluster and serve them."""
    import os
    import signal
    import ssl
    from urllib.parse import urlparse

    from cascade.core.asgi import ServerThread
    from cascade.core.credentials import platform_token
    from cascade.serving.artifacts import ArtifactPolicy
    from cascade.serving.edge import EdgeAgent, RemoteLink
    from cascade.serving.runtime.activator import Runtime
    from cascade.serving.targets import DeployTarget
    from cascade.serving.targets.local import LocalTarget

    cfg = settings(bus=bus)
    labels = _labels(label)
    try:
        smoke = json.loads(smoke_input.read_text()) if smoke_input else None
    except (OSError, ValueError) as exc:
        fail(f"--smoke-input {smoke_input}: {exc}")
        raise
    home = cfg.home / "edge" / cluster
    home.mkdir(parents=True, exist_ok=True)
    link = None
    policy = ArtifactPolicy.from_settings(cfg)
    if gateway:
        secret = (credential_file.read_text().strip() if credential_file else
                  os.environ.get("CASCADE_EDGE_CREDENTIAL", "").strip())
        if not secret:
            fail("a remote agent needs its credential: --credential-file FILE or CASCADE_EDGE_CREDENTIAL "
                 "(from: cascade edge register CLUSTER)")
        if urlparse(gateway).scheme not in ("https", "http"):
            fail("--gateway is https://host:port")
        link = RemoteLink(gateway.rstrip("/"), secret, ssl.create_default_context(cafile=ca_file) if ca_file else True,
                          _rate(max_rate) if max_rate else 0.0)
        policy = ArtifactPolicy((*policy.roots, home / "cache"), (str(urlparse(gateway).hostname).lower(),))
    token = platform_token(home, create=True)  # this edge site's own credential for its runtime
    server = None
    deploy: DeployTarget
    if target in ("kserve", "deployment"):
        from cascade.serving.targets import open_target

        cfg.serving.target = target
        deploy = open_target(cfg)
        runtime_url = ""
    elif target == "local":
        from cascade.serving.runtime.activator import Runtime

        runtime = Runtime(home / "run", auth=wiring.authenticator(wiring.store(cfg), token),
                          tick=cfg.functions.tick_seconds, model_grace=cfg.serving.scale_to_zero_grace_seconds)
        try:
            server = ServerThread(wiring.guarded(cfg, runtime, "127.0.0.1"), "127.0.0.1", port, name="edge-runtime",
                                  header_timeout=cfg.security.header_timeout_seconds).start()
        except RuntimeError:
            fail(f"port {port} is in use")
            raise
        runtime_url = f"http://127.0.0.1:{port}"
        deploy = LocalTarget(runtime_url, home / "cache", policy, cfg.serving.annotations, token=token)
    else:
        fail(f"--target {target!r}: local, kserve or deployment")
        raise AssertionError
    agent = EdgeAgent(cluster, labels, home, deploy, policy, bus=None if link else wiring.bus(cfg),
                      topic=cfg.bus.topic, link=link, runtime_url=runtime_url, token=token, heartbeat=heartbeat,
                      smoke=smoke)
    signal.signal(signal.SIGTERM, lambda *_: agent.stop())
    typer.echo(f"edge agent {cluster} {labels} " + (f"following {gateway}" if link else "on the bus") +
               (f", serving on :{port}" if server else f", deploying to {target}"), err=True)
    try:
        agent.run()
    except KeyboardInterrupt:
        pass
    finally:
        if server is not None:
            server.stop()


@edge_app.command("ls")
def edge_ls() -> None:
    """Edge clusters: how each is reached, desired and actual versions, last contact, lag; staged rollouts."""
    import uuid

    from rich.table import Table

    from cascade.events.dispatcher.deadletters import read_to_end
    from cascade.events.edge import HEARTBEAT, Feed
    from cascade.serving.edge import fleet

    cfg = settings()
    beats = []  # agents on the bus say who they are there
    for record in read_to_end(wiring.bus(cfg), cfg.bus.topic, f"cascade-edge-ls-{uuid.uuid4().hex}", 30):
        try:
            event = record.event()
        except CascadeError:
            continue
        if event["type"] == HEARTBEAT:
            beats.append(event)
    feed = Feed(wiring.store(cfg))
    table = Table("cluster", "labels", "link", "desired", "serving", "last contact", "lag")
    for row in feed.fleet(fleet(beats)):
        table.add_row(row["cluster"], ",".join(f"{k}={v}" for k, v in row["labels"].items()), row["mode"],
                      ", ".join(f"{m}:{v}" for m, v in sorted(row["desired"].items())),
                      ", ".join(f"{m}:{v}" for m, v in sorted(row["serving"].items())),
                      str(row["lastContact"])[:19] or "never", "" if row["lag"] is None else str(row["lag"]))
    console().print(table)
    rollouts = feed.rollouts()
    if rollouts:
        waves = Table("release", "wave", "status", "waves", "reason")
        for r in sorted(rollouts, key=lambda r: str(r.get("started", ""))):
            waves.add_row(f"{r['model']} {r['version']}", f"{min(r['wave'] + 1, len(r['waves']))}/{len(r['waves'])}",
                          r["status"], " | ".join(",".join(w) for w in r["waves"]), r.get("reason", ""))
        console().print(waves)
