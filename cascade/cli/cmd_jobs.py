"""Commands for training and fine-tuning jobs: submit and follow, list, logs, cancel, policies."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

if TYPE_CHECKING:
    from cascade.core.settings import Settings

from cascade.app import wiring
from cascade.cli.common import app, console, fail, gateway_call, load_data, settings
from cascade.core.errors import CascadeError

jobs_app = typer.Typer(help="Training jobs: submit, follow, cancel.", no_args_is_help=True)
app.add_typer(jobs_app, name="jobs")


@jobs_app.command("submit")
def jobs_submit(
    spec: Annotated[str, typer.Option(help="The job spec: JSON, or @file.json (see schemas/trainingjob.v1.json).")],
    kind: Annotated[str, typer.Option(help="training or finetune.")] = "training",
    wait: Annotated[bool, typer.Option(help="Follow the job until it ends.")] = False,
    token: Annotated[Optional[str], typer.Option(envvar="CASCADE_TOKEN", help="API token.")] = None,
) -> None:
    """Submit a job through the gateway (it becomes a job.submitted event)."""
    reply = gateway_call("POST", "/v1/jobs", token, json={"kind": kind, "spec": load_data(spec)})
    typer.echo(f"submitted {reply['jobId']}")
    for warning in reply.get("warnings", []):
        typer.secho(f"warning: {warning}", fg=typer.colors.YELLOW, err=True)
    if wait:
        _follow(reply["jobId"], token)


def _follow(job_id: str, token: str | None) -> None:
    import time

    from rich.live import Live

    last = None
    with Live(console=console(), refresh_per_second=4) as live:
        while True:
            job = gateway_call("GET", f"/v1/jobs/{job_id}", token)
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
    for job in gateway_call("GET", "/v1/jobs" + (f"?status={status}" if status else ""), token):
        table.add_row(job["id"], job.get("kind", ""), str((job.get("spec") or {}).get("framework", "")), job["status"],
                      job.get("submitted", "")[:19], json.dumps(job.get("metrics", {}))[:60])
    console().print(table)


def _backend(cfg: Settings) -> Any:
    from cascade.functions.training.backends import open_backend

    return open_backend(cfg, wiring.store(cfg))


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


@jobs_app.command("watch")
def jobs_watch() -> None:
    """Follow where jobs run and publish job.started/succeeded/failed as they happen (the cluster form's
    job watcher; ``cascade up`` runs one itself). Stops on Ctrl-C or SIGTERM."""
    import signal
    import threading

    from cascade.functions.training.watch import JobWatcher

    cfg = settings()
    try:
        watcher = JobWatcher(_backend(cfg), wiring.bus(cfg), cfg.bus.topic, interval=cfg.training.watch_seconds)
    except CascadeError as exc:
        fail(str(exc))
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    watcher.start()
    typer.echo(f"watching {cfg.training.backend} jobs")
    try:
        done.wait()
    except KeyboardInterrupt:
        pass
    watcher.stop()


@jobs_app.command("policy")
def jobs_policy(
    dataset: str,
    spec: Annotated[str, typer.Option(help="Training spec to run when DATASET's labels are completed (JSON or @file).")],
    project: Annotated[Optional[str], typer.Option(help="Project of the dataset and the jobs; default: the token's "
                                                   "project.")] = None,
    token: Annotated[Optional[str], typer.Option(envvar="CASCADE_TOKEN", help="API token (names the project).")] = None,
) -> None:
    """Attach a training policy to a project's dataset: labels.completed for it submits a job."""
    from cascade.events.identity import Projects
    from cascade.functions.training.launcher import set_policy

    cfg = settings()
    store = wiring.store(cfg)
    token = token or wiring.saved_token(cfg)
    identity = Projects(store).lookup(token) if token else None
    if project is None:
        project = identity.project if identity and identity.project else "default"
    elif identity is not None and identity.project not in (None, project) and token != wiring.saved_token(cfg):
        fail(f"this token belongs to project {identity.project!r}, not {project!r}")
    try:
        set_policy(store, dataset, load_data(spec), project)
    except CascadeError as exc:
        fail(str(exc))
    typer.echo(f"labels.completed for {dataset} in project {project} now trains that spec")
