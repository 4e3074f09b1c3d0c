"""The environment each training operator injects, so one script runs locally and on a cluster.

``worker_env(framework, index, hosts, port)`` gives, for worker ``index`` of ``hosts``
(addresses of all workers, the first being the master/chief/coordinator), the variables the
Kubeflow, MPI or Volcano operator would set (design.md section 5). The local backend passes
``127.0.0.1`` for every host and distinct ports.
"""

from __future__ import annotations

import json


def _pytorch(i: int, hosts: list[str], port: int, procs: int) -> dict[str, str]:
    n = len(hosts)
    return {"MASTER_ADDR": hosts[0], "MASTER_PORT": str(port), "WORLD_SIZE": str(n * procs), "RANK": str(i * procs),
            "PET_MASTER_ADDR": hosts[0], "PET_MASTER_PORT": str(port), "PET_NNODES": str(n),
            "PET_NODE_RANK": str(i), "PET_NPROC_PER_NODE": str(procs), "PYTHONUNBUFFERED": "1"}


def _tensorflow(i: int, hosts: list[str], port: int, procs: int) -> dict[str, str]:
    cluster = {"worker": [f"{h}:{port + k}" for k, h in enumerate(hosts)]}
    return {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i},
                                     "environment": "cloud"})}


def _xgboost(i: int, hosts: list[str], port: int, procs: int) -> dict[str, str]:
    return {"MASTER_ADDR": hosts[0], "MASTER_PORT": str(port), "WORLD_SIZE": str(len(hosts)), "RANK": str(i),
            "WORKER_PORT": str(port + 1), "WORKER_ADDRS": ",".join(hosts[1:]),
            "DMLC_TRACKER_URI": hosts[0], "DMLC_TRACKER_PORT": str(port), "DMLC_TASK_ID": str(i),
            "DMLC_NUM_WORKER": str(len(hosts))}


def _paddle(i: int, hosts: list[str], port: int, procs: int) -> dict[str, str]:
    return {"PADDLE_MASTER": f"{hosts[0]}:{port}", "PADDLE_NNODES": str(len(hosts)), "PADDLE_JOB_ID": "",
            "PADDLE_TRAINER_NUM": str(len(hosts)), "PADDLE_SERVER_NUM": "0", "PADDLE_TRAINER_ID": str(i)}


def _jax(i: int, hosts: list[str], port: int, procs: int) -> dict[str, str]:
    return {"COORDINATOR_ADDRESS": hosts[0], "COORDINATOR_PORT": str(port), "NUM_PROCESSES": str(len(hosts)),
            "PROCESS_ID": str(i), "JAX_COORDINATOR_ADDRESS": f"{hosts[0]}:{port}",
            "JAX_NUM_PROCESSES": str(len(hosts)), "JAX_PROCESS_ID": str(i)}


def _mxnet(i: int, hosts: list[str], port: int, procs: int) -> dict[str, str]:
    return {"DMLC_PS_ROOT_URI": hosts[0], "DMLC_PS_ROOT_PORT": str(port), "DMLC_NUM_SERVER": "1",
            "DMLC_NUM_WORKER": str(len(hosts)), "DMLC_ROLE": "worker", "DMLC_WORKER_ID": str(i)}


def _mpi(i: int, hosts: list[str], port: int, procs: int) -> dict[str, str]:
    return {"OMPI_MCA_orte_default_hostfile": "/etc/mpi/hostfile", "OMPI_MCA_plm_rsh_agent": "/etc/mpi/kubexec.sh",
            "OMPI_COMM_WORLD_SIZE": str(len(hosts) * procs), "OMPI_COMM_WORLD_RANK": str(i)}


def _volcano(i: int, hosts: list[str], port: int, procs: int) -> dict[str, str]:
    return {"VC_TASK_INDEX": str(i), "VC_WORKER_HOSTS": ",".join(hosts), "VC_WORKER_NUM": str(len(hosts)),
            **_pytorch(i, hosts, port, procs)}


def _ray(i: int, hosts: list[str], port: int, procs: int) -> dict[str, str]:
    return {"RAY_ADDRESS": f"{hosts[0]}:{port}" if i else "local"}


def _spark(i: int, hosts: list[str], port: int, procs: int) -> dict[str, str]:
    return {"SPARK_MASTER": f"local[{max(1, len(hosts))}]"}


def _none(i: int, hosts: list[str], port: int, procs: int) -> dict[str, str]:
    return {}


WORKER_ENV = {"pytorch": _pytorch, "tensorflow": _tensorflow, "xgboost": _xgboost, "paddle": _paddle, "jax": _jax,
              "mxnet": _mxnet, "mpi": _mpi, "horovod": _volcano, "deepspeed": _volcano, "colossalai": _volcano,
              "ray": _ray, "spark": _spark, "sklearn": _none}


def worker_env(framework: str, index: int, hosts: list[str], port: int, procs: int = 1) -> dict[str, str]:
    return WORKER_ENV[framework](index, hosts, port, procs)
