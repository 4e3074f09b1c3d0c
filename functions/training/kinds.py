"""Render a training job as the Kubernetes resource its framework's operator runs.

Kubeflow Training Operator kinds (``kubeflow.org/v1``: PyTorchJob, TFJob, XGBoostJob,
PaddleJob, JAXJob, MXJob, MPIJob), Volcano ``batch.volcano.sh/v1alpha1`` Job for DeepSpeed,
ColossalAI and Horovod, ``ray.io/v1`` RayJob and ``sparkoperator.k8s.io/v1beta2``
SparkApplication. Every pod template carries the matcher's image, nodeSelector,
tolerations and resource limits.
"""

from __future__ import annotations

import shlex
from typing import Any

from cascade.core import podsecurity
from cascade.core.secrets import secret_refs
from cascade.functions.training.job import TrainingJob

KUBEFLOW: dict[str, tuple[str, str, str, list[str]]] = {
    # framework: (kind, replica-specs key, container name, roles: first takes one replica, the last the rest)
    "pytorch": ("PyTorchJob", "pytorchReplicaSpecs", "pytorch", ["Master", "Worker"]),
    "tensorflow": ("TFJob", "tfReplicaSpecs", "tensorflow", ["Worker"]),
    "xgboost": ("XGBoostJob", "xgbReplicaSpecs", "xgboost", ["Master", "Worker"]),
    "paddle": ("PaddleJob", "paddleReplicaSpecs", "paddle", ["Worker"]),
    "jax": ("JAXJob", "jaxReplicaSpecs", "jax", ["Worker"]),
    "mxnet": ("MXJob", "mxReplicaSpecs", "mxnet", ["Scheduler", "Server", "Worker"]),
    "mpi": ("MPIJob", "mpiReplicaSpecs", "mpi", ["Launcher", "Worker"]),
    "sklearn": ("PyTorchJob", "pytorchReplicaSpecs", "pytorch", ["Master"]),
}
VOLCANO = ("deepspeed", "colossalai", "horovod")


def pod_template(job: TrainingJob, container: str, command: list[str], env: dict[str, str] | None = None,
                 labels: dict[str, str] | None = None) -> dict[str, Any]:
    p = job.placement
    resources = job.spec.get("resources", {})
    limits = {"cpu": resources.get("cpu", "1"), "memory": resources.get("memory", "2Gi"), **p.limits}
    spec: dict[str, Any] = {"securityContext": podsecurity.pod(), "containers": [{
        "name": container, "image": job.spec.get("image") or p.image, "command": command,
        "env": [{"name": k, "value": v} for k, v in sorted({**job.job_env("/output"), **(env or {})}.items())]
        + secret_env(job),
        "securityContext": podsecurity.container(),
        "resources": {"limits": limits, "requests": {"cpu": limits["cpu"], "memory": limits["memory"]}}}]}
    if p.node_selector:
        spec["nodeSelector"] = dict(p.node_selector)
    if p.tolerations:
        spec["tolerations"] = [dict(t) for t in p.tolerations]
    return {"metadata": {"labels": {"cascade.io/job": job.name, **(labels or {})}}, "spec": spec}


def secret_env(job: TrainingJob) -> list[dict[str, Any]]:
    """The secrets the job names, as references to Secrets of that name (key ``value``) in its namespace."""
    return secret_refs(job.spec.get("secrets", []))


def _run_policy(job: TrainingJob) -> dict[str, Any]:
    policy: dict[str, Any] = {"cleanPodPolicy": "Running", "backoffLimit": int(job.spec.get("retries", 0))}
    if job.spec.get("timeoutSeconds"):
        policy["activeDeadlineSeconds"] = int(job.spec["timeoutSeconds"])
    return policy


def _metadata(job: TrainingJob, namespace: str) -> dict[str, Any]:
    return {"name": job.name, "namespace": namespace,
            "labels": {"app.kubernetes.io/part-of": "cascade", "cascade.io/job": job.name,
                       "cascade.io/project": job.project, "cascade.io/framework": job.framework}}


def kubeflow(job: TrainingJob, namespace: str) -> dict[str, Any]:
    kind, key, container, roles = KUBEFLOW[job.framework]
    command = job.command()
    if job.framework == "pytorch" and job.procs > 1:
        command = ["torchrun", *command[1:]] if "-m" not in command[:2] else ["torchrun", "-m", *command[2:]]
    counts = {roles[0]: 1} if len(roles) > 1 else {roles[0]: job.workers}
    if job.framework == "mxnet":
        counts = {"Scheduler": 1, "Server": 1, "Worker": job.workers}
    elif len(roles) > 1 and job.workers > 1:
        counts[roles[-1]] = job.workers - 1
    if job.framework == "mpi":
        counts = {"Launcher": 1, "Worker": job.workers}
    replica_specs = {role: {"replicas": n, "restartPolicy": "OnFailure",
                            "template": pod_template(job, container, command)} for role, n in counts.items()}
    spec: dict[str, Any] = {key: replica_specs, "runPolicy": _run_policy(job)}
    if kind == "PyTorchJob" and job.framework == "pytorch":
        spec["nprocPerNode"] = str(job.procs)
    if kind == "MXJob":
        spec["jobMode"] = "MXTrain"
    if kind == "MPIJob":
        spec["slotsPerWorker"] = job.procs
    return {"apiVersion": "kubeflow.org/v1", "kind": kind, "metadata": _metadata(job, namespace), "spec": spec}


def volcano(job: TrainingJob, namespace: str, queue: str = "default") -> dict[str, Any]:
    launcher = {"deepspeed": ["deepspeed", "--hostfile", "/etc/volcano/worker.host"],
                "colossalai": ["colossalai", "run", "--hostfile", "/etc/volcano/worker.host",
                               "--nproc_per_node", str(job.procs)],
                "horovod": ["horovodrun", "-np", str(job.workers * job.procs), "--hostfile",
                            "/etc/volcano/worker.host"]}[job.framework]
    command = ["sh", "-c", shlex.join([*launcher, *job.command()[1:]])]
    return {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "metadata": _metadata(job, namespace),
            "spec": {"schedulerName": "volcano", "queue": queue, "minAvailable": job.workers,
                     "maxRetry": int(job.spec.get("retries", 0)),
                     "plugins": {"env": [], "svc": [], "ssh": []},
                     "policies": [{"event": "PodEvicted", "action": "RestartJob"}],
                     "tasks": [{"name": "worker", "replicas": job.workers,
                                "template": pod_template(job, job.framework, command)}]}}


def ray(job: TrainingJob, namespace: str) -> dict[str, Any]:
    head = pod_template(job, "ray-head", ["ray", "start", "--head", "--block"])
    worker = pod_template(job, "ray-worker", ["ray", "start", "--block", "--address=$(RAY_HEAD):6379"])
    spec: dict[str, Any] = {"entrypoint": job.shell_command(), "shutdownAfterJobFinishes": True,
                            "rayClusterSpec": {"headGroupSpec": {"rayStartParams": {"dashboard-host": "0.0.0.0"},
                                                                 "template": head},
                                               "workerGroupSpecs": [{"groupName": "workers",
                                                                     "replicas": max(0, job.workers - 1),
                                                                     "minReplicas": 0,
                                                                     "maxReplicas": max(0, job.workers - 1),
                                                                     "rayStartParams": {}, "template": worker}]}}
    if job.spec.get("timeoutSeconds"):
        spec["activeDeadlineSeconds"] = int(job.spec["timeoutSeconds"])
    return {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": _metadata(job, namespace), "spec": spec}


def spark(job: TrainingJob, namespace: str) -> dict[str, Any]:
    entry = job.spec["entrypoint"]
    p = job.placement
    resources = job.spec.get("resources", {})
    executor: dict[str, Any] = {"instances": job.workers, "cores": int(float(resources.get("cpu", "1"))),
                                "memory": str(resources.get("memory", "2Gi")).replace("Gi", "g"),
                                "securityContext": podsecurity.container()}
    if p.node_selector:
        executor["nodeSelector"] = dict(p.node_selector)
    if p.tolerations:
        executor["tolerations"] = [dict(t) for t in p.tolerations]
    gpu = next(((k, v) for k, v in p.limits.items() if k.endswith("/gpu")), None)
    if gpu:
        executor["gpu"] = {"name": gpu[0], "quantity": int(gpu[1])}
    return {"apiVersion": "sparkoperator.k8s.io/v1beta2", "kind": "SparkApplication",
            "metadata": _metadata(job, namespace),
            "spec": {"type": "Python", "pythonVersion": "3", "mode": "cluster", "sparkVersion": "3.5.3",
                     "image": job.spec.get("image") or p.image,
                     "mainApplicationFile": f"local://{entry.get('script', '/app/main.py')}",
                     "arguments": [str(a) for a in entry.get("args", [])],
                     "restartPolicy": {"type": "OnFailure" if job.spec.get("retries") else "Never",
                                       "onFailureRetries": int(job.spec.get("retries", 0))},
                     "driver": {"cores": 1, "memory": "1g", "serviceAccount": "cascade-spark",
                                "env": [{"name": k, "value": v} for k, v in sorted(job.job_env("/output").items())]
                                + secret_env(job), "securityContext": podsecurity.container()},
                     "executor": executor}}


def render(job: TrainingJob, namespace: str) -> dict[str, Any]:
    """The resource for ``job``'s framework."""
    if job.framework in VOLCANO:
        return volcano(job, namespace)
    if job.framework == "ray":
        return ray(job, namespace)
    if job.framework == "spark":
        return spark(job, namespace)
    return kubeflow(job, namespace)


def plural(kind: str) -> str:
    return {"Job": "jobs"}.get(kind, kind.lower() + "s")
