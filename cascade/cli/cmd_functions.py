"""Commands for functions: scaffold one, serve one in a pod, list them with their instances."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from cascade.app import wiring
from cascade.cli.common import app, console, fail, settings
from cascade.core.credentials import platform_token
from cascade.core.errors import CascadeError
from cascade.serving.runtime.admin import runtime_admin

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

    from cascade.functions.deploy import register
    from cascade.functions.spec import discover
    from cascade.serving.runtime.activator import Runtime

    cfg = settings()
    specs = {s.name: s for s in discover(wiring.function_dirs(cfg))}
    if name not in specs:
        fail(f"no function {name!r}; found: {', '.join(sorted(specs)) or 'none'}")
    # In a function's pod: Knative delivers events without credentials to this cluster-local service; the admin
    # API takes the platform credential (CASCADE_PLATFORM_TOKEN from a Secret).
    runtime = Runtime(cfg.home / "run", auth=wiring.authenticator(wiring.store(cfg), platform_token(cfg.home)),
                      tick=cfg.functions.tick_seconds, default_service=name, open_functions=True)
    # Knative scales the pods; inside one, a single warm instance serves.
    spec = specs[name]
    pinned = spec.model_copy(update={"annotations": {**spec.annotations, "autoscaling.knative.dev/min-scale": "1",
                                                     "autoscaling.knative.dev/max-scale": "1"}})
    register(runtime, pinned, state_url=cfg.state_url, queue_timeout=cfg.functions.queue_timeout_seconds)
    uvicorn.run(wiring.guarded(cfg, runtime, host), host=host, port=port, log_level="warning")


@functions_app.command("ls")
def functions_ls() -> None:
    """Functions found, their triggers and live instances (when the runtime is up)."""
    from rich.table import Table

    from cascade.functions.spec import discover

    cfg = settings()
    try:
        specs = discover(wiring.function_dirs(cfg))
    except CascadeError as exc:
        fail(str(exc))
        raise
    live = {s["name"]: s for s in runtime_admin(cfg.runtime_url, "/_runtime/services", platform_token(cfg.home)) or []}
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
