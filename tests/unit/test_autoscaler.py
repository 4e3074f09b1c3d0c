"""The KPA decision on a simulated clock, and Knative's annotation names and defaults."""

from __future__ import annotations

import pytest

from cascade.core.errors import InvalidInput
from cascade.serving.runtime.autoscaler import Autoscaler
from cascade.serving.runtime.policy import ScalingPolicy, duration


def run(scaler: Autoscaler, load: list[tuple[float, float]], start: int = 0, step: float = 1.0) -> list[int]:
    """Feed (seconds, concurrency) phases tick by tick; return the scale after each tick."""
    now, scale, history = 0.0, start, []
    for seconds, concurrency in load:
        for _ in range(int(seconds / step)):
            now += step
            scaler.observe(now, concurrency)
            scale = scaler.desired(now, scale)
            history.append(scale)
    return history


def test_defaults_are_knatives() -> None:
    p = ScalingPolicy.from_annotations({})
    assert (p.min_scale, p.max_scale, p.initial_scale, p.target, p.target_utilization) == (0, 0, 1, 100, 70)
    assert (p.window, p.panic_window, p.panic_threshold_percentage, p.scale_to_zero_grace) == (60, 6, 200, 30)
    assert (p.scale_down_delay, p.scale_to_zero_retention, p.container_concurrency) == (0, 0, 0)


def test_annotations_are_read_and_checked() -> None:
    p = ScalingPolicy.from_annotations({
        "autoscaling.knative.dev/min-scale": "1", "autoscaling.knative.dev/max-scale": "5",
        "autoscaling.knative.dev/target": "10", "autoscaling.knative.dev/window": "1m30s",
        "autoscaling.knative.dev/scale-down-delay": "15s"}, container_concurrency=4)
    assert (p.min_scale, p.max_scale, p.target, p.window, p.scale_down_delay) == (1, 5, 10, 90, 15)
    assert p.target_per_instance == pytest.approx(4 * 0.7), "containerConcurrency caps the target"
    for bad in ({"autoscaling.knative.dev/min-scal": "1"}, {"autoscaling.knative.dev/target": "lots"},
                {"autoscaling.knative.dev/min-scale": "3", "autoscaling.knative.dev/max-scale": "2"},
                {"autoscaling.knative.dev/window": "soon"}):
        with pytest.raises(InvalidInput):
            ScalingPolicy.from_annotations(bad)
    assert duration("2.5s", "x") == 2.5 and duration("500ms", "x") == 0.5 and duration("1h", "x") == 3600


def test_steady_load_gets_load_over_target_times_utilisation() -> None:
    scaler = Autoscaler(ScalingPolicy(target=10, target_utilization=70, window=10), 0.0)
    assert run(scaler, [(30, 35.0)])[-1] == 5  # ceil(35 / 7)


def test_panic_scales_up_fast_and_holds_for_a_window() -> None:
    policy = ScalingPolicy(target=10, target_utilization=100, window=60, panic_window_percentage=10)
    scaler = Autoscaler(policy, 0.0)
    history = run(scaler, [(60, 10.0), (6, 80.0), (30, 0.0)], start=1)
    assert history[59] == 1
    assert max(history[60:66]) == 8 and scaler.panicking, "the 6 s panic window sees the burst at once"
    assert min(history[66:]) == 8, "no scale-down while panicking"


def test_scale_to_zero_waits_for_the_grace_period() -> None:
    scaler = Autoscaler(ScalingPolicy(target=1, window=2, scale_to_zero_grace=5), 0.0)
    history = run(scaler, [(2, 1.0), (10, 0.0)], start=1)
    first_zero = history.index(0)
    assert first_zero == 2 + 5 - 1, history  # last busy tick at t=2, zero allowed from t=7


def test_bounds_and_scale_down_delay() -> None:
    scaler = Autoscaler(ScalingPolicy(target=1, target_utilization=100, window=2, min_scale=2, max_scale=4,
                                      scale_down_delay=5), 0.0)
    history = run(scaler, [(4, 10.0), (10, 0.0)], start=2)
    assert max(history) == 4 and history[-1] == 2
    assert history[4 + 2] == 4, "scale-down held back by the delay"
