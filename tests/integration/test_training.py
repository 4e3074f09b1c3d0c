"""Training end to end on the real Kafka and Redis: a job.submitted event becomes a finished job.

`cascade up` runs the gateway, dispatcher and runtime; POST /v1/jobs publishes job.submitted;
the launch-training function places the job and the local backend runs its workers with the
operator's environment; job.succeeded (or job.failed) lands on the bus.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from cascade.events.bus.kafka import KafkaBus
from tests.conftest import KAFKA, REDIS, make_bus
from tests.helpers.platform import Running, cascade_up
from tests.helpers.waiting import events_until, eventually

pytestmark = pytest.mark.slow  # the platform or model servers start in every test

HELPERS = Path(__file__).resolve().parents[1] / "helpers" / "training"

FINAL = ("succeeded", "failed", "cancelled")


@dataclass
class Platform:
    home: Path
    gateway: str
    topic: str
    bus: KafkaBus
    token: str
    running: Running  # its auth (the project token) and admin (the platform credential) headers

    def submit(self, spec: dict[str, Any]) -> str:
        """Submit ``spec``; a script named by absolute path is first copied into the project's workspace."""
        entry = spec["entrypoint"]
        if "script" in entry and Path(entry["script"]).is_absolute():
            workspace = self.home / "workspaces" / "default"
            workspace.mkdir(parents=True, exist_ok=True)
            shutil.copy(entry["script"], workspace / Path(entry["script"]).name)
            spec = {**spec, "entrypoint": {**entry, "script": Path(entry["script"]).name}}
        reply = httpx.post(f"{self.gateway}/v1/jobs", json={"kind": "training", "spec": spec},
                           headers={"authorization": f"Bearer {self.token}"})
        assert reply.status_code == 202, reply.text
        return str(reply.json()["jobId"])

    def outcome(self, job_id: str, timeout: float = 180) -> dict[str, Any]:
        """Lifecycle events of the job, until one is final."""
        events = events_until(
            self.bus, self.topic, lambda seen: any(str(e["type"]).split(".")[3] in FINAL for e in seen), timeout,
            keep=lambda e: e.get("subject") == job_id or (e.get_data() or {}).get("jobId") == job_id,
            what=f"job {job_id} to finish (logs: {self.logs(job_id)[-2000:]})")
        return {str(e["type"]).split(".")[3]: e for e in events}

    def logs(self, job_id: str) -> str:
        root = self.home / "artifacts" / job_id
        return "".join(p.read_text(errors="replace") for p in sorted(root.rglob("*.log"))) if root.exists() else ""


@contextmanager
def running_platform(home: Path, topic: str, state: str = REDIS, **env: str) -> Iterator[tuple[Platform, str]]:
    """`cascade up` on the real Kafka and Redis in a subprocess; yields it and its runtime URL."""
    with cascade_up(home, "--bus", f"kafka://{KAFKA}", "--state", state, fast=False, CASCADE_BUS__TOPIC=topic,
                    **env) as running:
        bus = make_bus("kafka", home)
        assert isinstance(bus, KafkaBus)
        try:
            yield Platform(home, running.gateway, topic, bus, running.token, running), running.runtime
        finally:
            bus.close()


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    with running_platform(tmp_path_factory.mktemp("platform"), f"train-{uuid.uuid4().hex[:8]}") as (p, _):
        yield p


def test_two_worker_pytorch_ddp_job_from_a_submitted_event(platform: Platform) -> None:
    job_id = platform.submit({"framework": "pytorch", "entrypoint": {"script": str(HELPERS / "train_ddp.py")},
                              "workers": 2, "resources": {"accelerator": "0", "cpu": "1", "memory": "1Gi"},
                              "hyperparameters": {"steps": 60}, "timeoutSeconds": 300})
    seen = platform.outcome(job_id)
    assert "succeeded" in seen, platform.logs(job_id)[-3000:]
    done = seen["succeeded"].get_data()
    assert done["metrics"]["world_size"] == 2
    assert done["metrics"]["loss"] < done["metrics"]["first_loss"] / 10, "the loss falls"
    assert seen["started"].get_data()["placement"]["flavor"] == "local-cpu"
    output = Path(done["artifactUri"].removeprefix("file://"))
    weights = torch.load(output / "model.pt")
    assert set(weights) == {"weight", "bias"}
    logs = platform.logs(job_id)
    assert "step 50 loss" in logs
    record = httpx.get(f"{platform.gateway}/v1/jobs/{job_id}",
                       headers={"authorization": f"Bearer {platform.token}"}).json()
    assert record["status"] == "succeeded" and [h["status"] for h in record["history"]][-2:] == ["running", "succeeded"]


def test_xgboost_job_runs_the_same_way(platform: Platform) -> None:
    job_id = platform.submit({"framework": "xgboost", "entrypoint": {"script": str(HELPERS / "train_xgb.py")},
                              "hyperparameters": {"rounds": 30}})
    seen = platform.outcome(job_id)
    assert "succeeded" in seen, platform.logs(job_id)[-3000:]
    metrics = seen["succeeded"].get_data()["metrics"]
    assert metrics["rmse"] < metrics["first_rmse"]
    assert (Path(seen["succeeded"].get_data()["artifactUri"].removeprefix("file://")) / "model.json").exists()


def test_a_failing_job_reports_its_log_tail_and_a_job_that_fits_nowhere_says_why(platform: Platform, tmp_path: Path) -> None:
    script = tmp_path / "fail.py"
    script.write_text("import sys\nprint('about to fail', flush=True)\nsys.exit(3)\n")
    failing = platform.submit({"framework": "pytorch", "entrypoint": {"script": str(script)}, "retries": 1})
    seen = platform.outcome(failing)
    data = seen["failed"].get_data()
    assert data["exitCode"] == 3 and "about to fail" in data["logTail"] and data["reason"] == "worker 0 exited with 3"
    assert (platform.home / "artifacts" / failing / "logs" / "worker-0.attempt-2.log").exists(), "retried once"
    gpu = platform.submit({"framework": "pytorch", "entrypoint": {"script": str(script)},
                           "resources": {"accelerator": "1(V100)"}})
    reason = platform.outcome(gpu)["failed"].get_data()["reason"]
    assert "local-cpu: wrong vendor: the job wants nvidia, this flavor is cpu" in reason


def test_local_launchers_one_spark_driver_a_missing_tool_refused_and_a_missing_framework_named(
        platform: Platform, tmp_path: Path) -> None:
    driver = tmp_path / "driver.py"
    driver.write_text("import os, pathlib\nout = pathlib.Path(os.environ['CASCADE_OUTPUT_DIR'])\n"
                      "(out / f'driver-{os.getpid()}').write_text(os.environ['SPARK_MASTER'])\n")
    spark = platform.submit({"framework": "spark", "entrypoint": {"script": str(driver)}, "workers": 2,
                             "resources": {"cpu": "1", "memory": "1Gi"}})
    assert "succeeded" in platform.outcome(spark), platform.logs(spark)
    drivers = list((platform.home / "artifacts" / spark).glob("driver-*"))
    assert len(drivers) == 1, "one driver, not one per worker"
    assert drivers[0].read_text() == "local-cluster[2,1,1024]", "its executors are Spark's, one per worker"

    mpi = httpx.post(f"{platform.gateway}/v1/jobs", headers={"authorization": f"Bearer {platform.token}"},
                     json={"kind": "training", "spec": {"framework": "mpi", "entrypoint": {"script": "x.py"}, "workers": 2}})
    if shutil.which("mpirun"):
        assert mpi.status_code == 202, mpi.text
    else:
        assert mpi.status_code == 400 and "'mpirun'" in mpi.text and "openmpi-bin" in mpi.text, mpi.text

    bad = httpx.post(f"{platform.gateway}/v1/jobs", headers={"authorization": f"Bearer {platform.token}"},
                     json={"kind": "training", "spec": {"framework": "pytorch", "entrypoint": {"script": "x.py"},
                                                        "resources": {"accelerator": "2(V100"}}})
    assert bad.status_code == 400 and "/spec/resources/accelerator" in bad.text and "1(V100)" in bad.text, bad.text

    needs = tmp_path / "needs_paddle.py"
    needs.write_text("import paddle\n")
    assert importlib.util.find_spec("paddle") is None, "this check needs an environment without PaddlePaddle"
    job = platform.submit({"framework": "paddle", "entrypoint": {"script": str(needs)}})
    reason = platform.outcome(job)["failed"].get_data()["reason"]
    assert reason == "framework paddle is not installed in this environment (pip install paddlepaddle)", reason


def test_cancel_stops_a_running_job(platform: Platform, tmp_path: Path) -> None:
    script = tmp_path / "slow.py"
    script.write_text("import time\nprint('working', flush=True)\ntime.sleep(120)\n")
    job_id = platform.submit({"framework": "pytorch", "entrypoint": {"script": str(script)}})
    eventually(lambda: "working" in platform.logs(job_id), 60, "the job starting")
    env = {**os.environ, "CASCADE_HOME": str(platform.home), "CASCADE_STATE__URL": REDIS}
    out = subprocess.run([sys.executable, "-m", "cascade.cli", "jobs", "cancel", job_id], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    seen = platform.outcome(job_id, timeout=60)
    assert "cancelled" in seen
    assert json.loads(json.dumps(seen["cancelled"].get_data()))["reason"] == "cancelled on request"
