"""The local backend: each job runs under a detached supervisor process on this machine."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from cascade.core.errors import NotFound
from cascade.stores import StateStore
from cascade.functions.training import records
from cascade.functions.training.job import TrainingJob


class LocalBackend:
    name = "local"

    def __init__(self, artifact_root: Path, store: StateStore, env: dict[str, str]) -> None:
        self.root, self.store, self.env = artifact_root, store, env

    def output(self, job_id: str) -> Path:
        return self.root / job_id

    def launch(self, job: TrainingJob, extensions: dict[str, str]) -> None:
        out = self.output(job.id)
        out.mkdir(parents=True, exist_ok=True)
        spec_file = out / "job.json"
        spec_file.write_text(json.dumps({"id": job.id, "project": job.project, "spec": job.spec,
                                         "placement": job.placement, "output": str(out), "extensions": extensions}))
        log = (out / "supervisor.log").open("ab")
        proc = subprocess.Popen([sys.executable, "-m", "cascade.functions.training.supervisor", str(spec_file)],
                                env={**os.environ, **self.env}, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        records.update(self.store, job.id, "launching", backend=self.name, supervisor=proc.pid,
                       placement=job.placement, project=job.project, spec=job.spec)

    def cancel(self, job_id: str) -> None:
        record = self.store.get_record("job", job_id)
        if record is None:
            raise NotFound(f"no job {job_id!r}")
        if record.get("status") in records.FINAL:
            return
        pid = record.get("pid") or record.get("supervisor")
        if pid:
            try:
                os.kill(int(pid), signal.SIGTERM)
            except ProcessLookupError:
                pass

    def logs(self, job_id: str) -> str:
        logs = sorted((self.output(job_id) / "logs").glob("*.log"))
        if not logs:
            raise NotFound(f"no logs for job {job_id!r} (yet)")
        return "".join(f"==> {p.name} <==\n{p.read_text(errors='replace')}" for p in logs)
