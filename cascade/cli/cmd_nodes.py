"""Commands for the hardware the scheduler places on (probe a machine or a cluster, write the inventory) and
for choosing a framework for it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer
import yaml

from cascade.cli.common import app, console, fail, settings

nodes_app = typer.Typer(help="The hardware jobs are placed on.", no_args_is_help=True)
app.add_typer(nodes_app, name="nodes")


@nodes_app.command("probe")
def nodes_probe(
    output: Annotated[Optional[Path], typer.Option(help="Write the inventory YAML here "
                                                        "(use it as CASCADE_TRAINING__INVENTORY).")] = None,
    kubernetes: Annotated[bool, typer.Option("--kubernetes", help="Read the cluster's nodes (kubeconfig or the pod's "
                                                                  "service account) instead of this machine.")] = False,
) -> None:
    """Find the accelerators, cores, memory and RDMA devices, and print (or write) an inventory."""
    from cascade.scheduling import discovery

    if kubernetes:
        from cascade.core.errors import CascadeError
        from cascade.core.kube import list_nodes

        try:
            doc = discovery.from_nodes(list_nodes())
        except CascadeError as exc:
            fail(str(exc))
    else:
        machine = discovery.probe()
        for note in machine.notes:
            typer.echo(f"{machine.name}: {note}")
        for c in machine.cards:
            typer.echo(f"{machine.name}: {c.vendor} {c.model or '(model unknown)'} "
                       f"{f'{c.memory_gib:g} GiB ' if c.memory_gib else ''}x{c.count} ({c.source})")
        typer.echo(f"{machine.name}: {machine.cpu} cores, {machine.memory_gib:g} GiB memory, "
                   f"RDMA: {', '.join(machine.rdma) or 'none'}")
        doc = discovery.inventory([machine])
    _show(doc)
    if output:
        output.write_text(yaml.safe_dump(doc, sort_keys=False))
        typer.echo(f"wrote {output}")


def _show(doc: dict[str, Any]) -> None:
    from rich.table import Table

    table = Table("flavor", "vendor", "model", "card GiB", "nodes", "cards", "cores", "memory GiB", "rdma")
    for f in doc["flavors"]:
        nodes = f["nodes"]
        table.add_row(f["name"], f["vendor"], f.get("model", ""), f"{f.get('memoryGiB', 0):g}", str(len(nodes)),
                      str(sum(n["cards"] for n in nodes)), f"{sum(n.get('cpu', 0) for n in nodes):g}",
                      f"{sum(n.get('hostMemoryGiB', 0) for n in nodes):g}", f.get("rdma", ""))
    console().print(table)


frameworks_app = typer.Typer(help="Training frameworks: which to choose, and their images.", no_args_is_help=True)
app.add_typer(frameworks_app, name="frameworks")


@frameworks_app.command("recommend")
def frameworks_recommend(
    task: Annotated[str, typer.Option(help="vision, nlp, recsys or rl.")],
    deploy: Annotated[str, typer.Option(help="cloud, mobile or edge.")],
    team: Annotated[str, typer.Option(help="python (research-minded) or engineering.")],
    priority: Annotated[str, typer.Option(help="iteration or scale.")],
    inventory: Annotated[Optional[Path], typer.Option(help="Inventory YAML whose vendors the images are for "
                                                            "(default: the platform's, else this machine: cpu).")] = None,
) -> None:
    """Walk the framework decision tree, each step with its reason, and list the images for the hardware."""
    from cascade.scheduling.placement import Inventory
    from cascade.scheduling.recommend import images, recommend

    try:
        result = recommend(task, deploy, team, priority)
    except ValueError as exc:
        fail(str(exc))
    path = inventory or settings().training.inventory
    vendors = sorted({f.vendor for f in Inventory.load(path).flavors.values()}) if path else ["cpu"]
    for i, step in enumerate(result.steps, 1):
        typer.echo(f"{i}. {step.question} {step.answer}: {step.reason}\n   -> {', '.join(step.kept)}")
    first, *others = result.frameworks
    typer.echo(f"recommended: {first}" + (f", scaled with {result.scale_with}" if result.scale_with else "")
               + (f" (alternatives: {', '.join(others)})" if others else ""))
    for framework, per_vendor in images([first, *([result.scale_with] if result.scale_with else [])], vendors).items():
        for vendor, image in per_vendor.items():
            typer.echo(f"  {framework} on {vendor}: {image or 'no image (it does not run on ' + vendor + ')'}")
