"""Runs one local training job to the end: the local backend's stand-in for an operator.

Started detached by the local backend (so the launching function can scale to zero), it
starts each worker with the environment its framework's operator would inject, writes
their logs under the artifact root, enforces the timeout, retries the whole job, and
reports ``job.started``, then ``job.succeeded`` (with the metrics the job wrote to
``$CASCADE_OUTPUT_DIR/metrics.json``), ``job.failed`` (with the log tail) or
``job.cancelled`` (on SIGTERM, with the reason the canceller recorded), keeping the job record
current. While it runs, each line a worker appends to ``$CASCADE_OUTPUT_DIR/metrics.jsonl``
(``{"step": 3, "loss": 0.4}``) becomes a ``trial.reported`` event, so an experiment can prune it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from cascade.core.errors import InvalidInput
from cascade.core.ports import free_ports
from cascade.core.settings import Settings
from cascade.events import jobrecords as records
from cascade.events.bus import open_bus
from cascade.events.envelope import new_event
from cascade.events.experiments import report_rows
from cascade.functions.training import local_launch
from cascade.functions.training.env import worker_env
from cascade.functions.training.job import TrainingJob
from cascade.functions.training.policy import JobPolicy, drop_to, worker_base_env
from cascade.scheduling.placement import PodPlacement
from cascade.stores import open_store

SOURCE = "/cascade/backends/local"


class Supervisor:
    def __init__(self, job: TrainingJob, output: Path, extensions: dict[str, str], cfg: Settings) -> None:
        self.job, self.output, self.extensions = job, output, extensions
        self.bus, self.store, self.topic = open_bus(cfg.bus_url), open_store(cfg.state_url), cfg.bus.topic
        self.policy, self.run_as = JobPolicy.from_settings(cfg), cfg.training.run_as
        self.procs: list[subprocess.Popen[bytes]] = []  # the job's own: it ends when they do
        self.helpers: list[subprocess.Popen[bytes]] = []  # started for them (Ray nodes): stopped afterwards
        self.cancelled = False
        self._reported = 0  # bytes of metrics.jsonl already reported
        signal.signal(signal.SIGTERM, self._cancel)

    def _cancel(self, signum: int, frame: Any) -> None:
        self.cancelled = True

    def emit(self, family: str, data: dict[str, Any]) -> None:
        event = new_event(family, {"jobId": self.job.id, **data}, source=SOURCE, partitionkey=self.job.id,
                          subject=self.job.id, extensions=self.extensions)
        self.bus.publish(self.topic, event)

    def _start(self, attempt: int) -> None:
        hosts = ["127.0.0.1"] * self.job.workers
        port = free_ports(self.job.workers + 2)
        logs = self.output / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        entry = self.job.spec["entrypoint"]
        cwd = self.policy.workspace(self.job.project)
        if "script" in entry:
            self.policy.script(self.job.project, entry["script"])  # still inside the workspace
        else:
            cwd = self.output
        base = worker_base_env(os.environ, self.job.spec, str(self.output))
        drop = drop_to(self.run_as)
        if drop:  # the unprivileged user may write the job's output folder, and nothing else of the platform's
            os.chown(self.output, drop["user"], drop["group"])
        envs = {i: worker_env(self.job.framework, i, hosts, port, self.job.procs) for i in range(self.job.workers)}
        for proc in local_launch.plan(self.job, sys.executable, port, self.output, envs):
            env = {**base, **self.job.job_env(str(self.output)), **proc.env}
            if not self.job.placement.limits:
                env["CUDA_VISIBLE_DEVICES"] = ""  # placed on CPU: keep the frameworks off any GPU
            name = f"worker-{proc.worker}" if proc.main else f"node-{proc.worker}"
            log = (logs / f"{name}.attempt-{attempt}.log").open("wb")
            started = subprocess.Popen(proc.command, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, **drop)
            (self.procs if proc.main else self.helpers).append(started)

    def _stop_workers(self) -> None:
        for p in self.procs + self.helpers:
            if p.poll() is None:
                p.terminate()
        deadline = time.monotonic() + 10
        for p in self.procs + self.helpers:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()

    def report(self) -> int:
        """Publish the whole lines added to metrics.jsonl since the last call; the number published."""
        path = self.output / "metrics.jsonl"
        try:
            with path.open("rb") as f:
                f.seek(self._reported)
                added = f.read(1 << 20)
        except OSError:
            return 0
        complete = added[:added.rfind(b"\n") + 1]
        self._reported += len(complete)
        rows = report_rows(complete)
        for step, values in rows:
            self.emit("trial.reported", {"step": step, "metrics": values})
        return len(rows)

    def _wait(self, deadline: float | None) -> tuple[str, int, int]:
        """('ok'|'failed'|'timeout'|'cancelled', exit code, index of the failing worker)."""
        while True:
            self.report()
            if self.cancelled:
                return "cancelled", -15, 0
            codes = [p.poll() for p in self.procs]
            bad = next((i for i, c in enumerate(codes) if c not in (None, 0)), None)
            if bad is not None:
                return "failed", int(codes[bad] or 1), bad
            if all(c == 0 for c in codes):
                return "ok", 0, 0
            if deadline is not None and time.monotonic() > deadline:
                return "timeout", -9, 0
            time.sleep(0.1)

    def run(self) -> int:
        retries = int(self.job.spec.get("retries", 0))
        timeout = self.policy.timeout(self.job.spec)
        started = time.monotonic()
        outcome, code, bad = "failed", 1, 0
        if (records.get(self.store, self.job.id) or {}).get("cancelRequested"):
            self.cancelled = True  # cancelled before this process got going
        for attempt in range(1, retries + 2):
            if self.cancelled:
                outcome = "cancelled"
                break
            self.procs, self.helpers = [], []
            try:
                self.policy.check("training", self.job.spec)
                self._start(attempt)
            except InvalidInput as exc:
                records.update(self.store, self.job.id, "failed", reason=str(exc))
                self.emit("job.failed", {"reason": str(exc)})
                return 1
            records.update(self.store, self.job.id, "running", attempt=attempt, pid=os.getpid(),
                           artifactUri=self.output.as_uri(), project=self.job.project)
            self.emit("job.started", {"backend": "local", "kind": "process", "attempt": attempt,
                                      "placement": self.job.placement.to_dict()})
            outcome, code, bad = self._wait(started + float(timeout))
            self._stop_workers()  # what is left: helpers always, the job's own unless it succeeded
            if outcome in ("ok", "cancelled"):
                break
        duration = time.monotonic() - started
        if outcome == "ok":
            metrics_file = self.output / "metrics.json"
            metrics = json.loads(metrics_file.read_text()) if metrics_file.exists() else {}
            metrics = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}
            records.update(self.store, self.job.id, "succeeded", metrics=metrics)
            self.emit("job.succeeded", {"metrics": metrics, "artifactUri": self.output.as_uri(),
                                        "durationSeconds": round(duration, 3), "framework": self.job.framework})
            return 0
        if outcome == "cancelled":
            record = records.get(self.store, self.job.id) or {}
            reason = str(record.get("cancelReason") or "cancelled on request")
            # preempted: the job waits in its queue again (its output, with its checkpoints, stays)
            records.update(self.store, self.job.id, "queued" if record.get("requeued") else "cancelled", reason=reason)
            self.emit("job.cancelled", {"reason": reason})
            return 0
        log = sorted((self.output / "logs").glob(f"worker-{bad}.attempt-*.log"))[-1]
        tail = log.read_bytes()[-2000:].decode("utf-8", "replace")
        reason = f"timed out after {timeout}s" if outcome == "timeout" else (
            local_launch.not_installed(tail) or f"worker {bad} exited with {code}")
        records.update(self.store, self.job.id, "failed", reason=reason, exitCode=code)
        self.emit("job.failed", {"reason": reason, "exitCode": code, "logTail": tail})
        return 1


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    job = TrainingJob(spec["id"], spec["project"], spec["spec"], PodPlacement.from_dict(spec.get("placement") or {}))
    cfg = Settings()  # the supervisor's process reads its settings once, here
    sys.exit(Supervisor(job, Path(spec["output"]), spec.get("extensions", {}), cfg).run())


if __name__ == "__main__":
    main()
