"""deploy-model: model.released -> the version serving (model.deployed) or model.deploy_failed;
model.withdrawn -> the version no longer taking traffic."""

from __future__ import annotations

from typing import Any

from cloudevents.http import CloudEvent

from cascade.core.settings import Settings
from cascade.functions.models import Models

_models: Models | None = None


def start(config: dict[str, Any]) -> None:
    global _models
    _models = Models(Settings())  # this process's settings, read once at its entry point


def handle(event: CloudEvent) -> CloudEvent | None:
    assert _models is not None
    if event["type"] == "io.cascade.model.withdrawn.v1":
        return _models.on_withdrawn(event)
    return _models.on_released(event)
