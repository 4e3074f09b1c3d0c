"""The metrics-reporter: a trial's intermediate metrics from a Kubernetes pod to the gateway.

On the local backend the supervisor reads ``metrics.jsonl`` itself; a pod's output folder is an
emptyDir nobody outside the pod can read. So a trial's pods carry this process as a native
sidecar (an init container with ``restartPolicy: Always``, which Kubernetes stops after the
job's own container): it follows ``$CASCADE_OUTPUT_DIR/metrics.jsonl`` and posts the whole lines
added since the last post to ``$CASCADE_REPORT_URL`` with the job's report credential
(``$CASCADE_REPORT_TOKEN``, from the Secret ``<job>-report``), where each becomes a
``trial.reported`` event. A line counts as sent only once the gateway took it; an unreachable
gateway is retried with back-off, and on SIGTERM what is left is sent once more.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import httpx

from cascade.core.credentials import auth_header


class Reporter:
    def __init__(self, path: Path, url: str, token: str, *, interval: float = 1.0) -> None:
        self.path, self.url, self.interval = path, url, interval
        self.headers = {**auth_header(token), "content-type": "application/x-ndjson"}
        self.sent = 0  # bytes of metrics.jsonl the gateway took
        self.stop = threading.Event()

    def pending(self) -> bytes:
        """The whole lines written since the last accepted post (at most 1 MiB)."""
        try:
            with self.path.open("rb") as f:
                f.seek(self.sent)
                added = f.read(1 << 20)
        except OSError:
            return b""
        return added[:added.rfind(b"\n") + 1]

    def post(self, client: httpx.Client) -> bool:
        """Send what is pending; True when nothing is left unsent."""
        lines = self.pending()
        if not lines:
            return True
        try:
            answer = client.post(self.url, content=lines, headers=self.headers)
        except httpx.HTTPError as exc:
            print(f"metrics-reporter: {self.url}: {exc}", file=sys.stderr, flush=True)
            return False
        if answer.status_code < 300 or (400 <= answer.status_code < 500 and answer.status_code != 429):
            if answer.status_code >= 300:  # refused for good (a bad credential): say so, do not resend forever
                print(f"metrics-reporter: refused ({answer.status_code}): {answer.text[:300]}", file=sys.stderr,
                      flush=True)
            self.sent += len(lines)
            return True
        return False

    def run(self) -> None:
        pause = self.interval
        with httpx.Client(timeout=10) as client:
            while not self.stop.is_set():
                pause = self.interval if self.post(client) else min(pause * 2, 30.0)
                self.stop.wait(pause)
            for _ in range(3):  # the job's container ended: its last lines
                if self.post(client):
                    break


def main() -> None:
    env = os.environ
    reporter = Reporter(Path(env["CASCADE_OUTPUT_DIR"]) / "metrics.jsonl", env["CASCADE_REPORT_URL"],
                        env.get("CASCADE_REPORT_TOKEN", ""), interval=float(env.get("CASCADE_REPORT_INTERVAL", "1")))

    def finish(signum: int, frame: Any) -> None:
        reporter.stop.set()

    signal.signal(signal.SIGTERM, finish)
    signal.signal(signal.SIGINT, finish)
    reporter.run()


if __name__ == "__main__":
    main()
