"""run-experiment: experiment.submitted/stopped, and its trials' reports and ends -> the next trials, pruning
and the experiment's end (``cascade.functions.experiments.controller``)."""

from __future__ import annotations

from typing import Any

from cloudevents.http import CloudEvent

from cascade.core.settings import Settings
from cascade.functions.experiments.controller import Experiments
from cascade.functions.models import Models
from cascade.functions.training.backends import open_backend
from cascade.stores import open_store

_experiments: Experiments | None = None


def start(config: dict[str, Any]) -> None:
    global _experiments
    cfg = Settings()  # this process's settings, read once at its entry point
    store = open_store(cfg.state_url)
    _experiments = Experiments(store, open_backend(cfg, store).cancel, release=Models(cfg).on_succeeded)


def handle(event: CloudEvent) -> list[CloudEvent] | None:
    assert _experiments is not None
    family = str(event["type"]).removeprefix("io.cascade.").rsplit(".", 1)[0]
    if family == "experiment.submitted":
        return _experiments.submitted(event) or None
    if family == "experiment.stopped":
        return _experiments.stopped(event) or None
    if family == "trial.reported":
        return _experiments.reported(event) or None
    return _experiments.ended(event) or None
