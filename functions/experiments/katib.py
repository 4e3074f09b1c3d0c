"""The same experiment as a Katib ``Experiment`` (``kubeflow.org/v1beta1``), for clusters that run Katib.

Parameters map to Katib's ``double`` / ``int`` / ``categorical`` with ``logUniform`` for a log
range; the trial template is the very operator resource Cascade would apply for one trial
(``kinds.render``) with the searched values substituted by Katib (``${trialParameters.x}``
inside ``CASCADE_HPARAMS``); metrics come from the ``metrics.jsonl`` the trial writes (Katib's
File collector, JSON format). Median pruning becomes Katib's ``medianstop``; Katib has no ASHA
early stopping, so an ``asha`` experiment renders without early stopping and says so in an
annotation. Conditional parameters have no Katib form and are refused.
"""

from __future__ import annotations

import json
from typing import Any

from cascade.core.errors import InvalidInput
from cascade.functions.training import kinds
from cascade.functions.training.job import TrainingJob
from cascade.scheduling.placement import PodPlacement

ALGORITHMS = {"tpe": "tpe", "random": "random", "grid": "grid"}
PRIMARY = {"PyTorchJob": ("pytorch", "master"), "TFJob": ("tensorflow", "worker"), "XGBoostJob": ("xgboost", "master"),
           "PaddleJob": ("paddle", "master"), "JAXJob": ("jax", "worker"), "MPIJob": ("mpi", "launcher")}


def _parameter(name: str, p: dict[str, Any]) -> dict[str, Any]:
    if p.get("when"):
        raise InvalidInput("Katib has no conditional parameters", field=f"/spec/searchSpace/{name}/when")
    if p["type"] == "choice":
        return {"name": name, "parameterType": "categorical", "feasibleSpace": {"list": [str(v) for v in p["values"]]}}
    space: dict[str, Any] = {"min": str(p["low"]), "max": str(p["high"])}
    if p["type"] == "int":
        return {"name": name, "parameterType": "int", "feasibleSpace": {**space, "step": str(p.get("step", 1))}}
    space["distribution"] = "logUniform" if p["type"] == "loguniform" else "uniform"
    return {"name": name, "parameterType": "double", "feasibleSpace": space}


def experiment(name: str, spec: dict[str, Any], namespace: str, placement: PodPlacement) -> dict[str, Any]:
    trial = TrainingJob.from_spec(name, spec.get("project") or "default", spec["trial"])
    resource = kinds.render(TrainingJob(trial.id, trial.project, trial.spec, placement), namespace)
    resource["metadata"] = {"labels": resource["metadata"].get("labels", {})}  # Katib names each trial's resource
    space: dict[str, dict[str, Any]] = spec["searchSpace"]
    marks = {n: f"@@{n}@@" for n in space}
    hparams = json.dumps({**(spec["trial"].get("hyperparameters") or {}), **marks}, sort_keys=True)
    for n, p in space.items():  # numbers unquoted, choices as JSON strings
        quoted = p["type"] == "choice" and any(isinstance(v, str) for v in p["values"])
        hparams = hparams.replace(f'"@@{n}@@"', f'"${{trialParameters.{n}}}"' if quoted else f"${{trialParameters.{n}}}")
    kind = resource["kind"]
    for container in _containers(resource):
        for env in container.get("env", []):
            if env.get("name") == "CASCADE_HPARAMS":
                env["value"] = hparams
    objective = spec["objective"]
    algorithm = spec.get("algorithm") or {}
    out: dict[str, Any] = {
        "apiVersion": "kubeflow.org/v1beta1", "kind": "Experiment",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app.kubernetes.io/part-of": "cascade"},
                     "annotations": {}},
        "spec": {
            "objective": {"type": objective.get("direction", "minimize"), "objectiveMetricName": objective["metric"],
                          **({"goal": float(objective["goal"])} if "goal" in objective else {})},
            "algorithm": {"algorithmName": ALGORITHMS[algorithm.get("name", "tpe")],
                          **({"algorithmSettings": [{"name": "random_state", "value": str(algorithm["seed"])}]}
                             if "seed" in algorithm and algorithm.get("name", "tpe") != "grid" else {})},
            "parameters": [_parameter(n, p) for n, p in space.items()],
            "maxTrialCount": int(spec.get("trials", 10)), "parallelTrialCount": int(spec.get("parallel", 1)),
            "maxFailedTrialCount": int(spec.get("trials", 10)),
            "metricsCollectorSpec": {"collector": {"kind": "File"}, "source": {"fileSystemPath": {
                "path": "/output/metrics.jsonl", "kind": "File", "format": "JSON"}}},
            "trialTemplate": {"primaryContainerName": _containers(resource)[0]["name"],
                              "trialParameters": [{"name": n, "reference": n} for n in space],
                              "trialSpec": resource}}}
    if kind in PRIMARY:
        out["spec"]["trialTemplate"]["primaryPodLabels"] = {"training.kubeflow.org/replica-type": PRIMARY[kind][1]}
        out["spec"]["trialTemplate"]["successCondition"] = 'status.conditions.#(type=="Succeeded")#|#(status=="True")#'
        out["spec"]["trialTemplate"]["failureCondition"] = 'status.conditions.#(type=="Failed")#|#(status=="True")#'
    if algorithm.get("pruner") == "median":
        out["spec"]["earlyStopping"] = {"algorithmName": "medianstop", "algorithmSettings": [
            {"name": "min_trials_required", "value": "2"},
            {"name": "start_step", "value": str(int(algorithm.get("minSteps", 1)))}]}
    elif algorithm.get("pruner") == "asha":
        out["metadata"]["annotations"]["cascade.io/early-stopping"] = (
            "asha has no Katib form (Katib stops early with medianstop only): trials run to the end here")
    if not out["metadata"]["annotations"]:
        del out["metadata"]["annotations"]
    return out


def _containers(resource: dict[str, Any]) -> list[dict[str, Any]]:
    """Every container of the resource's pod templates, primary (first replica type) first."""
    found: list[dict[str, Any]] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if "containers" in node and isinstance(node["containers"], list):
                found.extend(node["containers"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(resource["spec"])
    return found
