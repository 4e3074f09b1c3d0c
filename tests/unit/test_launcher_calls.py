"""The launch-training function is called from several runtime threads at once: each call's follow-ups (job.queued
of preempted runs, job.admitted) go with its own reply, never with another call's or nowhere."""

from __future__ import annotations

import threading
from pathlib import Path

from cascade.core.settings import Settings
from cascade.events.envelope import new_event
from cascade.functions.training.launcher import TrainingLauncher


def test_each_call_collects_its_own_follow_ups(tmp_path: Path) -> None:
    cfg = Settings(home=tmp_path / "home")
    cfg.state.url = f"sqlite:///{tmp_path / 'state.db'}"
    launcher = TrainingLauncher(cfg)
    mine = new_event("job.queued", {"jobId": "a", "reasons": {"preempted": "test"}}, source="/test")
    launcher.pending.append(mine)
    seen: list[list[object]] = []
    other = threading.Thread(target=lambda: seen.append(list(launcher.pending)))
    other.start()
    other.join(timeout=10)
    assert seen == [[]], "another thread's call starts with nothing of this call's"
    assert launcher.pending == [mine]
