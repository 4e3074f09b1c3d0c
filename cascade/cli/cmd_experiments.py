"""Commands for hyper-parameter experiments: submit, list, show (trials and the best so far), stop."""

from __future__ import annotations

import json
from typing import Annotated, Any, Optional

import typer

from cascade.cli.common import app, console, gateway_call, load_data

experiments_app = typer.Typer(help="Hyper-parameter searches whose trials are training jobs.", no_args_is_help=True)
app.add_typer(experiments_app, name="experiments")
TokenOption = Annotated[Optional[str], typer.Option(envvar="CASCADE_TOKEN", help="API token.")]


@experiments_app.command("submit")
def experiments_submit(
    spec: Annotated[str, typer.Option(help="The experiment: JSON, or @file.json (see schemas/experiment.v1.json).")],
    token: TokenOption = None,
) -> None:
    """Submit an experiment through the gateway (it becomes an experiment.submitted event)."""
    reply = gateway_call("POST", "/v1/experiments", token, json=load_data(spec))
    typer.echo(f"submitted {reply['experimentId']}")


@experiments_app.command("ls")
def experiments_ls(token: TokenOption = None) -> None:
    """The token's project's experiments."""
    from rich.table import Table

    table = Table("experiment", "name", "status", "running", "complete", "pruned", "failed", "best")
    for e in gateway_call("GET", "/v1/experiments", token):
        best: dict[str, Any] | None = e.get("best")
        t = e["trials"]
        table.add_row(e["id"], e["name"], e["status"], str(t["running"]), str(t["complete"]), str(t["pruned"]),
                      str(t["failed"]), "" if best is None else f"{e['metric']}={best['value']:.4g} ({best['jobId']})")
    console().print(table)


@experiments_app.command("show")
def experiments_show(experiment_id: str, token: TokenOption = None) -> None:
    """Every trial: parameters, last reported value, outcome."""
    from rich.table import Table

    e = gateway_call("GET", f"/v1/experiments/{experiment_id}", token)
    typer.echo(f"{e['id']} {e['status']}" + (f": {e['reason']}" if e.get("reason") else ""))
    table = Table("trial", "state", "parameters", f"last {e['metric']}", f"final {e['metric']}")
    for t in e["trials"]:
        steps = t.get("steps") or {}
        last = steps[max(steps, key=int)] if steps else None
        table.add_row(t["jobId"], t["state"], json.dumps(t["params"]), "" if last is None else f"{last:.4g}",
                      "" if t.get("value") is None else f"{t['value']:.4g}")
    console().print(table)


@experiments_app.command("stop")
def experiments_stop(experiment_id: str, token: TokenOption = None) -> None:
    """Stop an experiment: running trials are cancelled; it ends with the best trial so far."""
    gateway_call("POST", f"/v1/experiments/{experiment_id}/stop", token)
    typer.echo(f"stopping {experiment_id}")


@experiments_app.command("katib")
def experiments_katib(
    spec: Annotated[str, typer.Option(help="The experiment: JSON, or @file.json.")],
    name: Annotated[str, typer.Option(help="The Katib Experiment's name.")],
    namespace: Annotated[str, typer.Option(help="The project namespace it runs in.")] = "cascade-default",
) -> None:
    """Print the experiment as a Katib Experiment (YAML), for clusters that run Katib instead of Cascade's controller."""
    import yaml

    from cascade.cli.common import fail, settings
    from cascade.core.errors import CascadeError
    from cascade.events import experiments
    from cascade.functions.experiments.katib import experiment
    from cascade.functions.training.job import TrainingJob
    from cascade.functions.training.launcher import LOCAL_INVENTORY
    from cascade.scheduling.matcher import Matcher
    from cascade.scheduling.placement import Inventory

    cfg, body = settings(), load_data(spec)
    try:
        experiments.check(body)
        inventory = Inventory.load(cfg.training.inventory) if cfg.training.inventory else Inventory.from_dict(LOCAL_INVENTORY)
        job = TrainingJob.from_spec(name, "default", body["trial"])
        placement = Matcher(inventory).place(job.matcher_job(cfg.training.queue)).pod()
        typer.echo(yaml.safe_dump(experiment(name, body, namespace, placement), sort_keys=False))
    except CascadeError as exc:
        fail(str(exc))
