"""Render a training job as the Kubernetes resource its framework's operator runs.

Kubeflow Training Operator v1.9 kinds (``kubeflow.org/v1``: PyTorchJob, TFJob, XGBoostJob,
PaddleJob, JAXJob, and MPIJob with ``mpirun`` on its launcher), Volcano
``batch.volcano.sh/v1alpha1`` Job for DeepSpeed, ColossalAI and Horovod (a launcher task that
reaches the workers' sshd through the ``ssh``/``svc`` plugins, with a ``slots=`` hostfile),
``ray.io/v1`` RayJob (KubeRay starts Ray itself) and ``sparkoperator.k8s.io/v1beta2``
SparkApplication. Every worker's pod template carries the matcher's image, nodeSelector,
tolerations and resource limits. MXNet has no operator kind any more (the training operator
dropped MXJob in v1.8), so it is refused here with that reason. A trial of an experiment
(``labels.trial``) also carries the metrics-reporter sidecar in each pod (Spark's driver and
executors excepted: their templates are the Spark operator's).
"""

from __future__ import annotations

import math
import shlex
from typing import Any

from cascade.core import podsecurity
from cascade.core.errors import InvalidInput
from cascade.core.secrets import secret_refs
from cascade.functions.training.job import TrainingJob
from cascade.scheduling.frameworks import REGISTRY, VERSION
from cascade.scheduling.placement import cpu_cores, memory_gib

KUBEFLOW: dict[str, tuple[str, str, str, list[str]]] = {
    # framework: (kind, replica-specs key, container name, roles: first takes one replica, the last the rest)
    "pytorch": ("PyTorchJob", "pytorchReplicaSpecs", "pytorch", ["Master", "Worker"]),
    "tensorflow": ("TFJob", "tfReplicaSpecs", "tensorflow", ["Worker"]),
    "xgboost": ("XGBoostJob", "xgbReplicaSpecs", "xgboost", ["Master", "Worker"]),
    "paddle": ("PaddleJob", "paddleReplicaSpecs", "paddle", ["Worker"]),
    "jax": ("JAXJob", "jaxReplicaSpecs", "jax", ["Worker"]),
    "mpi": ("MPIJob", "mpiReplicaSpecs", "mpi", ["Launcher", "Worker"]),
    "sklearn": ("PyTorchJob", "pytorchReplicaSpecs", "pytorch", ["Master"]),
}
VOLCANO = ("deepspeed", "colossalai", "horovod")
REFUSED = {"mxnet": "framework 'mxnet' cannot run on Kubernetes: the Kubeflow training operator removed MXJob in "
                    "v1.8 and MXNet itself is retired; run it with the local backend or port the job to PyTorch"}
SSH_PORT = 2222  # the workers' sshd runs unprivileged; the images' ssh client config points here too
SSHD = ("ssh-keygen -q -N '' -t ed25519 -f /tmp/ssh_host_ed25519_key && "
        "exec /usr/sbin/sshd -D -e -f /etc/cascade/sshd_config -h /tmp/ssh_host_ed25519_key")
OUTPUT = "/output"  # CASCADE_OUTPUT_DIR in every pod: an emptyDir
SPARK_ACCOUNT = "cascade-spark"  # Spark drivers create their executors: made in every project's namespace
LAUNCHER_LIMITS = {"cpu": "1", "memory": "1Gi"}  # a launcher only starts the workers' processes
# A trial's pods post their metrics.jsonl lines here (functions/training/reporter.py): the gateway's Knative Service
REPORT_URL = "http://cascade-gateway.cascade.svc.cluster.local/v1/jobs/{job}/reports"
REPORTER_LIMITS = {"cpu": "100m", "memory": "128Mi"}


def report_secret(job: TrainingJob) -> str:
    """The Secret (key ``token``) holding a trial's report credential, in the job's namespace."""
    return f"{job.name[:56]}-report"


def job_labels(job: TrainingJob) -> dict[str, str]:
    """The job's own labels as Kubernetes labels (``trial: "3"`` -> ``cascade.io/trial: "3"``)."""
    return {f"cascade.io/{k}": str(v) for k, v in sorted((job.spec.get("labels") or {}).items())}


def reporter(job: TrainingJob) -> dict[str, Any]:
    """The metrics-reporter, a native sidecar (it starts first and Kubernetes stops it after the job's container)."""
    env = {"CASCADE_OUTPUT_DIR": OUTPUT, "CASCADE_JOB_ID": job.id, "CASCADE_REPORT_URL": REPORT_URL.format(job=job.id)}
    return {"name": "metrics-reporter", "image": f"{REGISTRY}/function-runtime:{VERSION}",
            "command": ["python", "-m", "cascade.functions.training.reporter"], "restartPolicy": "Always",
            "env": [{"name": k, "value": v} for k, v in sorted(env.items())] + [
                {"name": "CASCADE_REPORT_TOKEN",
                 "valueFrom": {"secretKeyRef": {"name": report_secret(job), "key": "token"}}}],
            "securityContext": podsecurity.container(),
            "volumeMounts": [{"name": "output", "mountPath": OUTPUT}],
            "resources": {"limits": dict(REPORTER_LIMITS), "requests": dict(REPORTER_LIMITS)}}


def pod_template(job: TrainingJob, container: str, command: list[str] | None, env: dict[str, str] | None = None,
                 *, placed: bool = True) -> dict[str, Any]:
    """A pod template; ``placed=False`` for a launcher (no accelerator, any node). ``command=None`` keeps the
    image's (KubeRay adds its own ``ray start`` only to containers without one)."""
    p = job.placement
    resources = job.spec.get("resources", {})
    limits = ({"cpu": resources.get("cpu", "1"), "memory": resources.get("memory", "2Gi"), **p.limits} if placed
              else dict(LAUNCHER_LIMITS))
    main: dict[str, Any] = {
        "name": container, "image": job.spec.get("image") or p.image,
        "env": [{"name": k, "value": v} for k, v in sorted({**job.job_env(OUTPUT), **(env or {})}.items())]
        + secret_env(job),
        "securityContext": podsecurity.container(),
        # What the pod's status reports when the container ends: $CASCADE_OUTPUT_DIR/metrics.json (the metrics a job
        # writes, read back as job.succeeded's metrics) or, when there is none and it failed, its log's tail.
        "terminationMessagePath": f"{OUTPUT}/metrics.json", "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [{"name": "output", "mountPath": OUTPUT}],
        "resources": {"limits": limits, "requests": {"cpu": limits["cpu"], "memory": limits["memory"]}}}
    if command is not None:
        main["command"] = command
    spec: dict[str, Any] = {"securityContext": podsecurity.pod(), "containers": [main],
                            "volumes": [{"name": "output", "emptyDir": {}}]}
    if placed and p.node_selector:
        spec["nodeSelector"] = dict(p.node_selector)
    if placed and p.tolerations:
        spec["tolerations"] = [dict(t) for t in p.tolerations]
    if "trial" in (job.spec.get("labels") or {}):  # an experiment prunes on what its pods report while they run
        spec["initContainers"] = [reporter(job)]
    return {"metadata": {"labels": {"cascade.io/job": job.name, **job_labels(job)}}, "spec": spec}


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
                       "cascade.io/project": job.project, "cascade.io/framework": job.framework, **job_labels(job)}}


def kubeflow(job: TrainingJob, namespace: str) -> dict[str, Any]:
    kind, key, container, roles = KUBEFLOW[job.framework]
    command = job.command()
    if job.framework == "pytorch" and job.procs > 1:
        command = ["torchrun", *command[1:]] if "-m" not in command[:2] else ["torchrun", "-m", *command[2:]]
    counts = {roles[0]: 1} if len(roles) > 1 else {roles[0]: job.workers}
    if len(roles) > 1 and job.workers > 1:
        counts[roles[-1]] = job.workers - 1
    templates = {role: pod_template(job, container, command) for role in counts}
    spec: dict[str, Any] = {"runPolicy": _run_policy(job)}
    if kind == "PyTorchJob" and job.framework == "pytorch":
        spec["nprocPerNode"] = str(job.procs)
    if kind == "MPIJob":
        # The operator's launcher/worker contract: the launcher runs mpirun over the hostfile the operator
        # writes (/etc/mpi/hostfile, slots = slotsPerWorker) and reaches the workers through kubectl exec;
        # the workers only wait to be reached.
        counts = {"Launcher": 1, "Worker": job.workers}
        spec["slotsPerWorker"] = job.procs
        mpirun = ["mpirun", "-np", str(job.workers * job.procs), "--bind-to", "none", "--map-by", "slot",
                  "-x", "PYTHONUNBUFFERED", "-x", "CASCADE_HPARAMS", *command]
        templates = {"Launcher": pod_template(job, container, mpirun, placed=False),
                     "Worker": pod_template(job, container, ["sleep", "infinity"])}
    spec[key] = {role: {"replicas": n, "restartPolicy": "Never" if role == "Launcher" else "OnFailure",
                        "template": templates[role]} for role, n in counts.items()}
    return {"apiVersion": "kubeflow.org/v1", "kind": kind, "metadata": _metadata(job, namespace), "spec": spec}


def volcano(job: TrainingJob, namespace: str, queue: str = "default") -> dict[str, Any]:
    """A launcher task (one pod, no accelerator) and ``workers`` worker pods running sshd. The ``svc`` plugin
    writes ``/etc/volcano/worker.host`` (one host per line) and the ``ssh`` plugin shares a key pair; the
    launcher adds ``slots=`` and starts the framework's launcher over ssh. Its completion completes the job."""
    slots = job.procs
    script = job.command()[1:]  # deepspeed and colossalai take the script; horovodrun the whole command
    launcher = {"deepspeed": ["deepspeed", "--hostfile", "/tmp/hostfile", "--ssh_port", str(SSH_PORT), *script],
                "colossalai": ["colossalai", "run", "--hostfile", "/tmp/hostfile", "--nproc_per_node", str(slots),
                               "--ssh-port", str(SSH_PORT), *script],
                "horovod": ["horovodrun", "-np", str(job.workers * slots), "--hostfile", "/tmp/hostfile",
                            "-p", str(SSH_PORT), *job.command()]}[job.framework]
    hostfile = f"sed 's/$/ slots={slots}/' /etc/volcano/worker.host > /tmp/hostfile"
    if job.framework == "colossalai":  # its hostfile is one host per line; processes per node is a flag
        hostfile = "cp /etc/volcano/worker.host /tmp/hostfile"
    start = ["sh", "-c", f"{hostfile} && exec {shlex.join(launcher)}"]
    return {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "metadata": _metadata(job, namespace),
            "spec": {"schedulerName": "volcano", "queue": queue, "minAvailable": job.workers + 1,
                     "maxRetry": int(job.spec.get("retries", 0)),
                     "plugins": {"env": [], "svc": [], "ssh": ["--ssh-key-file-path=/home/cascade/.ssh"]},
                     "policies": [{"event": "PodEvicted", "action": "RestartJob"}],
                     "tasks": [{"name": "launcher", "replicas": 1,
                                "policies": [{"event": "TaskCompleted", "action": "CompleteJob"},
                                             {"event": "PodFailed", "action": "AbortJob"}],
                                "template": pod_template(job, job.framework, start, placed=False)},
                               {"name": "worker", "replicas": job.workers,
                                "template": pod_template(job, job.framework, ["sh", "-c", SSHD])}]}}


def ray(job: TrainingJob, namespace: str) -> dict[str, Any]:
    # No command: KubeRay generates `ray start` (the head, and workers pointed at the head's service) from
    # rayStartParams, and skips that for a container with a command of its own.
    head = pod_template(job, "ray-head", None)
    worker = pod_template(job, "ray-worker", None)
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


def spark_cores(cpu: object) -> tuple[int, str]:
    """Spark's whole ``cores`` (at least 1) and the Kubernetes request it came from (``500m`` stays ``500m``)."""
    return max(1, math.ceil(cpu_cores(cpu) - 1e-9)), str(cpu)


def spark_memory(memory: object) -> str:
    """A Kubernetes memory quantity (``512Mi``, ``2Gi``, ``1G``) in Spark's JVM form (``512m``, ``2048m``)."""
    return f"{max(1, int(memory_gib(memory) * 1024))}m"


def spark(job: TrainingJob, namespace: str) -> dict[str, Any]:
    entry = job.spec["entrypoint"]
    p = job.placement
    resources = job.spec.get("resources", {})
    cores, request = spark_cores(resources.get("cpu", "1"))
    labels = {"cascade.io/job": job.name, **job_labels(job)}  # the job's pods, found like every other kind's
    executor: dict[str, Any] = {"instances": job.workers, "cores": cores, "coreRequest": request, "labels": labels,
                                "memory": spark_memory(resources.get("memory", "2Gi")),
                                "securityContext": podsecurity.container()}
    if p.node_selector:
        executor["nodeSelector"] = dict(p.node_selector)
    if p.tolerations:
        executor["tolerations"] = [dict(t) for t in p.tolerations]
    gpu = next(((k, v) for k, v in p.limits.items() if k.endswith("/gpu") or k.startswith("gpu.")), None)
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
                     "driver": {"cores": 1, "memory": "1024m", "serviceAccount": SPARK_ACCOUNT, "labels": labels,
                                "env": [{"name": k, "value": v} for k, v in sorted(job.job_env(OUTPUT).items())]
                                + secret_env(job), "securityContext": podsecurity.container()},
                     "executor": executor}}


def render(job: TrainingJob, namespace: str) -> dict[str, Any]:
    """The resource for ``job``'s framework; InvalidInput for a framework no operator runs."""
    if job.framework in REFUSED:
        raise InvalidInput(REFUSED[job.framework], field="framework")
    if job.framework in VOLCANO:
        return volcano(job, namespace)
    if job.framework == "ray":
        return ray(job, namespace)
    if job.framework == "spark":
        return spark(job, namespace)
    return kubeflow(job, namespace)


def plural(kind: str) -> str:
    return {"Job": "jobs"}.get(kind, kind.lower() + "s")
