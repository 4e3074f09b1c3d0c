"""`cascade demo` tells the whole story on the embedded defaults and on the real Kafka and Redis.

The demo drives a running `cascade up` the way a user would (a file in the watched folder, a
Label Studio webhook) and prints a timeline; every step of the story must appear, in order.
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest

from tests.conftest import KAFKA, REDIS
from tests.helpers.platform import cascade_up

STORY = ["edge.heartbeat", "file written", "dataset.uploaded", "label studio webhook sent", "labels.completed",
         "job.submitted", "job.started", "job.succeeded", "model.registered", "model.released", "model.deployed",
         "model.deployed", "inference answered (central)", "inference answered (edge)", "central runtime at zero",
         "edge runtime at zero"]
ROW = re.compile(r"^\s+(\d+\.\d+)s\s+\(\+\s*(\d+\.\d+)s\)\s+(.+?)(?:\s{2,}|$)")


@pytest.mark.parametrize("services", ["embedded", "kafka+redis"])
def test_demo_completes_the_whole_story(tmp_path: Path, services: str) -> None:
    args = [] if services == "embedded" else ["--bus", f"kafka://{KAFKA}", "--state", REDIS]
    with cascade_up(tmp_path / "home", *args, CASCADE_BUS__TOPIC=f"demo-{uuid.uuid4().hex[:8]}") as running:
        result = running.cascade("demo", "--timeout", "240", *args)
        assert result.returncode == 0, result.stdout + result.stderr + running.log.read_text()[-3000:]
    rows = [m.groups() for m in map(ROW.match, result.stdout.splitlines()) if m]
    assert [r[2] for r in rows] == STORY, result.stdout
    times = [float(r[0]) for r in rows]
    assert times == sorted(times)
    assert "placed on flavor local-cpu" in result.stdout and "pytorch-cpu" in result.stdout
    assert "demo complete: 16 steps" in result.stdout
