"""Ctrl-C on `cascade up` loses no accepted event: what was in flight is delivered after a restart.

Every event acknowledged with 202 is on the bus; stopping the platform mid-stream must neither
drop the ones not delivered yet nor dead-letter the ones whose delivery it interrupted.
"""

from __future__ import annotations

import json
import signal
import time
import uuid
from pathlib import Path

import httpx

from tests.helpers.platform import cascade_up
from tests.helpers.subscriber import Subscriber

EVENTS = 400


def test_ctrl_c_mid_stream_then_restart_delivers_every_accepted_event(tmp_path: Path) -> None:
    sub = Subscriber(delay=0.05)
    triggers = tmp_path / "slow.triggers.yaml"
    triggers.write_text(f"triggers:\n- name: slow\n  subscriber: {sub.url('/slow')}\n  start: earliest\n"
                        "  delivery: {retry: 2, backoffDelay: PT0.1S}\n")
    home, env = tmp_path / "home", {"CASCADE_DISPATCHER__TRIGGERS": json.dumps([str(triggers)])}
    batch = [{"specversion": "1.0", "id": f"stop-{i}-{uuid.uuid4().hex[:6]}", "source": "/test/shutdown",
              "type": "io.cascade.dataset.uploaded.v1", "datacontenttype": "application/json",
              "data": {"dataset": "stop", "uri": f"file:///tmp/stop/{i}", "size": i, "origin": "api"}}
             for i in range(EVENTS)]
    try:
        with cascade_up(home, **env) as running:
            token = (home / "token").read_text().strip()
            reply = httpx.post(f"{running.gateway}/events", content=json.dumps(batch), timeout=60, headers={
                "authorization": f"Bearer {token}", "content-type": "application/cloudevents-batch+json"})
            assert reply.status_code == 202 and reply.json()["accepted"] == EVENTS, reply.text
            deadline = time.monotonic() + 60
            while len(sub.at("/slow")) < 20:
                assert time.monotonic() < deadline, "nothing was delivered"
                time.sleep(0.02)
            running.proc.send_signal(signal.SIGINT)  # Ctrl-C with deliveries in flight
            assert running.proc.wait(timeout=90) == 0, running.log.read_text()[-3000:]
            delivered_before = {d.id for d in sub.at("/slow")}
        assert len(delivered_before) < EVENTS // 2, "Ctrl-C went on starting deliveries"
        with cascade_up(home, **env) as running:
            deadline = time.monotonic() + 120
            while {d.id for d in sub.at("/slow")} != {e["id"] for e in batch}:
                assert time.monotonic() < deadline, f"{EVENTS - len({d.id for d in sub.at('/slow')})} never delivered"
                time.sleep(0.1)
            letters = running.cascade("dlq", "ls", "slow", "--triggers", str(triggers))
            assert letters.stdout.splitlines()[-1].startswith("0 dead letter(s)"), letters.stdout
    finally:
        sub.close()
