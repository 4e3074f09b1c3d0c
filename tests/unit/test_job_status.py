"""Each operator's status shape read as Cascade's job phase, and failures in the operator's own words."""

from __future__ import annotations

from typing import Any

import pytest

from cascade.functions.training.backends.kubernetes import phase, reason


@pytest.mark.parametrize("kind, status, expected", [
    ("PyTorchJob", {}, "launching"),
    ("PyTorchJob", {"conditions": [{"type": "Created", "status": "True"}]}, "launching"),
    ("PyTorchJob", {"conditions": [{"type": "Running", "status": "True"}]}, "running"),
    ("PyTorchJob", {"conditions": [{"type": "Running", "status": "False"}, {"type": "Succeeded", "status": "True"}]},
     "succeeded"),
    ("MPIJob", {"conditions": [{"type": "Failed", "status": "True"}]}, "failed"),
    ("Job", {"state": {"phase": "Pending"}}, "launching"),
    ("Job", {"state": {"phase": "Running"}}, "running"),
    ("Job", {"state": {"phase": "Completed"}}, "succeeded"),
    ("Job", {"state": {"phase": "Terminated"}}, "failed"),
    ("Job", {"state": {"phase": "Aborted"}}, "failed"),
    ("RayJob", {"jobDeploymentStatus": "Initializing"}, "launching"),
    ("RayJob", {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"}, "running"),
    ("RayJob", {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"}, "succeeded"),
    ("RayJob", {"jobDeploymentStatus": "Complete", "jobStatus": "FAILED"}, "failed"),
    ("RayJob", {"jobDeploymentStatus": "Failed", "jobStatus": "RUNNING", "reason": "DeadlineExceeded"}, "failed"),
    ("SparkApplication", {"applicationState": {"state": "SUBMITTED"}}, "launching"),
    ("SparkApplication", {"applicationState": {"state": "RUNNING"}}, "running"),
    ("SparkApplication", {"applicationState": {"state": "COMPLETED"}}, "succeeded"),
    ("SparkApplication", {"applicationState": {"state": "SUBMISSION_FAILED"}}, "failed"),
    ("SparkApplication", {"applicationState": {"state": "FAILED"}}, "failed"),
])
def test_phase_reads_every_operators_status(kind: str, status: dict[str, Any], expected: str) -> None:
    assert phase({"kind": kind, "metadata": {"name": "j"}, "status": status}) == expected


def test_a_failure_is_explained_in_the_operators_words() -> None:
    ray = {"kind": "RayJob", "metadata": {"name": "j"},
           "status": {"jobDeploymentStatus": "Failed", "reason": "DeadlineExceeded", "message": "deadline passed"}}
    assert reason(ray) == "RayJob j failed: DeadlineExceeded; deadline passed"
    spark = {"kind": "SparkApplication", "metadata": {"name": "s"},
             "status": {"applicationState": {"state": "FAILED", "errorMessage": "driver OOMKilled"}}}
    assert reason(spark) == "SparkApplication s failed: driver OOMKilled"
    assert reason({"kind": "PyTorchJob", "metadata": {"name": "p"}, "status": {}}) == "PyTorchJob p failed"
