"""A training job as the backends see it: the validated spec plus its id, project and roles."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from typing import Any

from cascade.events import schemas
from cascade.scheduling.accelerators import AcceleratorRequest, parse
from cascade.scheduling.placement import Job, PodPlacement, cpu_cores, memory_gib


@dataclass(frozen=True)
class TrainingJob:
    id: str
    project: str
    spec: dict[str, Any]
    placement: PodPlacement = field(default_factory=PodPlacement)

    @classmethod
    def from_spec(cls, job_id: str, project: str, spec: dict[str, Any]) -> TrainingJob:
        schemas.validate("trainingjob.v1", spec, prefix="/spec")
        return cls(job_id, project, spec)

    @property
    def framework(self) -> str:
        return str(self.spec["framework"])

    @property
    def workers(self) -> int:
        return int(self.spec.get("workers", 1))

    @property
    def procs(self) -> int:
        return int(self.spec.get("procsPerWorker", 1))

    @property
    def accelerator(self) -> AcceleratorRequest:
        return parse(self.spec.get("resources", {}).get("accelerator", "0"))

    @property
    def name(self) -> str:
        """A Kubernetes name for the job's resources."""
        return self.id.lower().replace("_", "-")[:63]

    def matcher_job(self, queue: str = "default") -> Job:
        """What the scheduler books: cards per worker, and the cores and host memory each worker's pod asks for."""
        resources = self.spec.get("resources", {})
        return Job(self.id, self.accelerator, self.workers, self.framework, self.project, queue,
                   cpu=cpu_cores(resources.get("cpu", "1")), memory_gib=memory_gib(resources.get("memory", "2Gi")),
                   rdma=bool(resources.get("rdma", False)))

    def command(self, python: str = "python") -> list[str]:
        entry = self.spec["entrypoint"]
        args = [str(a) for a in entry.get("args", [])]
        head = [python, "-m", entry["module"]] if "module" in entry else [python, entry["script"]]
        return head + args

    def shell_command(self) -> str:
        return shlex.join(self.command())

    def job_env(self, output: str) -> dict[str, str]:
        """What every worker gets besides the operator's variables."""
        env = {"CASCADE_JOB_ID": self.id, "CASCADE_PROJECT": self.project, "CASCADE_OUTPUT_DIR": output,
               "CASCADE_HPARAMS": json.dumps(self.spec.get("hyperparameters", {}), sort_keys=True),
               "PYTHONUNBUFFERED": "1"}
        if self.spec.get("dataset"):
            env["CASCADE_DATASET"] = str(self.spec["dataset"])
        return env
