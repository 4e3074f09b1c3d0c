"""Commands for the hardware the scheduler places on: probe this machine or a cluster, write the inventory."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer
import yaml

from cascade.cli.common import app, console, fail

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
