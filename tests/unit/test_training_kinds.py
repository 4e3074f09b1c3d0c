"""Every framework adapter: the operator resource field by field, and the local env names."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from cascade.core.errors import InvalidInput
from cascade.functions.training import kinds, local_launch
from cascade.functions.training.env import worker_env
from cascade.functions.training.job import TrainingJob
from cascade.scheduling.accelerators import parse
from cascade.scheduling.matcher import Matcher
from cascade.scheduling.placement import Inventory

INVENTORY = {"flavors": [{"name": "a100", "vendor": "nvidia", "model": "A100", "memoryGiB": 80,
                          "nodeLabels": {"gpu-type": "A100"},
                          "taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}],
                          "nodes": [{"name": f"n{i}", "cards": 8} for i in range(4)]}]}


def placed(framework: str, workers: int = 3, procs: int = 1, **spec: Any) -> TrainingJob:
    body = {"framework": framework, "entrypoint": {"script": "/app/train.py", "args": ["--epochs", "2"]},
            "workers": workers, "procsPerWorker": procs, "resources": {"accelerator": "2(A100)", "cpu": "4",
                                                                         "memory": "16Gi"},
            "hyperparameters": {"lr": 0.1}, "timeoutSeconds": 3600, "retries": 2, **spec}
    job = TrainingJob.from_spec("job-Abc", "vision", body)
    placement = Matcher(Inventory.from_dict(INVENTORY)).place(job.matcher_job())
    return TrainingJob(job.id, job.project, job.spec, placement.pod())


def check_template(template: dict[str, Any], container: str, image: str) -> dict[str, Any]:
    spec = template["spec"]
    assert spec["nodeSelector"] == {"gpu-type": "A100"}
    assert spec["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    [c] = spec["containers"]
    assert c["name"] == container and c["image"] == image
    assert spec["securityContext"] == {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    assert c["terminationMessagePath"] == "/output/metrics.json", "metrics.json comes back in the pod's status"
    assert c["volumeMounts"] == [{"name": "output", "mountPath": "/output"}]
    assert spec["volumes"] == [{"name": "output", "emptyDir": {}}]
    assert c["securityContext"]["allowPrivilegeEscalation"] is False and c["securityContext"]["capabilities"] == {
        "drop": ["ALL"]}
    assert c["resources"]["limits"] == {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "2"}
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["CASCADE_JOB_ID"] == "job-Abc" and json.loads(env["CASCADE_HPARAMS"]) == {"lr": 0.1}
    assert "MASTER_ADDR" not in env, "the operator injects the rendezvous variables"
    return c


@pytest.mark.parametrize("framework, kind, key, container, replicas", [
    ("pytorch", "PyTorchJob", "pytorchReplicaSpecs", "pytorch", {"Master": 1, "Worker": 2}),
    ("tensorflow", "TFJob", "tfReplicaSpecs", "tensorflow", {"Worker": 3}),
    ("xgboost", "XGBoostJob", "xgbReplicaSpecs", "xgboost", {"Master": 1, "Worker": 2}),
    ("paddle", "PaddleJob", "paddleReplicaSpecs", "paddle", {"Worker": 3}),
    ("jax", "JAXJob", "jaxReplicaSpecs", "jax", {"Worker": 3}),
])
def test_kubeflow_kinds(framework: str, kind: str, key: str, container: str, replicas: dict[str, int]) -> None:
    job = placed(framework)
    r = kinds.render(job, "vision")
    assert (r["apiVersion"], r["kind"]) == ("kubeflow.org/v1", kind)
    assert r["metadata"]["name"] == "job-abc" and r["metadata"]["namespace"] == "vision"
    assert r["metadata"]["labels"]["cascade.io/framework"] == framework
    specs = r["spec"][key]
    assert {role: s["replicas"] for role, s in specs.items()} == replicas
    assert all(s["restartPolicy"] == "OnFailure" for s in specs.values())
    assert r["spec"]["runPolicy"] == {"cleanPodPolicy": "Running", "backoffLimit": 2, "activeDeadlineSeconds": 3600}
    for s in specs.values():
        c = check_template(s["template"], container, job.placement.image)
        assert c["command"] == ["python", "/app/train.py", "--epochs", "2"]
        assert c["terminationMessagePolicy"] == "FallbackToLogsOnError"


def test_mpijob_launches_with_mpirun_and_workers_wait() -> None:
    job = placed("mpi", workers=3, procs=2)
    r = kinds.render(job, "vision")
    assert r["kind"] == "MPIJob" and r["spec"]["slotsPerWorker"] == 2
    specs = r["spec"]["mpiReplicaSpecs"]
    assert {role: s["replicas"] for role, s in specs.items()} == {"Launcher": 1, "Worker": 3}
    [launcher] = specs["Launcher"]["template"]["spec"]["containers"]
    assert launcher["command"][:3] == ["mpirun", "-np", "6"], "one process per slot of every worker"
    assert launcher["command"][-4:] == ["python", "/app/train.py", "--epochs", "2"]
    assert "nvidia.com/gpu" not in launcher["resources"]["limits"], "the launcher needs no card"
    assert "nodeSelector" not in specs["Launcher"]["template"]["spec"]
    assert specs["Launcher"]["restartPolicy"] == "Never"
    worker = check_template(specs["Worker"]["template"], "mpi", job.placement.image)
    assert worker["command"] == ["sleep", "infinity"], "mpirun reaches the workers; they do not run train.py"


def test_mxnet_is_refused_with_the_reason() -> None:
    with pytest.raises(InvalidInput, match="removed MXJob in v1.8"):
        kinds.render(placed("mxnet"), "vision")


def test_pytorch_processes_per_worker_use_torchrun() -> None:
    r = kinds.render(placed("pytorch", workers=2, procs=4), "vision")
    assert r["spec"]["nprocPerNode"] == "4"
    assert r["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["command"][:2] == [
        "torchrun", "/app/train.py"]


@pytest.mark.parametrize("framework, launcher", [
    ("deepspeed", "deepspeed --hostfile /tmp/hostfile --ssh_port 2222 /app/train.py"),
    ("colossalai", "colossalai run --hostfile /tmp/hostfile --nproc_per_node 2 --ssh-port 2222 /app/train.py"),
    ("horovod", "horovodrun -np 6 --hostfile /tmp/hostfile -p 2222 python /app/train.py")])
def test_volcano_jobs(framework: str, launcher: str) -> None:
    job = placed(framework, procs=2)
    r = kinds.render(job, "vision")
    assert (r["apiVersion"], r["kind"]) == ("batch.volcano.sh/v1alpha1", "Job")
    spec = r["spec"]
    assert (spec["schedulerName"], spec["queue"], spec["minAvailable"], spec["maxRetry"]) == ("volcano", "default", 4, 2)
    assert spec["plugins"] == {"env": [], "svc": [], "ssh": ["--ssh-key-file-path=/home/cascade/.ssh"]}
    first, workers = spec["tasks"]
    assert (first["name"], first["replicas"], workers["name"], workers["replicas"]) == ("launcher", 1, "worker", 3)
    assert {"event": "TaskCompleted", "action": "CompleteJob"} in first["policies"]
    [starter] = first["template"]["spec"]["containers"]
    assert "nvidia.com/gpu" not in starter["resources"]["limits"], "only workers hold cards"
    script = starter["command"][2]
    assert starter["command"][:2] == ["sh", "-c"] and f"exec {launcher} --epochs 2" in script
    if framework != "colossalai":
        assert "sed 's/$/ slots=2/' /etc/volcano/worker.host > /tmp/hostfile" in script
    worker = check_template(workers["template"], framework, job.placement.image)
    assert worker["command"][:2] == ["sh", "-c"] and "/usr/sbin/sshd -D" in worker["command"][2]
    hostile = TrainingJob(job.id, job.project, {**job.spec, "entrypoint": {"script": "/app/train.py",
                                                                           "args": ["x; rm -rf / #", "$(id)"]}},
                          job.placement)
    command = kinds.render(hostile, "vision")["spec"]["tasks"][0]["template"]["spec"]["containers"][0]["command"][2]
    assert shlex.split(command.split(" && exec ", 1)[1])[-2:] == ["x; rm -rf / #", "$(id)"], \
        "user arguments stay single words for sh -c"


def test_ray_job() -> None:
    job = placed("ray")
    r = kinds.render(job, "vision")
    assert (r["apiVersion"], r["kind"]) == ("ray.io/v1", "RayJob")
    assert r["spec"]["entrypoint"] == "python /app/train.py --epochs 2"
    assert r["spec"]["shutdownAfterJobFinishes"] is True and r["spec"]["activeDeadlineSeconds"] == 3600
    cluster = r["spec"]["rayClusterSpec"]
    head = check_template(cluster["headGroupSpec"]["template"], "ray-head", job.placement.image)
    [workers] = cluster["workerGroupSpecs"]
    assert workers["replicas"] == 2 and workers["groupName"] == "workers"
    worker = check_template(workers["template"], "ray-worker", job.placement.image)
    assert "command" not in head and "command" not in worker, "KubeRay starts Ray only in containers without one"
    assert "RAY_HEAD" not in str(r), "KubeRay points the workers at the head itself"


@pytest.mark.parametrize("cpu, memory, cores, asked, jvm", [
    ("500m", "512Mi", 1, "500m", "512m"), ("2", "2Gi", 2, "2", "2048m"), ("1.5", "1G", 2, "1.5", "953m")])
def test_spark_converts_kubernetes_quantities(cpu: str, memory: str, cores: int, asked: str, jvm: str) -> None:
    executor = kinds.render(placed("spark", resources={"accelerator": "1(A100)", "cpu": cpu, "memory": memory}),
                            "v")["spec"]["executor"]
    assert (executor["cores"], executor["coreRequest"], executor["memory"]) == (cores, asked, jvm)
    with pytest.raises(InvalidInput, match="not a Kubernetes CPU quantity") as bad:
        kinds.spark_cores("lots")
    assert bad.value.field == "resources.cpu"


def test_spark_application() -> None:
    job = placed("spark")
    r = kinds.render(job, "vision")
    assert (r["apiVersion"], r["kind"]) == ("sparkoperator.k8s.io/v1beta2", "SparkApplication")
    s = r["spec"]
    assert (s["type"], s["mode"], s["mainApplicationFile"], s["arguments"]) == (
        "Python", "cluster", "local:///app/train.py", ["--epochs", "2"])
    assert s["image"] == job.placement.image and s["restartPolicy"] == {"type": "OnFailure", "onFailureRetries": 2}
    assert s["driver"]["serviceAccount"] == "cascade-spark" and s["driver"]["memory"] == "1024m"
    assert s["executor"] == {"instances": 3, "cores": 4, "coreRequest": "4", "memory": "16384m", "labels": {"cascade.io/job": "job-abc"}, "nodeSelector": {"gpu-type": "A100"},
                             "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                             "gpu": {"name": "nvidia.com/gpu", "quantity": 2},
                             "securityContext": {"runAsNonRoot": True, "allowPrivilegeEscalation": False,
                                                 "capabilities": {"drop": ["ALL"]},
                                                 "seccompProfile": {"type": "RuntimeDefault"}}}


HOSTS = ["10.0.0.1", "10.0.0.2", "10.0.0.3"]


@pytest.mark.parametrize("framework, index, expected", [
    ("pytorch", 1, {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "23456", "WORLD_SIZE": "6", "RANK": "2",
                    "PET_MASTER_ADDR": "10.0.0.1", "PET_MASTER_PORT": "23456", "PET_NNODES": "3",
                    "PET_NODE_RANK": "1", "PET_NPROC_PER_NODE": "2", "PYTHONUNBUFFERED": "1"}),
    ("xgboost", 2, {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "23456", "WORLD_SIZE": "3", "RANK": "2",
                    "WORKER_PORT": "23457", "WORKER_ADDRS": "10.0.0.2,10.0.0.3", "DMLC_TRACKER_URI": "10.0.0.1",
                    "DMLC_TRACKER_PORT": "23456", "DMLC_TASK_ID": "2", "DMLC_NUM_WORKER": "3"}),
    ("paddle", 1, {"PADDLE_MASTER": "10.0.0.1:23456", "PADDLE_NNODES": "3", "PADDLE_JOB_ID": "",
                   "PADDLE_TRAINER_NUM": "3", "PADDLE_SERVER_NUM": "0", "PADDLE_TRAINER_ID": "1"}),
    ("jax", 2, {"COORDINATOR_ADDRESS": "10.0.0.1", "COORDINATOR_PORT": "23456", "NUM_PROCESSES": "3",
                "PROCESS_ID": "2", "JAX_COORDINATOR_ADDRESS": "10.0.0.1:23456", "JAX_NUM_PROCESSES": "3",
                "JAX_PROCESS_ID": "2"}),
    ("mxnet", 0, {"DMLC_PS_ROOT_URI": "10.0.0.1", "DMLC_PS_ROOT_PORT": "23456", "DMLC_NUM_SERVER": "1",
                  "DMLC_NUM_WORKER": "3", "DMLC_ROLE": "worker", "DMLC_WORKER_ID": "0"}),
])
def test_local_env_uses_the_operators_names(framework: str, index: int, expected: dict[str, str]) -> None:
    assert worker_env(framework, index, HOSTS, 23456, procs=2 if framework == "pytorch" else 1) == expected


def test_tf_config_mpi_and_volcano_env() -> None:
    tf = json.loads(worker_env("tensorflow", 1, HOSTS, 23456)["TF_CONFIG"])
    assert tf == {"cluster": {"worker": ["10.0.0.1:23456", "10.0.0.2:23457", "10.0.0.3:23458"]},
                  "task": {"type": "worker", "index": 1}, "environment": "cloud"}
    mpi = worker_env("mpi", 0, HOSTS, 1)
    assert mpi["OMPI_MCA_orte_default_hostfile"] == "/etc/mpi/hostfile"
    assert mpi["OMPI_MCA_plm_rsh_agent"] == "/etc/mpi/kubexec.sh"
    vc = worker_env("deepspeed", 2, HOSTS, 29500)
    assert (vc["VC_TASK_INDEX"], vc["VC_WORKER_HOSTS"], vc["VC_WORKER_NUM"]) == ("2", ",".join(HOSTS), "3")


def test_every_framework_of_the_matrix_renders() -> None:
    for framework in ("pytorch", "tensorflow", "xgboost", "paddle", "jax", "mpi", "horovod", "deepspeed",
                      "colossalai", "ray", "spark"):
        assert kinds.render(placed(framework), "ns")["metadata"]["name"] == "job-abc"
    assert parse("2(A100)").cards == 2


def test_a_trial_carries_its_labels_and_the_metrics_reporter_with_its_credential_from_a_secret() -> None:
    trial = placed("pytorch", workers=2, labels={"experiment": "exp-1a2b", "trial": "3"})
    resource = kinds.render(trial, "cascade-vision")
    assert resource["metadata"]["labels"]["cascade.io/trial"] == "3"
    assert resource["metadata"]["labels"]["cascade.io/experiment"] == "exp-1a2b"
    for role in ("Master", "Worker"):
        template = resource["spec"]["pytorchReplicaSpecs"][role]["template"]
        assert template["metadata"]["labels"]["cascade.io/trial"] == "3"
        [sidecar] = template["spec"]["initContainers"]
        assert sidecar["restartPolicy"] == "Always", "a native sidecar: it does not hold the pod open"
        assert sidecar["command"] == ["python", "-m", "cascade.functions.training.reporter"]
        assert sidecar["volumeMounts"] == [{"name": "output", "mountPath": "/output"}]
        env = {e["name"]: e for e in sidecar["env"]}
        assert env["CASCADE_REPORT_URL"]["value"].endswith("/v1/jobs/job-Abc/reports")
        assert "value" not in env["CASCADE_REPORT_TOKEN"], "the credential never sits in the resource"
        assert env["CASCADE_REPORT_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "job-abc-report", "key": "token"}}
        assert sidecar["securityContext"]["allowPrivilegeEscalation"] is False
    plain = kinds.render(placed("pytorch"), "cascade-vision")
    assert "initContainers" not in plain["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    assert not any(k in plain["metadata"]["labels"] for k in ("cascade.io/trial", "cascade.io/experiment"))


def test_a_report_credential_is_one_jobs_and_needs_the_platform_credential() -> None:
    from cascade.core.credentials import job_credential, reports_for

    token = job_credential("casp_platform", "exp-1-t0")
    assert reports_for(token, "casp_platform", "exp-1-t0")
    assert not reports_for(token, "casp_platform", "exp-1-t1"), "another job's reports"
    assert not reports_for(token, "casp_other", "exp-1-t0"), "another platform's"
    assert not reports_for(job_credential("", "exp-1-t0"), "", "exp-1-t0"), "no platform credential, no credential"


def local(framework: str, workers: int = 2, procs: int = 1, **spec: Any) -> TrainingJob:
    return TrainingJob.from_spec("job-local", "default", {"framework": framework, "entrypoint": {"script": "train.py"},
                                                           "workers": workers, "procsPerWorker": procs, **spec})


@pytest.mark.parametrize("framework, expected", [
    ("mpi", ["mpirun", "--oversubscribe", "-np", "4", "--host", "localhost:4", "py", "train.py"]),
    ("horovod", ["horovodrun", "-np", "4", "-H", "localhost:4", "py", "train.py"]),
])
def test_mpi_and_horovod_run_once_under_their_launcher_over_local_slots(framework: str, expected: list[str],
                                                                      tmp_path: Path) -> None:
    [proc] = local_launch.plan(local(framework, procs=2), "py", 5000, tmp_path, {})
    assert proc.command == expected and proc.main


def test_deepspeed_gets_a_hostfile_of_local_slots(tmp_path: Path) -> None:
    [proc] = local_launch.plan(local("deepspeed", procs=2), "py", 5000, tmp_path, {})
    assert proc.command == ["deepspeed", "--hostfile", str(tmp_path / "hostfile"), "--master_port", "5000", "train.py"]
    assert (tmp_path / "hostfile").read_text() == "localhost slots=4\n"


def test_a_multi_worker_ray_job_starts_a_head_joins_the_others_and_runs_its_entrypoint_once(tmp_path: Path) -> None:
    procs = local_launch.plan(local("ray", workers=3, resources={"cpu": "2"}), "py", 6379, tmp_path, {})
    head, *joined, driver = procs
    assert head.command[:4] == ["ray", "start", "--head", "--block"] and "--port=6379" in head.command
    assert not head.main and "--num-cpus=2" in head.command
    assert [p.command[3] for p in joined] == ["--address=127.0.0.1:6379"] * 2 and not any(p.main for p in joined)
    assert driver.main and driver.command == ["py", "train.py"] and driver.env == {"RAY_ADDRESS": "127.0.0.1:6379"}


def test_a_multi_worker_spark_job_is_one_driver_with_an_executor_per_worker(tmp_path: Path) -> None:
    [driver] = local_launch.plan(local("spark", workers=3, resources={"cpu": "500m", "memory": "1Gi"}), "py", 1,
                                 tmp_path, {})
    assert driver.env == {"SPARK_MASTER": "local-cluster[3,1,1024]"} and driver.command == ["py", "train.py"]


def test_a_missing_launcher_is_named_with_how_to_get_it(tmp_path: Path) -> None:
    for framework, tool in (("mpi", "mpirun"), ("horovod", "horovodrun"), ("deepspeed", "deepspeed"), ("ray", "ray")):
        why = local_launch.missing_tool(framework, 2, path=str(tmp_path))
        assert why is not None and repr(tool) in why and "install" in why
        (tmp_path / tool).write_text("#!/bin/sh\n")
        (tmp_path / tool).chmod(0o755)
        assert local_launch.missing_tool(framework, 2, path=str(tmp_path)) is None
    assert local_launch.missing_tool("ray", 1, path="") is None, "one Ray worker needs no command"
    assert local_launch.missing_tool("pytorch", 4, path="") is None


def test_a_worker_that_died_on_an_import_names_the_framework_and_the_package() -> None:
    tail = 'Traceback (most recent call last):\n  File "train.py", line 1\nModuleNotFoundError: No module named \'paddle\'\n'
    assert local_launch.not_installed(tail) == "framework paddle is not installed in this environment " \
                                               "(pip install paddlepaddle)"
    assert local_launch.not_installed("ModuleNotFoundError: No module named 'mylib.sub'") == \
        "module 'mylib' is not installed in this environment (pip install mylib)"
    assert local_launch.not_installed("RuntimeError: CUDA out of memory") is None
