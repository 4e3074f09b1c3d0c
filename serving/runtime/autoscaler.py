"""Knative's KPA decision, as a pure class over observed concurrency and a clock.

Each tick the activator reports the average concurrency (requests in flight or queued) it
saw since the last tick. The desired scale is ``ceil(average / (target x utilisation))``
over the stable window; when the panic window's average asks for at least
``panic-threshold-percentage`` of the current scale, the autoscaler panics: it scales up on
the panic window and does not scale down until a stable window passes without panic.
Scale-down is held back by ``scale-down-delay``; reaching zero also waits for the
scale-to-zero grace period and retention after the last request.
"""

from __future__ import annotations

import math
from collections import deque

from cascade.serving.runtime.policy import ScalingPolicy


class Autoscaler:
    def __init__(self, policy: ScalingPolicy, now: float) -> None:
        self.policy = policy
        self.samples: deque[tuple[float, float]] = deque()
        self.recent: deque[tuple[float, int]] = deque()  # desired scales, for scale-down-delay
        self.panic_until: float | None = None
        self.panic_floor = 0
        self.last_active = now

    def observe(self, now: float, concurrency: float) -> None:
        self.samples.append((now, concurrency))
        if concurrency > 0:
            self.last_active = now
        horizon = now - self.policy.window
        while self.samples and self.samples[0][0] < horizon:
            self.samples.popleft()

    def _average(self, now: float, span: float) -> float:
        values = [c for t, c in self.samples if t > now - span]
        return sum(values) / len(values) if values else 0.0

    def desired(self, now: float, current: int) -> int:
        p = self.policy
        per_instance = p.target_per_instance
        stable = math.ceil(self._average(now, p.window) / per_instance - 1e-9)
        panic = math.ceil(self._average(now, p.panic_window) / per_instance - 1e-9)
        if panic >= max(current, 1) * p.panic_threshold_percentage / 100 and panic > current:
            if self.panic_until is None:
                self.panic_floor = current
            self.panic_until = now + p.window
        if self.panic_until is not None and now < self.panic_until:
            self.panic_floor = max(self.panic_floor, panic, stable)
            want = self.panic_floor
        else:
            self.panic_until, self.panic_floor = None, 0
            want = stable
        if p.scale_down_delay > 0:
            self.recent.append((now, want))
            while self.recent and self.recent[0][0] < now - p.scale_down_delay:
                self.recent.popleft()
            want = max(w for _, w in self.recent)
        if p.max_scale:
            want = min(want, p.max_scale)
        want = max(want, p.min_scale)
        if want == 0 and current > 0:
            idle = now - self.last_active
            if idle < max(p.scale_to_zero_grace, p.scale_to_zero_retention):
                want = 1
        return want

    @property
    def panicking(self) -> bool:
        return self.panic_until is not None
