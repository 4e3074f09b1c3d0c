"""A hyper-parameter search end to end on the real Kafka and Redis: 12 trials of a small PyTorch model over a
learning rate and a hidden size, 3 at a time on the local backend, pruned by ASHA on the losses the trials
append to metrics.jsonl."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from cloudevents.http import CloudEvent

from cascade.core.credentials import job_credential
from tests.helpers.waiting import events_until, eventually
from tests.integration.test_training import HELPERS, Platform, running_platform

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    with running_platform(tmp_path_factory.mktemp("hpo"), f"hpo-{uuid.uuid4().hex[:8]}") as (p, _):
        yield p


def test_an_experiment_searches_prunes_and_names_its_best_trial(platform: Platform) -> None:
    p = platform
    workspace = p.home / "workspaces" / "default"
    workspace.mkdir(parents=True, exist_ok=True)
    (workspace / "train_hpo.py").write_text((HELPERS / "train_hpo.py").read_text())
    model = f"mlp-{uuid.uuid4().hex[:6]}"
    spec: dict[str, Any] = {
        "name": "mlp-search", "release": "data.loss < 1.0",
        "trial": {"framework": "pytorch", "entrypoint": {"script": "train_hpo.py"},
                  "hyperparameters": {"steps": 30, "iterations": 20}, "timeoutSeconds": 300,
                  "model": {"name": model, "file": "model.pt", "format": "torchscript"}},
        "searchSpace": {"lr": {"type": "loguniform", "low": 1e-4, "high": 0.3},
                        "hidden": {"type": "int", "low": 2, "high": 48, "step": 2}},
        "objective": {"metric": "loss", "direction": "minimize"},
        "algorithm": {"name": "tpe", "pruner": "asha", "minSteps": 2, "seed": 11},
        "trials": 12, "parallel": 3}
    auth = {"authorization": f"Bearer {p.token}"}
    bad = httpx.post(f"{p.gateway}/v1/experiments", headers=auth,
                     json={**spec, "searchSpace": {"lr": {"type": "loguniform", "low": 0, "high": 1}}})
    assert bad.status_code == 400 and "/spec/searchSpace/lr/low" in bad.text
    reply = httpx.post(f"{p.gateway}/v1/experiments", headers=auth, json=spec)
    assert reply.status_code == 202, reply.text
    experiment = reply.json()["experimentId"]

    [done] = events_until(p.bus, p.topic, bool, 600, what=f"experiment {experiment} to end",
                          keep=lambda e: e.get("subject") == experiment and str(e["type"]).startswith("io.cascade.experiment.")
                          and not str(e["type"]).endswith("submitted.v1"))
    assert done["type"] == "io.cascade.experiment.succeeded.v1", done.get_data()
    result = done.get_data()
    state = httpx.get(f"{p.gateway}/v1/experiments/{experiment}", headers=auth).json()
    trials = state["trials"]
    print(f"\n{experiment}: {result['trials']}, best {result['value']:.4f} with {result['parameters']}")
    assert len(trials) == 12 and sum(result["trials"].values()) == 12
    completed = [t["value"] for t in trials if t["state"] == "complete"]
    reached = [t["value"] if t["state"] == "complete" else t["steps"][max(t["steps"], key=int)] for t in trials]
    assert result["value"] == min(completed) < statistics.median(reached), "the best trial beats the median trial"
    pruned = [t for t in trials if t["state"] == "pruned"]
    assert pruned, "ASHA pruned trials that fell behind"

    def job(trial: dict[str, Any]) -> dict[str, Any]:
        return dict(httpx.get(f"{p.gateway}/v1/jobs/{trial['jobId']}", headers=auth).json())

    # each pruned trial was cancelled with reason "pruned", or had just finished when its cancellation came
    eventually(lambda: all(job(t)["status"] in ("cancelled", "succeeded") for t in pruned), 60, "pruned trials ended")
    stopped = [t for t in pruned if job(t)["status"] == "cancelled"]
    assert stopped and all(job(t)["reason"] == "pruned" for t in stopped)
    assert all(max(int(s) for s in t["steps"]) < 29 for t in stopped), "stopped before their last step"
    spans = sorted((t["started"], t.get("ended") or t["started"]) for t in trials)
    assert max(sum(1 for s, e in spans if s <= start < e) for start, _ in spans) <= 3, "never more than 3 at once"

    listed = p.running.cascade("experiments", "ls")
    assert listed.returncode == 0 and experiment in listed.stdout and "succeeded" in listed.stdout
    shown = p.running.cascade("experiments", "show", experiment)
    assert shown.returncode == 0 and result["bestTrial"] in shown.stdout
    job = httpx.get(f"{p.gateway}/v1/jobs/{result['bestTrial']}", headers=auth).json()
    assert job["status"] == "succeeded" and job["spec"]["hyperparameters"]["lr"] == result["parameters"]["lr"]
    # the best trial's model, and only its, was registered and released through the release path
    registered = events_until(p.bus, p.topic, lambda seen: any(e["type"].endswith("released.v1") for e in seen), 60,
                              what=f"{model} released", keep=lambda e: str(e.get("subject", "")).startswith(f"{model}:"))
    # at least once on the bus: a copy of an event (the same id) may come twice; one registration all the same
    [reg] = list({e["id"]: e for e in registered if e["type"] == "io.cascade.model.registered.v1"}.values())
    assert reg.get_data()["lineage"]["job"] == result["bestTrial"] and reg["subject"] == f"{model}:1"


def test_stopping_an_experiment_cancels_its_trials(platform: Platform, tmp_path: Path) -> None:
    p = platform
    auth = {"authorization": f"Bearer {p.token}"}
    spec = {"trial": {"framework": "pytorch", "entrypoint": {"script": "train_hpo.py"},
                      "hyperparameters": {"steps": 400, "iterations": 20}},
            "searchSpace": {"lr": {"type": "uniform", "low": 0.001, "high": 0.01},
                            "hidden": {"type": "choice", "values": [4, 8]}},
            "objective": {"metric": "loss"}, "algorithm": {"name": "random"}, "trials": 4, "parallel": 2}
    experiment = httpx.post(f"{p.gateway}/v1/experiments", headers=auth, json=spec).json()["experimentId"]
    events_until(p.bus, p.topic, lambda seen: len(seen) >= 2, 180, what="both trials running",
                 keep=lambda e: e["type"] == "io.cascade.job.started.v1" and str(e.get("subject", "")).startswith(experiment))
    assert httpx.post(f"{p.gateway}/v1/experiments/{experiment}/stop", headers=auth).status_code == 202
    [ended] = events_until(p.bus, p.topic, bool, 120, what="the experiment to end",
                           keep=lambda e: e.get("subject") == experiment and e["type"] == "io.cascade.experiment.failed.v1")
    assert ended.get_data()["reason"] == "stopped on request"
    events_until(p.bus, p.topic, lambda seen: len(seen) >= 2, 60, what="its trials cancelled",
                 keep=lambda e: e["type"] == "io.cascade.job.cancelled.v1" and str(e.get("subject", "")).startswith(experiment))
    other = httpx.get(f"{p.gateway}/v1/experiments/{experiment}",
                      headers={"authorization": "Bearer casp_not-a-token"})
    assert other.status_code == 401

    # A trial's job carries its labels; on Kubernetes its pods' metrics-reporter (run here as the process a pod
    # runs) posts metrics.jsonl through the gateway with the trial's report credential, and sends its last
    # lines when the pod stops it.
    trial = f"{experiment}-t0"
    record = httpx.get(f"{p.gateway}/v1/jobs/{trial}", headers=auth).json()
    assert record["spec"]["labels"] == {"experiment": experiment, "trial": "0"}
    platform_credential = p.running.admin["authorization"].split()[1]
    out = tmp_path / "output"
    out.mkdir()
    env = {**os.environ, "CASCADE_OUTPUT_DIR": str(out), "CASCADE_REPORT_URL": f"{p.gateway}/v1/jobs/{trial}/reports",
           "CASCADE_REPORT_TOKEN": job_credential(platform_credential, trial), "CASCADE_REPORT_INTERVAL": "0.2"}
    sidecar = subprocess.Popen([sys.executable, "-m", "cascade.functions.training.reporter"], env=env,
                               stderr=subprocess.PIPE, text=True)
    try:
        def reported(step: int) -> Callable[[list[CloudEvent]], bool]:
            return lambda seen: any(e.get_data()["step"] == step for e in seen)

        keep = {"keep": lambda e: e["type"] == "io.cascade.trial.reported.v1" and e.get("subject") == trial}
        (out / "metrics.jsonl").write_text('{"step": 100, "loss": 0.25}\n')
        events_until(p.bus, p.topic, reported(100), 30, what="the reporter's first line", **keep)
        with (out / "metrics.jsonl").open("a") as f:
            f.write('{"step": 101, "loss": 0.125}\n')
        sidecar.terminate()  # at once: the line is sent on the way out
        assert sidecar.wait(30) == 0, sidecar.stderr.read() if sidecar.stderr else ""
        [last] = [e for e in events_until(p.bus, p.topic, reported(101), 30, what="the last line", **keep)
                  if e.get_data()["step"] == 101]
        assert last["project"] == "default" and last.get_data()["metrics"] == {"loss": 0.125}
    finally:
        sidecar.kill()
