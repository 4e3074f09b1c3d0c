"""What a job may ask of the machine it runs on: entrypoints, secrets and size caps.

A project token can submit jobs, and on the local backend a job is a process on the
platform's own machine. So a local entrypoint is either a script inside the project's
workspace (``<workspaces>/<project>/``, placed there by whoever runs the platform) or a
module on a configured allowlist: ``-c``, option-like names, absolute paths and ``..`` are
refused at submission (HTTP 422) and again at launch. On Kubernetes the entrypoint is a path
inside the job's image, so only the caps apply. Every job gets a wall-clock limit (the
default when it sets none), at most ``max_workers`` workers, ``max_procs_per_worker``
processes each and ``max_retries`` restarts; and only the secrets its spec names. A local job whose
framework needs a launcher this machine lacks (``mpirun``, ``horovodrun``, ``deepspeed``, ``ray``) is
refused at submission, naming it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from cascade.core import secrets
from cascade.core.errors import InvalidInput, SchemaViolation
from cascade.core.settings import Settings
from cascade.functions.training import local_launch
from cascade.scheduling.accelerators import parse

BASE_ENV = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "VIRTUAL_ENV", "OMP_NUM_THREADS")
"""The only variables of the platform's environment a local job's workers inherit."""


@dataclass(frozen=True)
class JobPolicy:
    backend: str
    workspaces: Path
    modules: tuple[str, ...]
    max_workers: int
    max_procs: int
    max_retries: int
    default_timeout: int

    @classmethod
    def from_settings(cls, cfg: Settings) -> JobPolicy:
        t = cfg.training
        return cls(t.backend, cfg.workspaces, tuple(t.modules), t.max_workers, t.max_procs_per_worker, t.max_retries,
                   t.default_timeout_seconds)

    def check(self, kind: str, spec: Mapping[str, Any]) -> None:
        """Raise SchemaViolation (HTTP 422) naming the field a job may not ask for."""
        if kind != "training":
            return  # a fine-tune's entrypoint and size are the platform's own
        try:  # a malformed accelerator string is refused here, not when the job is placed
            parse(str((spec.get("resources") or {}).get("accelerator", "0")))
        except InvalidInput as exc:
            raise InvalidInput(str(exc), field="/spec/resources/accelerator") from exc
        for key, cap in (("workers", self.max_workers), ("procsPerWorker", self.max_procs),
                         ("retries", self.max_retries), ("timeoutSeconds", self.default_timeout)):
            if int(spec.get(key, 0)) > cap:
                raise SchemaViolation(f"{key} is at most {cap} on this platform", field=f"/spec/{key}")
        for i, name in enumerate(spec.get("secrets", [])):
            if not isinstance(name, str) or not name.replace("-", "").replace("_", "").isalnum():
                raise SchemaViolation("a secret name is letters, digits, '-' and '_'", field=f"/spec/secrets/{i}")
        if self.backend == "local":
            self._check_entrypoint(spec.get("entrypoint") or {})
            local_launch.check(spec)

    def _check_entrypoint(self, entry: Mapping[str, Any]) -> None:
        if "module" in entry:
            module = str(entry["module"])
            if not any(module == m or (m.endswith(".*") and module.startswith(m[:-1])) for m in self.modules):
                raise SchemaViolation(f"module {module!r} is not on this platform's allowlist "
                                      f"({', '.join(self.modules) or 'empty'}; setting training.modules)",
                                      field="/spec/entrypoint/module")
            return
        script = str(entry.get("script", ""))
        path = PurePosixPath(script)
        if script.startswith("-") or path.is_absolute() or ".." in path.parts or "\\" in script or not path.name:
            raise SchemaViolation(f"script {script!r} must be a relative path inside the project's workspace "
                                  "(no '-' options, absolute paths or '..')", field="/spec/entrypoint/script")

    def timeout(self, spec: Mapping[str, Any]) -> int:
        return int(spec.get("timeoutSeconds") or self.default_timeout)

    def workspace(self, project: str) -> Path:
        return self.workspaces / project

    def script(self, project: str, script: str) -> Path:
        """The script's real path, which must lie inside the project's workspace (symlinks resolved)."""
        root = self.workspace(project).resolve()
        path = (root / script).resolve()
        if not path.is_relative_to(root) or not path.is_file():
            raise InvalidInput(f"script {script!r} is not a file in the workspace of project {project!r} ({root}/)",
                               field="/spec/entrypoint/script")
        return path


def worker_base_env(environ: Mapping[str, str], spec: Mapping[str, Any], home: str) -> dict[str, str]:
    """A worker's environment before its framework's variables: no platform settings, only named secrets."""
    env = {k: environ[k] for k in BASE_ENV if k in environ}
    env["HOME"] = home
    env.update(secrets.resolve(spec.get("secrets", []), environ, owner="this platform", field="/spec/secrets"))
    return env


def drop_to(user: str) -> dict[str, Any]:
    """``subprocess.Popen`` options that run a child as ``user`` when this process is root; {} otherwise."""
    if os.geteuid() != 0 or not user:
        return {}
    import pwd

    entry = pwd.getpwnam(user)
    return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
