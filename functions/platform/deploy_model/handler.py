"""deploy-model: model.released -> the version serving (model.deployed) or model.deploy_failed."""

from __future__ import annotations

from typing import Any

from cloudevents.http import CloudEvent

from cascade.core.settings import Settings
from cascade.functions.models import Models

_models: Models | None = None


def start(config: dict[str, Any]) -> None:
    global _models
    _models = Models(Settings())  # this process's settings, read once at its entry point


def handle(event: CloudEvent) -> CloudEvent:
    assert _models is not None
    return _models.on_released(event)
