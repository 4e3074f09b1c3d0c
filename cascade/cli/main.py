"""The ``cascade`` command line: run the platform's parts and talk to a running one.

This module holds the platform-wide commands (up, demo, gateway, runtime, render, projects,
tokens); the plane-specific ones live in ``cmd_*`` modules, imported here so they register.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

if TYPE_CHECKING:
    from cascade.core.settings import Settings

from cascade import __version__
from cascade.app import wiring
from cascade.cli.common import BusOption, StateOption, app, fail, settings
from cascade.core.errors import CascadeError

__all__ = ["app"]  # the console script's entry point: cascade.cli.main:app

projects_app = typer.Typer(help="Projects (one namespace, quota and set of tokens each).", no_args_is_help=True)
tokens_app = typer.Typer(help="API tokens of a project.", no_args_is_help=True)
app.add_typer(projects_app, name="projects")
app.add_typer(tokens_app, name="tokens")


WorkersOption = Annotated[Optional[int], typer.Option(help="Gateway processes sharing its port (default: one per "
                                                             "CPU core).", min=1)]


@app.command()
def version() -> None:
    """Print Cascade's version."""
    typer.echo(__version__)


@app.command()
def up(
    host: Annotated[Optional[str], typer.Option(help="Address to listen on.")] = None,
    port: Annotated[Optional[int], typer.Option(help="Gateway port.")] = None,
    bus: BusOption = None,
    state: StateOption = None,
    backend: Annotated[Optional[str], typer.Option(help="Where training jobs run: local or kubernetes.")] = None,
    workers: WorkersOption = None,
) -> None:
    """Run the platform on this machine: gateway, dispatcher, functions, inference, watched folder, dashboard."""
    cfg = settings(bus=bus, state=state)
    if backend not in (None, "local", "kubernetes"):
        fail(f"--backend must be local or kubernetes, not {backend!r}")
    cfg.training.backend = backend or cfg.training.backend
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg.gateway.host = host or cfg.gateway.host
    cfg.gateway.port = port or cfg.gateway.port
    cfg.gateway.workers = workers or cfg.gateway.workers
    platform = _build(cfg)
    import os

    if os.geteuid() == 0 and not cfg.training.run_as:
        typer.secho("warning: running as root; local jobs and model servers run as root too. Set training.run_as "
                    "(CASCADE_TRAINING__RUN_AS=nobody) to run them unprivileged.", fg=typer.colors.YELLOW, err=True)
    try:
        platform.start()
    except RuntimeError as exc:
        fail(str(exc))
    typer.secho(f"Cascade {__version__} is up", fg=typer.colors.GREEN, bold=True)
    from cascade.app.gateway_workers import processes

    typer.echo(f"  gateway     {cfg.gateway_url}  (OpenAPI: /docs; {processes(cfg)} process(es))")
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
    bus: BusOption = None,
    state: StateOption = None,
) -> None:
    """Drive the whole story against a running `cascade up` (same --bus and --state), printing a timeline."""
    from cascade.cli import demo as story

    cfg = settings(bus=bus, state=state)
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
    from cascade.app.platform import Platform

    try:
        return Platform.build(cfg)
    except CascadeError as exc:
        fail(f"{exc} (for Kafka and Redis: scripts/services.sh start)")


@app.command()
def gateway(workers: WorkersOption = None) -> None:
    """Serve only the event gateway (webhooks, /events, /v1/jobs)."""
    cfg = settings()
    cfg.gateway.workers = workers or cfg.gateway.workers
    platform = _build(cfg)
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
    from cascade.events.identity import Projects

    try:
        Projects(wiring.store(settings())).create_project(name)
    except CascadeError as exc:
        fail(str(exc))
    typer.echo(f"project {name} created; make a token with: cascade tokens create {name}")


@projects_app.command("lint")
def projects_lint(
    name: str,
    refuse: Annotated[bool, typer.Option("--refuse/--warn", help="Refuse jobs the resource checklist flags, or only "
                                                                 "warn (the default).")] = False,
) -> None:
    """Choose what the resource checklist does with a project's jobs: warn, or refuse."""
    from cascade.events.identity import Projects

    try:
        Projects(wiring.store(settings())).set_lint(name, "refuse" if refuse else "warn")
    except CascadeError as exc:
        fail(str(exc))
    typer.echo(f"project {name}: the resource checklist {'refuses' if refuse else 'warns about'} flagged jobs")


@projects_app.command("ls")
def projects_ls() -> None:
    """List projects, with each one's tokens and their scopes."""
    from cascade.events.identity import Projects

    projects = Projects(wiring.store(settings()))
    for project in projects.list_projects():
        tokens = projects.tokens(project["name"])
        scopes = sorted({s for t in tokens for s in t.get("scopes", [])})
        typer.echo(f"{project['name']}\t{len(tokens)} token(s)\tscopes: {', '.join(scopes) or '-'}")


@tokens_app.command("create")
def tokens_create(
    project: str,
    description: Annotated[str, typer.Option(help="What the token is for.")] = "",
    scope: Annotated[Optional[list[str]], typer.Option(
        "--scope", help="publish, submit, read or infer (repeatable; default: all four).")] = None,
) -> None:
    """Create an API token for PROJECT; it is printed once and stored only as a hash."""
    from cascade.events.identity import SCOPES, Projects

    try:
        typer.echo(Projects(wiring.store(settings())).create_token(project, description, scope or SCOPES))
    except CascadeError as exc:
        fail(str(exc))


@tokens_app.command("ls")
def tokens_ls(project: Annotated[Optional[str], typer.Argument(help="Only this project's tokens.")] = None) -> None:
    """List tokens (their ids, never the tokens): project, scopes, description, created."""
    from cascade.events.identity import Projects

    for t in Projects(wiring.store(settings())).tokens(project):
        typer.echo(f"{t['id']}\t{t['project']}\t{','.join(t.get('scopes', []))}\t{t.get('created', '')[:19]}"
                   f"\t{t.get('description', '')}")


@tokens_app.command("revoke")
def tokens_revoke(token_id: Annotated[str, typer.Argument(help="The id `cascade tokens ls` shows.")]) -> None:
    """Revoke a token: every server refuses it within a few seconds (their caches expire)."""
    from cascade.events.identity import Projects

    try:
        record = Projects(wiring.store(settings())).revoke(token_id)
    except CascadeError as exc:
        fail(str(exc))
        raise
    typer.echo(f"revoked token {token_id} of project {record['project']}")


@app.command()
def render(
    out: Annotated[Path, typer.Option(help="Folder that holds knative/ and images/.")] = Path("."),
    check: Annotated[bool, typer.Option(help="Write nothing; exit 1 when the files differ from a fresh render.")] = False,
) -> None:
    """Regenerate knative/ (kustomize base and example overlay) and images/ (layered Dockerfiles, build matrix)."""
    from cascade.functions.spec import discover
    from cascade.render import images, manifests

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


# The plane-specific commands register themselves on ``app`` (after these, so help lists these first).
from cascade.cli import cmd_events, cmd_experiments, cmd_functions, cmd_jobs, cmd_models, cmd_nodes  # noqa: E402, F401
