"""``python -m cascade.cli`` runs the same command line as the ``cascade`` script."""

from cascade.cli.main import app

app()
