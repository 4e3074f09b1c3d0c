"""release-model: job.succeeded -> model.registered, and model.released when the metrics pass the gate."""

from __future__ import annotations

from typing import Any

from cloudevents.http import CloudEvent

from cascade.core.settings import Settings
from cascade.functions.models import Models

_models: Models | None = None


def start(config: dict[str, Any]) -> None:
    global _models
    _models = Models(Settings())  # this process's settings, read once at its entry point


def handle(event: CloudEvent) -> list[CloudEvent] | None:
    assert _models is not None
    return _models.on_succeeded(event) or None
