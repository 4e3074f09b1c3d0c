"""Entry point of the ``cascade`` console script."""

from __future__ import annotations

import typer

from cascade import __version__

app = typer.Typer(help="Cascade: event-driven, serverless ML.", no_args_is_help=True)


@app.command()
def version() -> None:
    """Print Cascade's version."""
    typer.echo(__version__)
