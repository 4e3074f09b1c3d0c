"""The cluster form against a real kube-apiserver with the upstream CRDs (tests/helpers/kube.py).

The example overlay applies server-side; every kind Cascade renders for every framework ×
accelerator pair is accepted by a strict server-side dry run; each ServiceAccount can do what
its code calls and nothing else, as the API server's RBAC evaluates it; and the Kubernetes
training backend, holding the launcher's and the job watcher's own ServiceAccount tokens, runs
jobs of four operators through their whole life while a test controller plays the operator;
deploy-model, with its own token, runs a release to model.deployed or model.deploy_failed.
"""

from __future__ import annotations

import base64
import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from cascade.core.credentials import job_credential
from cascade.core.errors import InvalidInput, PermanentError
from cascade.core.settings import Settings
from cascade.events.bus.embedded import EmbeddedBus
from cascade.events.envelope import new_event
from cascade.functions.finetune.render import pytorchjob
from cascade.functions.models import Models
from cascade.functions.platform import PLATFORM_FUNCTIONS
from cascade.functions.spec import discover
from cascade.functions.training import kinds
from cascade.functions.training.backends.kubernetes import KubernetesBackend
from cascade.functions.training.job import TrainingJob
from cascade.functions.training.watch import JobWatcher
from cascade.render import manifests
from cascade.scheduling.frameworks import pairs
from cascade.scheduling.matcher import Matcher
from cascade.scheduling.placement import Inventory
from cascade.serving import kserve
from cascade.serving.targets.kserve import KServeTarget
from cascade.stores.sqlite import SqliteStore
from tests.helpers.kube import Cluster, Operator, unique
from tests.helpers.waiting import events_until

ROOT = Path(__file__).resolve().parents[2]
OVERLAY = ROOT / "knative" / "overlays" / "example"
SA = "system:serviceaccount:cascade:"


@pytest.fixture(scope="module")
def installed(cluster: Cluster) -> Cluster:
    out = cluster.kubectl("apply", "--server-side", "--force-conflicts", "-k", str(OVERLAY)).stdout
    assert "serverside-applied" in out
    return cluster


def test_the_example_overlay_applies_and_moves_every_kafka_address(installed: Cluster) -> None:
    docs = [d for d in yaml.safe_load_all(installed.kubectl("kustomize", str(OVERLAY)).stdout) if d]
    assert "my-cluster-kafka-bootstrap" not in json.dumps(docs), "an address the overlay did not move"
    [config] = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "kafka-broker-config"]
    address = config["data"]["bootstrap.servers"]
    sinks = [d for d in docs if d["kind"] == "KafkaSink"]
    assert sinks and all(s["spec"]["bootstrapServers"] == [address] for s in sinks)
    pods = [d["spec"]["template"]["spec"] for d in docs if d["kind"] in ("Service", "Deployment")]
    assert len(pods) == 9  # the gateway, six functions, the job watcher and the S3 source
    for pod in pods:
        env = {e["name"]: e for e in pod["containers"][0]["env"]}
        assert env["CASCADE_KAFKA_BOOTSTRAP"]["valueFrom"]["configMapKeyRef"] == {
            "name": "kafka-broker-config", "key": "bootstrap.servers"}
        assert env["CASCADE_BUS__URL"]["value"] == "kafka://$(CASCADE_KAFKA_BOOTSTRAP)"
    assert not [d for d in docs if d["kind"] == "KafkaSource"], "a KafkaSource cannot authenticate to the gateway"
    [source] = [d for d in docs if d["metadata"]["name"] == "cascade-s3-source"]
    assert source["spec"]["template"]["spec"]["containers"][0]["command"][:3] == ["cascade", "sources", "s3-kafka"]
    # and it really is on the server
    deployments = k8s.AppsV1Api(installed.api).list_namespaced_deployment("cascade").items
    assert {d.metadata.name for d in deployments} == {"cascade-job-watch", "cascade-s3-source"}


CAN = [  # account, verb, resource, namespace (None: every namespace), allowed
    ("launch-training", "create", "pytorchjobs.kubeflow.org", "cascade-default", True),
    ("launch-training", "patch", "jobs.batch.volcano.sh", "cascade-vision", True),
    ("launch-training", "create", "rayjobs.ray.io", "cascade-nlp", True),
    ("launch-training", "create", "sparkapplications.sparkoperator.k8s.io", "cascade-default", True),
    ("launch-training", "delete", "mpijobs.kubeflow.org", "cascade-default", True),
    ("launch-training", "get", "pods", "cascade-default", True),
    ("launch-training", "create", "pytorchjobs.kubeflow.org", "kube-system", False),
    ("launch-training", "create", "inferenceservices.serving.kserve.io", "cascade-default", False),
    ("launch-training", "create", "pods", "cascade-default", False),
    ("launch-training", "get", "secrets", "cascade-default", False),
    ("launch-training", "create", "secrets", "cascade-default", True),  # a trial's report credential
    ("launch-training", "patch", "secrets", "cascade-default", False),
    ("launch-finetune", "create", "secrets", "cascade-default", False),
    ("launch-finetune", "create", "pytorchjobs.kubeflow.org", "cascade-default", True),
    ("deploy-model", "create", "inferenceservices.serving.kserve.io", "cascade-vision", True),
    ("deploy-model", "delete", "inferenceservices.serving.kserve.io", "cascade-default", True),
    ("deploy-model", "create", "pytorchjobs.kubeflow.org", "cascade-default", False),
    ("release-model", "get", "pytorchjobs.kubeflow.org", "cascade-default", False),
    ("run-experiment", "delete", "pytorchjobs.kubeflow.org", "cascade-default", True),  # it prunes trials
    ("run-experiment", "create", "pytorchjobs.kubeflow.org", "cascade-default", False),  # trials go via launch-training
    ("gateway", "list", "secrets", "cascade", False),
    ("job-watch", "watch", "pytorchjobs.kubeflow.org", None, True),
    ("job-watch", "list", "sparkapplications.sparkoperator.k8s.io", None, True),
    ("job-watch", "create", "pytorchjobs.kubeflow.org", "cascade-default", False),
    ("job-watch", "list", "secrets", None, False),
]


def test_each_account_can_do_what_its_code_calls_and_nothing_else(installed: Cluster) -> None:
    wrong = []
    for account, verb, resource, namespace, allowed in CAN:
        where = ["-n", namespace] if namespace else ["--all-namespaces"]
        answer = installed.kubectl("auth", "can-i", f"--as={SA}cascade-{account}", verb, resource, *where,
                                   check=False).stdout.strip()
        if answer != ("yes" if allowed else "no"):
            wrong.append(f"{account} {verb} {resource} in {namespace}: {answer}")
    spark = "system:serviceaccount:cascade-default:cascade-spark"  # Spark drivers create their executors
    for verb, resource, allowed in [("create", "pods", True), ("create", "services", True), ("get", "secrets", False)]:
        answer = installed.kubectl("auth", "can-i", f"--as={spark}", verb, resource, "-n", "cascade-default",
                                   check=False).stdout.strip()
        if answer != ("yes" if allowed else "no"):
            wrong.append(f"cascade-spark {verb} {resource}: {answer}")
    assert not wrong, wrong


VENDOR_MODELS = {"nvidia": "A100", "amd": "MI300X", "huawei": "910B", "intel": "Max1550", "gaudi": "Gaudi2",
                 "cambricon": "MLU370", "hygon": "K100", "kunlun": "P800"}


def placed(framework: str, vendor: str, workers: int = 2, procs: int = 2) -> TrainingJob:
    model = VENDOR_MODELS.get(vendor)
    flavor: dict[str, Any] = {"name": vendor, "vendor": vendor, "memoryGiB": 64,
                              "nodes": [{"name": "n1", "cards": 8}, {"name": "n2", "cards": 8}]}
    if model:
        flavor |= {"model": model, "nodeLabels": {"cascade.io/accelerator": model},
                   "taints": [{"key": "cascade.io/accelerator", "effect": "NoSchedule"}]}
    body = {"framework": framework, "entrypoint": {"script": "/app/train.py", "args": ["--epochs", "1"]},
            "workers": workers, "procsPerWorker": procs, "timeoutSeconds": 600, "retries": 1,
            "resources": {"accelerator": f"2({model})" if model else "0", "cpu": "500m", "memory": "512Mi"}}
    job = TrainingJob.from_spec(f"job-{framework}-{vendor}-{workers}x{procs}", "default", body)
    placement = Matcher(Inventory.from_dict({"flavors": [flavor]})).place(job.matcher_job())
    return TrainingJob(job.id, job.project, job.spec, placement.pod())


def test_every_rendered_kind_passes_a_strict_server_side_dry_run(cluster: Cluster) -> None:
    namespace = cluster.namespace(unique("dry"))
    refused, checked = [], 0
    resources = []
    for (framework, vendor), (workers, procs) in itertools.product(pairs(), [(1, 1), (2, 2)]):
        if framework == "mindspore":  # an image in the matrix; no training job names it (schema) yet
            continue
        job = placed(framework, vendor, workers, procs)
        if framework in kinds.REFUSED:
            with pytest.raises(InvalidInput, match="removed MXJob"):
                kinds.render(job, namespace)
            continue
        resources.append((f"{framework}/{vendor} {workers}x{procs}", kinds.render(job, namespace)))
    for method, (workers, procs) in itertools.product(("lora", "qlora", "full"), [(1, 1), (1, 8), (2, 8)]):
        spec = {"baseModel": "meta-llama/Llama-2-7b", "method": method, "dataset": "file:///data/chat.jsonl",
                "outputModel": "chat-7b",
                "resources": {"accelerator": "8(A100)"}}
        resources.append((f"finetune {method} {workers}x{procs}", pytorchjob(
            f"ft-{method}-{workers}x{procs}", "default", spec, placed("pytorch", "nvidia").placement, workers=workers,
            procs=procs, namespace=namespace)))
    for what, resource in resources:
        group, _, version = resource["apiVersion"].rpartition("/")
        try:
            cluster.custom.create_namespaced_custom_object(group, version, namespace, kinds.plural(resource["kind"]),
                                                           resource, dry_run="All", field_validation="Strict")
            checked += 1
        except k8s.ApiException as exc:
            refused.append(f"{what} {resource['kind']}: {json.loads(exc.body)['message']}")
    for fmt in kserve.MODEL_FORMATS:
        isvc = kserve.inference_service({"model": f"m-{fmt}", "version": "1", "format": fmt, "sha256": "0" * 64,
                                         "artifactUri": "s3://models/m/1/", "canaryTrafficPercent": 10}, namespace,
                                        previous_version="0")
        try:
            cluster.custom.create_namespaced_custom_object(kserve.GROUP, kserve.VERSION, namespace, kserve.PLURAL,
                                                           isvc, dry_run="All", field_validation="Strict")
            checked += 1
        except k8s.ApiException as exc:
            refused.append(f"InferenceService {fmt}: {json.loads(exc.body)['message']}")
    assert not refused, refused
    assert checked == len(resources) + len(kserve.MODEL_FORMATS) > 90


class Play:
    """The operator's part for one job: its status, and the pods it would have made."""

    def __init__(self, cluster: Cluster, resource: dict[str, str]) -> None:
        self.cluster, self.r = cluster, resource

    def status(self, status: dict[str, Any]) -> None:
        self.cluster.status({"apiVersion": self.r["apiVersion"], "kind": self.r["kind"],
                             "metadata": {"namespace": self.r["namespace"], "name": self.r["name"]}}, status)

    def ended_pod(self, code: int, message: str) -> None:
        """A worker pod whose container ended with ``code`` and its termination message: metrics.json when it wrote
        one, else (FallbackToLogsOnError) its log's tail."""
        core, ns, name = self.cluster.core, self.r["namespace"], f"{self.r['name']}-worker-0"
        core.create_namespaced_pod(ns, k8s.V1Pod(
            metadata=k8s.V1ObjectMeta(name=name, labels={"cascade.io/job": self.r["name"]}),
            spec=k8s.V1PodSpec(containers=[k8s.V1Container(name="worker", image="img:1")])))
        core.patch_namespaced_pod_status(name, ns, {"status": {"phase": "Failed", "containerStatuses": [{
            "name": "worker", "image": "img:1", "imageID": "", "ready": False, "restartCount": 0,
            "state": {"terminated": {"exitCode": code, "reason": "Error" if code else "Completed",
                                     "message": message}}}]}})


LIFECYCLE = {  # framework: (running status, succeeded status, failed status) as each operator writes them
    "pytorch": ({"conditions": [{"type": "Running", "status": "True"}]},
                {"conditions": [{"type": "Running", "status": "False"}, {"type": "Succeeded", "status": "True"}]},
                {"conditions": [{"type": "Failed", "status": "True", "message": "PyTorchJob has failed"}]}),
    "deepspeed": ({"state": {"phase": "Running"}}, {"state": {"phase": "Completed"}},
                  {"state": {"phase": "Terminated", "reason": "PodFailed"}}),
    "ray": ({"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"},
            {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"},
            {"jobDeploymentStatus": "Failed", "reason": "DeadlineExceeded", "message": "activeDeadlineSeconds passed"}),
    "spark": ({"driverInfo": {}, "applicationState": {"state": "RUNNING"}},
              {"driverInfo": {}, "applicationState": {"state": "COMPLETED"}},
              {"driverInfo": {}, "applicationState": {"state": "SUBMISSION_FAILED", "errorMessage": "spark-submit failed"}}),
}


@pytest.fixture
def project(installed: Cluster, tmp_path: Path) -> Iterator[str]:
    """A project namespace with the Roles `cascade render` gives every project."""
    name = unique("p")
    installed.namespace(f"cascade-{name}")
    docs = manifests.rbac(discover([PLATFORM_FUNCTIONS]), [name])
    path = tmp_path / "rbac.yaml"
    path.write_text(yaml.safe_dump_all([d for d in docs if d["metadata"].get("namespace") != "cascade"]))
    installed.kubectl("apply", "--server-side", "-f", str(path))
    yield name


@pytest.mark.parametrize("framework", sorted(LIFECYCLE))
def test_the_kubernetes_backend_runs_a_jobs_whole_life(installed: Cluster, project: str, framework: str,
                                                       tmp_path: Path) -> None:
    store, bus = SqliteStore(tmp_path / "state.db"), EmbeddedBus(tmp_path / "bus.db")
    launcher = KubernetesBackend(installed.client_as(installed.token_for("cascade", "cascade-launch-training")), store,
                                 "cascade-")
    watching = KubernetesBackend(installed.client_as(installed.token_for("cascade", "cascade-job-watch")), store,
                                 "cascade-")
    vendor = "cpu" if framework == "spark" else "nvidia"
    ok, bad = (TrainingJob(f"{j.id}-{n}", project, j.spec, j.placement) for n, j in
               (("ok", placed(framework, vendor)), ("bad", placed(framework, vendor))))
    watcher = JobWatcher(watching, bus, "events", interval=600)  # only the API server's watch can wake it in time
    watcher.start()
    try:
        for job in (ok, bad):
            launcher.launch(job, {"project": project})
        plays = {job.id: Play(installed, store.get_record("job", job.id)["resource"]) for job in (ok, bad)}  # type: ignore[index]
        running, succeeded, failed = LIFECYCLE[framework]
        for job in (ok, bad):
            plays[job.id].status(running)
        events_until(bus, "events", lambda seen: len(seen) == 2, 30, keep=lambda e: e["type"].endswith("started.v1"),
                     what="job.started for both jobs")
        plays[ok.id].ended_pod(0, '{"loss": 0.125, "accuracy": 0.9}')
        plays[ok.id].status(succeeded)
        plays[bad.id].ended_pod(1, "Traceback (most recent call last):\nRuntimeError: CUDA out of memory")
        plays[bad.id].status(failed)
        ends = events_until(bus, "events", lambda seen: len(seen) == 2, 30,
                            keep=lambda e: e["type"].rsplit(".", 2)[-2] in ("succeeded", "failed"), what="both ends")
        by_job = {e.get_data()["jobId"]: e for e in ends}
        assert by_job[ok.id]["type"] == "io.cascade.job.succeeded.v1" and by_job[ok.id]["project"] == project
        assert by_job[ok.id].get_data()["metrics"] == {"loss": 0.125, "accuracy": 0.9}, "metrics.json came back"
        failure = by_job[bad.id]
        assert failure["type"] == "io.cascade.job.failed.v1"
        assert "CUDA out of memory" in failure.get_data()["reason"], "the log's tail explains the failure"
        if framework == "ray":
            assert "DeadlineExceeded" in failure.get_data()["reason"]
        watcher.stop()
        again = JobWatcher(watching, bus, "events", interval=600)  # a restarted watcher publishes nothing twice
        assert again.once() == 0
        lifecycle = events_until(bus, "events", lambda seen: len(seen) >= 4, 10,
                                 keep=lambda e: e["type"].startswith("io.cascade.job"))
        assert len(lifecycle) == 4, [e["type"] for e in lifecycle]

        late = TrainingJob(f"{ok.id}-late", project, ok.spec, ok.placement)
        launcher.launch(late, {})
        launcher.cancel(late.id)
        r = store.get_record("job", late.id)["resource"]  # type: ignore[index]
        group, _, version = r["apiVersion"].rpartition("/")
        with pytest.raises(k8s.ApiException) as gone:
            installed.custom.get_namespaced_custom_object(group, version, r["namespace"], kinds.plural(r["kind"]),
                                                          r["name"])
        assert gone.value.status == 404
    finally:
        watcher.stop()
        bus.close()
        store.close()


def test_a_trial_runs_with_its_labels_its_reporter_and_a_report_credential_only_it_holds(
        installed: Cluster, project: str, tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "state.db")
    launcher = KubernetesBackend(installed.client_as(installed.token_for("cascade", "cascade-launch-training")), store,
                                 "cascade-", platform_token="casp_cluster-test")
    base = placed("pytorch", "nvidia")
    trial = TrainingJob(f"exp-{unique('e')}-t3", project, {**base.spec, "labels": {"experiment": "exp-x", "trial": "3"}},
                        base.placement)
    launcher.launch(trial, {"project": project})
    launcher.launch(trial, {"project": project})  # a redelivered launch: the same resource, the same Secret
    ns = f"cascade-{project}"
    resource = installed.custom.get_namespaced_custom_object("kubeflow.org", "v1", ns, "pytorchjobs", trial.name)
    assert resource["metadata"]["labels"]["cascade.io/trial"] == "3"
    pod = resource["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    assert [c["name"] for c in pod["initContainers"]] == ["metrics-reporter"], "the API server kept the sidecar"
    assert pod["initContainers"][0]["restartPolicy"] == "Always"
    secret = installed.core.read_namespaced_secret(kinds.report_secret(trial), ns)
    assert base64.b64decode(secret.data["token"]).decode() == job_credential("casp_cluster-test", trial.id)
    [owner] = secret.metadata.owner_references
    assert (owner.kind, owner.name, owner.uid) == ("PyTorchJob", trial.name, resource["metadata"]["uid"]), \
        "deleted with its job by the garbage collector"
    plain = TrainingJob(f"job-{unique('j')}", project, base.spec, base.placement)
    launcher.launch(plain, {})
    with pytest.raises(k8s.ApiException) as none:
        installed.core.read_namespaced_secret(kinds.report_secret(plain), ns)
    assert none.value.status == 404, "a job outside an experiment gets no report credential"
    store.close()


def test_refusals_carry_the_api_servers_explanation(installed: Cluster, project: str, tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "state.db")
    deployer = KubernetesBackend(installed.client_as(installed.token_for("cascade", "cascade-deploy-model")), store,
                                 "cascade-")
    with pytest.raises(PermanentError) as refused:
        deployer.launch(placed("pytorch", "nvidia"), {})  # deploy-model may not create training jobs
    assert "403 Forbidden" in str(refused.value) and 'cannot patch resource "pytorchjobs"' in str(refused.value)
    store.close()


def test_deploy_model_runs_to_deployed_or_deploy_failed_on_kserve(installed: Cluster, project: str,
                                                                   tmp_path: Path) -> None:
    """deploy-model with its own ServiceAccount's token: the matcher places the release's accelerator, Cascade's
    model server serves a TorchScript file, and the controller's Ready (or ModelLoadFailed) decides the event."""
    namespace = f"cascade-{project}"

    def decide(obj: dict[str, Any]) -> dict[str, Any]:
        ok = "broken" not in kserve.storage_uri(obj)
        return {"conditions": [{"type": "Ready", "status": "True" if ok else "False",
                                **({} if ok else {"reason": "ModelLoadFailed", "message": "no model in /mnt/models"})}]}

    operator = Operator(installed, kserve.GROUP, kserve.VERSION, kserve.PLURAL, namespace, decide)
    inventory = {"flavors": [{"name": "t4", "vendor": "nvidia", "model": "T4", "memoryGiB": 16,
                              "nodeLabels": {"gpu-type": "T4"}, "nodes": [{"name": "n1", "cards": 4}]}]}
    models = Models(Settings(home=tmp_path / "home"))
    models._target = KServeTarget(installed.client_as(installed.token_for("cascade", "cascade-deploy-model")),
                                  "cascade-", timeout=30, poll=0.05,
                                  matcher=Matcher(Inventory.from_dict(inventory)))
    try:
        def released(name: str, uri: str) -> Any:
            return new_event("model.released", {"model": name, "version": "1", "artifactUri": uri, "sha256": "0" * 64,
                                                "format": "torchscript", "accelerator": "1(T4)",
                                                "resources": {"cpu": "500m", "memory": "3Gi"}},
                             source="/tests", extensions={"project": project})

        deployed = models.on_released(released("cats", "s3://models/cats/1/model.pt"))
        assert deployed is not None and deployed["type"] == "io.cascade.model.deployed.v1"
        assert deployed.get_data()["target"] == "kserve"
        isvc = installed.custom.get_namespaced_custom_object(kserve.GROUP, kserve.VERSION, namespace, kserve.PLURAL,
                                                             "cats")
        predictor = isvc["spec"]["predictor"]
        assert predictor["containers"][0]["resources"] == {
            "limits": {"cpu": "500m", "memory": "3Gi", "nvidia.com/gpu": "1"}, "requests": {"cpu": "500m", "memory": "3Gi"}}
        assert predictor["nodeSelector"] == {"gpu-type": "T4"}
        assert models.registry.traffic("model-live", "cats") == {"1": 100}

        failed = models.on_released(released("dogs", "s3://models/broken/1/model.pt"))
        assert failed is not None and failed["type"] == "io.cascade.model.deploy_failed.v1"
        assert "ModelLoadFailed: no model in /mnt/models" in failed.get_data()["reason"]
    finally:
        operator.stop()


def test_in_a_pod_the_service_account_is_used_and_no_kubeconfig_is_needed(installed: Cluster, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """What a function's pod has: KUBERNETES_SERVICE_HOST/PORT, the mounted token and CA, no kubeconfig."""
    from kubernetes.config import incluster_config

    from cascade.core.kube import api_client

    token = tmp_path / "token"
    token.write_text(installed.token_for("cascade", "cascade-launch-training"))
    monkeypatch.setattr(incluster_config, "SERVICE_TOKEN_FILENAME", str(token))
    monkeypatch.setattr(incluster_config, "SERVICE_CERT_FILENAME", str(installed.kubeconfig.parent / "serving.crt"))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "16443")
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-such-kubeconfig"))
    try:
        review = k8s.AuthenticationV1Api(api_client()).create_self_subject_review(
            {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
        assert review.status.user_info.username == f"{SA}cascade-launch-training"
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST")
        with pytest.raises(PermanentError, match="no Kubernetes configuration.*KUBECONFIG"):
            api_client()  # outside a pod, without a kubeconfig: the fix is named
    finally:
        k8s.Configuration.set_default(None)  # in-cluster loading sets the process-wide default


def test_an_experiment_renders_as_a_katib_experiment_the_api_server_accepts(cluster: Cluster) -> None:
    import json as _json

    from cascade.functions.experiments.katib import experiment

    cluster.kubectl("apply", "--server-side", "-f", str(ROOT / "scripts" / "kube" / "crds" / "katib-experiments.yaml"))
    cluster.kubectl("wait", "--for", "condition=established", "crd/experiments.kubeflow.org", "--timeout=60s")
    namespace = cluster.namespace(unique("katib"))
    spec = {"trial": {"framework": "pytorch", "entrypoint": {"script": "/app/train.py"}, "workers": 2,
                      "hyperparameters": {"epochs": 3}, "resources": {"accelerator": "1(A100)"}},
            "searchSpace": {"lr": {"type": "loguniform", "low": 1e-4, "high": 0.1},
                            "hidden": {"type": "int", "low": 8, "high": 64, "step": 8},
                            "optimizer": {"type": "choice", "values": ["adam", "sgd"]}},
            "objective": {"metric": "loss", "goal": 0.05}, "algorithm": {"name": "tpe", "pruner": "median", "seed": 1},
            "trials": 12, "parallel": 3}
    rendered = experiment("mlp-search", spec, namespace, placed("pytorch", "nvidia").placement)
    created = cluster.custom.create_namespaced_custom_object("kubeflow.org", "v1beta1", namespace, "experiments",
                                                             rendered)
    s = created["spec"]
    assert s["objective"] == {"type": "minimize", "objectiveMetricName": "loss", "goal": 0.05}
    assert {p["name"]: p["parameterType"] for p in s["parameters"]} == {"lr": "double", "hidden": "int",
                                                                        "optimizer": "categorical"}
    assert s["parameters"][0]["feasibleSpace"]["distribution"] == "logUniform"
    assert s["earlyStopping"]["algorithmName"] == "medianstop" and s["parallelTrialCount"] == 3
    assert s["metricsCollectorSpec"]["source"]["fileSystemPath"]["path"] == "/output/metrics.jsonl"
    template = s["trialTemplate"]
    assert template["primaryContainerName"] == "pytorch" and template["trialSpec"]["kind"] == "PyTorchJob"
    env = {e["name"]: e["value"] for e in
           template["trialSpec"]["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["env"]}
    filled = env["CASCADE_HPARAMS"].replace("${trialParameters.lr}", "0.01").replace(
        "${trialParameters.hidden}", "16").replace("${trialParameters.optimizer}", "adam")
    assert _json.loads(filled) == {"epochs": 3, "lr": 0.01, "hidden": 16, "optimizer": "adam"}, "Katib fills valid JSON"
    # the trial resource itself passes the operator's CRD once Katib names it
    trial = {**template["trialSpec"], "metadata": {"name": "mlp-search-trial-1", "namespace": namespace}}
    cluster.custom.create_namespaced_custom_object("kubeflow.org", "v1", namespace, "pytorchjobs", trial,
                                                   dry_run="All", field_validation="Strict")
