"""launch-finetune: finetune.submitted -> memory estimate, placement, a running fine-tune."""

from __future__ import annotations

from typing import Any

from cloudevents.http import CloudEvent

from cascade.core.settings import Settings
from cascade.functions.training.launcher import TrainingLauncher

_launcher: TrainingLauncher | None = None


def start(config: dict[str, Any]) -> None:
    global _launcher
    _launcher = TrainingLauncher(Settings())  # this process's settings, read once at its entry point


def handle(event: CloudEvent) -> CloudEvent | list[CloudEvent] | None:
    assert _launcher is not None
    return _launcher.handle(event)  # finetune.submitted: booked (and what it preempted stopped) like any job
