"""The framework decision tree: a reason at every step, the answers that matter change the answer, images per
vendor, and bad answers named."""

from __future__ import annotations

import pytest

from cascade.scheduling.recommend import images, recommend


@pytest.mark.parametrize("task, deploy, team, priority, first, scale_with", [
    ("vision", "cloud", "python", "iteration", "pytorch", ""),
    ("vision", "mobile", "engineering", "iteration", "tensorflow", ""),  # TensorFlow Lite for an engineering team
    ("nlp", "cloud", "python", "scale", "pytorch", "deepspeed"),  # ZeRO on top of PyTorch
    ("recsys", "cloud", "engineering", "scale", "tensorflow", ""),  # parameter servers
    ("rl", "cloud", "python", "scale", "ray", ""),  # RLlib's actors
    ("rl", "cloud", "python", "iteration", "pytorch", ""),
])
def test_the_tree_answers(task: str, deploy: str, team: str, priority: str, first: str, scale_with: str) -> None:
    result = recommend(task, deploy, team, priority)
    assert (result.frameworks[0], result.scale_with) == (first, scale_with)
    assert [s.answer for s in result.steps] == [deploy, task, team, priority]
    assert all(s.reason and s.kept for s in result.steps), "every step says why"


def test_mobile_keeps_only_frameworks_with_a_mobile_runtime() -> None:
    assert set(recommend("nlp", "mobile", "python", "iteration").frameworks) <= {"tensorflow", "pytorch", "paddle"}


def test_images_for_the_inventorys_vendors_and_where_none_runs() -> None:
    found = images(["pytorch", "deepspeed"], ["nvidia", "cpu"])
    assert found["pytorch"] == {"nvidia": "ghcr.io/cascade-ml/pytorch-cuda:0.1", "cpu": "ghcr.io/cascade-ml/pytorch-cpu:0.1"}
    assert found["deepspeed"]["cpu"] == "", "DeepSpeed has no CPU image"


def test_a_bad_answer_names_the_allowed_ones() -> None:
    with pytest.raises(ValueError, match="--team must be one of python, engineering"):
        recommend("vision", "cloud", "data-science", "iteration")
