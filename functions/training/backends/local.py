"""The local backend: each job runs under a detached supervisor process on this machine.

The supervisor (``cascade.functions.training.supervisor``) publishes the job's lifecycle
events itself; ``reconcile`` covers what it cannot: a supervisor that died (kill -9, reboot)
leaves its job ``failed`` with the reason, once, instead of ``running`` for ever.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cascade.core.errors import NotFound
from cascade.events import jobrecords as records
from cascade.functions.training.backends.base import Change
from cascade.functions.training.job import TrainingJob
from cascade.stores import StateStore


def _alive(pid: int) -> bool:
    if pid <= 0:  # no supervisor recorded (kill(0) would signal our own process group)
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (our own unreaped child) is dead too
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


class LocalBackend:
    name = "local"

    def __init__(self, artifact_root: Path, store: StateStore, env: Mapping[str, str]) -> None:
        self.root, self.store, self.env = artifact_root, store, dict(env)

    def output(self, job_id: str) -> Path:
        return self.root / job_id

    def launch(self, job: TrainingJob, extensions: Mapping[str, str]) -> None:
        out = self.output(job.id)
        out.mkdir(parents=True, exist_ok=True)
        spec_file = out / "job.json"
        spec_file.write_text(json.dumps({"id": job.id, "project": job.project, "spec": job.spec,
                                         "placement": job.placement.to_dict(), "output": str(out),
                                         "extensions": dict(extensions)}))
        with (out / "supervisor.log").open("ab") as log:
            proc = subprocess.Popen([sys.executable, "-P", "-m", "cascade.functions.training.supervisor", str(spec_file)],
                                    env={**os.environ, **self.env}, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        records.update(self.store, job.id, "launching", backend=self.name, supervisor=proc.pid,
                       placement=job.placement.to_dict(), project=job.project, spec=job.spec, extensions=dict(extensions))

    def _record(self, job_id: str) -> dict[str, Any]:
        record = self.store.get_record("job", job_id)
        if record is None or record.get("backend") != self.name:
            raise NotFound(f"no local job {job_id!r}")
        return record

    @staticmethod
    def _gone(record: dict[str, Any]) -> str | None:
        """For an unfinished job whose supervisor is dead: the status it ended in."""
        if record.get("status") in (*records.FINAL, "queued") or _alive(int(record.get("supervisor") or 0)):
            return None  # ended, or waiting for room again (preempted): nothing runs that could have died
        return "cancelled" if record.get("cancelRequested") else "failed"

    def status(self, job_id: str) -> str:
        record = self._record(job_id)
        return self._gone(record) or str(record.get("status"))

    def cancel(self, job_id: str, reason: str = "cancelled on request") -> None:
        if (records.get(self.store, job_id) or {}).get("status") == "queued":  # not running: the queue drops it
            records.update(self.store, job_id, "cancelled", reason=reason, requeued=False)
            return
        record = self._record(job_id)
        if record.get("status") in records.FINAL:
            return
        # Recorded first: a supervisor that has not started yet stops at once, and one killed
        # before it could report still ends as cancelled.
        records.update(self.store, job_id, str(record.get("status")), cancelRequested=True, cancelReason=reason)
        pid = int(record.get("supervisor") or 0)
        if pid and _alive(pid):
            os.kill(pid, signal.SIGTERM)  # the supervisor stops its workers and reports job.cancelled

    def logs(self, job_id: str) -> str:
        logs = sorted((self.output(job_id) / "logs").glob("*.log"))
        if not logs:
            raise NotFound(f"no logs for job {job_id!r} (yet)")
        return "".join(f"==> {p.name} <==\n{p.read_text(errors='replace')}" for p in logs)

    def reconcile(self) -> list[Change]:
        changes = []
        for record in records.find(self.store, backend=self.name):
            ended = self._gone(record)
            if ended is None:
                continue
            reason = "cancelled on request" if ended == "cancelled" else \
                "the job's supervisor process ended without reporting (killed, or the machine restarted)"
            records.update(self.store, record["id"], ended, reason=reason)
            changes.append(Change(record["id"], ended, {"reason": reason}, record.get("extensions") or {}))
        return changes
