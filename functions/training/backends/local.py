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

from cascade.core.errors import NotFound
from cascade.events import jobrecords as records
from cascade.functions.training.backends.base import Change
from cascade.functions.training.job import TrainingJob
from cascade.stores import StateStore


def _alive(pid: int) -> bool:
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
                                         "placement": job.placement, "output": str(out),
                                         "extensions": dict(extensions)}))
        with (out / "supervisor.log").open("ab") as log:
            proc = subprocess.Popen([sys.executable, "-m", "cascade.functions.training.supervisor", str(spec_file)],
                                    env={**os.environ, **self.env}, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        records.update(self.store, job.id, "launching", backend=self.name, supervisor=proc.pid,
                       placement=job.placement, project=job.project, spec=job.spec, extensions=dict(extensions))

    def _record(self, job_id: str) -> dict[str, object]:
        record = self.store.get_record("job", job_id)
        if record is None or record.get("backend") != self.name:
            raise NotFound(f"no local job {job_id!r}")
        return record

    def status(self, job_id: str) -> str:
        record = self._record(job_id)
        status = str(record.get("status"))
        if status not in records.FINAL and not _alive(int(str(record.get("supervisor", 0)))):
            return "failed"
        return status

    def cancel(self, job_id: str) -> None:
        record = self._record(job_id)
        if record.get("status") in records.FINAL:
            return
        pid = int(str(record.get("supervisor", 0)))
        if pid and _alive(pid):
            os.kill(pid, signal.SIGTERM)  # the supervisor stops its workers and reports job.cancelled
        else:
            records.update(self.store, job_id, "cancelled", reason="cancelled on request")

    def logs(self, job_id: str) -> str:
        logs = sorted((self.output(job_id) / "logs").glob("*.log"))
        if not logs:
            raise NotFound(f"no logs for job {job_id!r} (yet)")
        return "".join(f"==> {p.name} <==\n{p.read_text(errors='replace')}" for p in logs)

    def reconcile(self) -> list[Change]:
        changes = []
        for record in self.store.find_records("job", backend=self.name):
            if record.get("status") in records.FINAL:
                continue
            pid = int(record.get("supervisor") or 0)
            if pid and _alive(pid):
                continue
            reason = "the job's supervisor process ended without reporting (killed, or the machine restarted)"
            records.update(self.store, record["id"], "failed", reason=reason)
            changes.append(Change(record["id"], "failed", {"reason": reason}, record.get("extensions") or {}))
        return changes
