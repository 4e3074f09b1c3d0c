"""Knative's autoscaling annotations, parsed once into a typed policy.

The names and defaults are Knative Serving's (KPA), so a function's ``func.yaml`` means the
same here and in a Knative Service. Durations accept Knative's forms (``60s``, ``1m30s``,
``0s``) and, for local use, fractions (``2.5s``) and windows shorter than Knative's 6 s floor.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from cascade.core.errors import InvalidInput

PREFIX = "autoscaling.knative.dev/"
_DURATION = re.compile(r"^(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m(?!s))?(?:(\d+(?:\.\d+)?)s)?(?:(\d+)ms)?$")


def duration(text: str, name: str) -> float:
    match = _DURATION.match(str(text).strip())
    if not match or not str(text).strip():
        raise InvalidInput(f"{name}: {text!r} is not a duration such as 60s, 1m30s or 0s", field=name)
    h, m, s, ms = (float(g) if g else 0.0 for g in match.groups())
    return h * 3600 + m * 60 + s + ms / 1000


def _number(annotations: Mapping[str, str], key: str, default: float, minimum: float = 0) -> float:
    raw = annotations.get(PREFIX + key)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise InvalidInput(f"{PREFIX}{key}: {raw!r} is not a number", field=PREFIX + key) from None
    if value < minimum:
        raise InvalidInput(f"{PREFIX}{key} must be at least {minimum}", field=PREFIX + key)
    return value


@dataclass(frozen=True)
class ScalingPolicy:
    min_scale: int = 0
    max_scale: int = 0  # 0: unlimited
    initial_scale: int = 1
    target: float = 100.0  # concurrency per instance
    target_utilization: float = 70.0  # percent
    window: float = 60.0  # stable window, seconds
    panic_window_percentage: float = 10.0
    panic_threshold_percentage: float = 200.0
    scale_to_zero_retention: float = 0.0
    scale_down_delay: float = 0.0
    container_concurrency: int = 0  # 0: unlimited (hard limit per instance)
    scale_to_zero_grace: float = 30.0  # global setting in Knative's config-autoscaler

    @property
    def panic_window(self) -> float:
        return self.window * self.panic_window_percentage / 100

    @property
    def target_per_instance(self) -> float:
        """Concurrency one instance should carry: the target (capped by containerConcurrency) x utilisation."""
        target = self.target
        if self.container_concurrency and self.container_concurrency < target:
            target = self.container_concurrency
        return max(0.01, target * self.target_utilization / 100)

    @classmethod
    def from_annotations(cls, annotations: Mapping[str, str], *, container_concurrency: int = 0,
                         scale_to_zero_grace: float = 30.0) -> ScalingPolicy:
        unknown = [k for k in annotations if k.startswith(PREFIX) and k[len(PREFIX):] not in _KNOWN]
        if unknown:
            raise InvalidInput(f"unknown autoscaling annotation {unknown[0]!r}; known: {sorted(_KNOWN)}", field=unknown[0])
        get = annotations.get
        policy = cls(
            min_scale=int(_number(annotations, "min-scale", 0)),
            max_scale=int(_number(annotations, "max-scale", 0)),
            initial_scale=int(_number(annotations, "initial-scale", 1)),
            target=_number(annotations, "target", 100, minimum=0.01),
            target_utilization=_number(annotations, "target-utilization-percentage", 70, minimum=1),
            window=duration(get(PREFIX + "window", "60s"), PREFIX + "window"),
            panic_window_percentage=_number(annotations, "panic-window-percentage", 10, minimum=1),
            panic_threshold_percentage=_number(annotations, "panic-threshold-percentage", 200, minimum=110),
            scale_to_zero_retention=duration(get(PREFIX + "scale-to-zero-pod-retention-period", "0s"),
                                             PREFIX + "scale-to-zero-pod-retention-period"),
            scale_down_delay=duration(get(PREFIX + "scale-down-delay", "0s"), PREFIX + "scale-down-delay"),
            container_concurrency=container_concurrency,
            scale_to_zero_grace=scale_to_zero_grace,
        )
        if policy.max_scale and policy.min_scale > policy.max_scale:
            raise InvalidInput("min-scale is above max-scale", field=PREFIX + "min-scale")
        if policy.window <= 0:
            raise InvalidInput("window must be positive", field=PREFIX + "window")
        return policy


_KNOWN = {"min-scale", "max-scale", "initial-scale", "target", "target-utilization-percentage", "window",
          "panic-window-percentage", "panic-threshold-percentage", "scale-to-zero-pod-retention-period",
          "scale-down-delay", "metric", "class"}
