"""How each framework's job starts on one machine: the local backend's stand-in for its operator's launcher.

Most frameworks run one process per worker with the operator's variables (``env.worker_env``).
The rest need a launcher, as on a cluster: MPI jobs start under ``mpirun``, Horovod under
``horovodrun`` and DeepSpeed under ``deepspeed``, each over ``workers x procsPerWorker`` local
slots; a Ray job with several workers starts a head (worker 0) and joins the others to it, then
runs its entrypoint once against that cluster; a Spark job runs one driver with one executor
per worker (``local-cluster[N,cores,MiB]``). A launcher that is not installed refuses the job at
submission, naming the tool and how to get it, instead of a job that hangs or fails later.
"""

from __future__ import annotations

import math
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cascade.core.errors import InvalidInput
from cascade.functions.training.job import TrainingJob
from cascade.scheduling.placement import cpu_cores, memory_gib

TOOLS = {  # framework: (command, how to install it)
    "mpi": ("mpirun", "apt install openmpi-bin, or your MPI's package"),
    "horovod": ("horovodrun", "pip install horovod"),
    "deepspeed": ("deepspeed", "pip install deepspeed"),
    "ray": ("ray", "pip install 'ray[default]'"),
}
PACKAGES = {  # the module a framework's script imports first: (framework, what pip installs)
    "torch": ("pytorch", "torch"), "tensorflow": ("tensorflow", "tensorflow"), "xgboost": ("xgboost", "xgboost"),
    "paddle": ("paddle", "paddlepaddle"), "jax": ("jax", "jax"), "mxnet": ("mxnet", "mxnet"),
    "horovod": ("horovod", "horovod"), "deepspeed": ("deepspeed", "deepspeed"),
    "colossalai": ("colossalai", "colossalai"), "ray": ("ray", "'ray[default]'"), "pyspark": ("spark", "pyspark"),
    "sklearn": ("sklearn", "scikit-learn"), "mpi4py": ("mpi", "mpi4py"),
}
_MISSING = re.compile(r"ModuleNotFoundError: No module named '([A-Za-z0-9_.]+)'")


def missing_tool(framework: str, workers: int, path: str | None = None) -> str | None:
    """Why this machine cannot launch such a job (its framework's launcher is not on PATH), or None."""
    if framework not in TOOLS or (framework == "ray" and workers == 1):
        return None  # one Ray worker is ray.init() inside the script: no command needed
    tool, install = TOOLS[framework]
    if shutil.which(tool, path=path):
        return None
    return f"framework {framework!r} with the local backend runs under {tool!r}, which is not installed on this " \
           f"machine ({install})"


def check(spec: Mapping[str, Any]) -> None:
    """InvalidInput (refused at submission) when the job's launcher is missing here."""
    why = missing_tool(str(spec.get("framework", "")), int(spec.get("workers", 1)))
    if why:
        raise InvalidInput(why, field="/spec/framework")


def not_installed(log_tail: str) -> str | None:
    """'framework X is not installed in this environment (pip install ...)' for a worker that died on an import."""
    match = _MISSING.search(log_tail)
    if not match:
        return None
    module = match.group(1).split(".")[0]
    framework, package = PACKAGES.get(module, (None, module))
    what = f"framework {framework}" if framework else f"module {module!r}"
    return f"{what} is not installed in this environment (pip install {package})"


@dataclass(frozen=True)
class Process:
    """One process the supervisor starts: its command, its own variables, and whether the job waits for it."""

    command: list[str]
    env: dict[str, str] = field(default_factory=dict)
    main: bool = True  # False: a helper (a Ray node) stopped once the main processes are done
    worker: int = 0


def slots(job: TrainingJob) -> int:
    return job.workers * job.procs


def plan(job: TrainingJob, python: str, port: int, output: Path,
         worker_envs: Mapping[int, dict[str, str]]) -> list[Process]:
    """The processes that run ``job`` here; ``port`` is free (with a few after it); ``worker_envs[i]`` is
    worker i's operator variables."""
    script = job.command(python)
    n = slots(job)
    if job.framework == "mpi":
        return [Process(["mpirun", "--oversubscribe", "-np", str(n), "--host", f"localhost:{n}", *script])]
    if job.framework == "horovod":
        return [Process(["horovodrun", "-np", str(n), "-H", f"localhost:{n}", *script])]
    if job.framework == "deepspeed":
        hostfile = output / "hostfile"
        hostfile.write_text(f"localhost slots={n}\n")
        return [Process(["deepspeed", "--hostfile", str(hostfile), "--master_port", str(port), *script[1:]])]
    if job.framework == "ray" and job.workers > 1:
        head = f"127.0.0.1:{port}"
        cpus = str(max(1, math.floor(cpu_cores(job.spec.get("resources", {}).get("cpu", "1")))))
        nodes = [Process(["ray", "start", "--head", "--block", f"--port={port}", f"--num-cpus={cpus}",
                          "--disable-usage-stats", "--include-dashboard=false"], main=False, worker=0)]
        nodes += [Process(["ray", "start", "--block", f"--address={head}", f"--num-cpus={cpus}"], main=False, worker=i)
                  for i in range(1, job.workers)]
        return [*nodes, Process(script, {"RAY_ADDRESS": head})]
    if job.framework == "spark":
        resources = job.spec.get("resources", {})
        cores = max(1, math.floor(cpu_cores(resources.get("cpu", "1"))))
        mib = max(512, int(memory_gib(resources.get("memory", "2Gi")) * 1024))
        master = f"local-cluster[{job.workers},{cores},{mib}]" if job.workers > 1 else f"local[{cores}]"
        return [Process(script, {"SPARK_MASTER": master})]  # one driver; the executors are Spark's own
    command = script
    if job.framework == "pytorch" and job.procs > 1:
        command = [python, "-m", "torch.distributed.run", *script[1:]]
    return [Process(command, worker_envs[i], worker=i) for i in range(job.workers)]
