"""The experiment controller over a real SQLite store, with Optuna choosing and pruning: every decision
rebuilt from the stored trials, as after a restart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from cloudevents.http import CloudEvent

from cascade.core.errors import InvalidInput
from cascade.events import experiments
from cascade.events.envelope import check_event, new_event
from cascade.functions.experiments.controller import Experiments, experiment_of
from cascade.stores.sqlite import SqliteStore

TRIAL = {"framework": "pytorch", "entrypoint": {"script": "train.py"}, "hyperparameters": {"epochs": 3}}
SPACE = {"lr": {"type": "loguniform", "low": 1e-4, "high": 1e-1}, "hidden": {"type": "int", "low": 4, "high": 64, "step": 4}}


class Harness:
    def __init__(self, tmp_path: Path, **spec: Any) -> None:
        self.store = SqliteStore(tmp_path / "state.db")
        self.cancelled: list[tuple[str, str]] = []
        self.now = 1000.0
        self.spec = {"trial": TRIAL, "searchSpace": SPACE, "objective": {"metric": "loss"}, **spec}
        experiments.check(self.spec)
        self.controller = self.restart()

    def restart(self) -> Experiments:
        """A new controller on the same store: nothing but the stored state carries over."""
        return Experiments(self.store, lambda job, why: self.cancelled.append((job, why)), clock=lambda: self.now)

    def submit(self) -> list[CloudEvent]:
        return self.controller.submitted(new_event("experiment.submitted", {
            "experimentId": "exp-1", "project": "team", "spec": self.spec}, source="/t", extensions={"project": "team"}))

    def end(self, job: str, loss: float | None, kind: str = "succeeded") -> list[CloudEvent]:
        data: dict[str, Any] = {"jobId": job}
        if kind == "succeeded":
            data |= {"artifactUri": "file:///x", "metrics": {} if loss is None else {"loss": loss}}
        else:
            data["reason"] = "boom"
        return self.controller.ended(new_event(f"job.{kind}", data, source="/t", subject=job))

    def report(self, job: str, step: int, loss: float) -> list[CloudEvent]:
        return self.controller.reported(new_event("trial.reported", {"jobId": job, "step": step,
                                                                     "metrics": {"loss": loss}}, source="/t"))


def jobs(events: list[CloudEvent]) -> list[str]:
    for e in events:
        check_event(e)
    return [e.get_data()["jobId"] for e in events if e["type"] == "io.cascade.job.submitted.v1"]


def test_trials_run_in_parallel_until_the_count_and_the_best_one_wins(tmp_path: Path) -> None:
    h = Harness(tmp_path, trials=5, parallel=2, algorithm={"name": "random", "seed": 7})
    first = h.submit()
    assert jobs(first) == ["exp-1-t0", "exp-1-t1"]
    submitted = first[0].get_data()["spec"]
    assert submitted["hyperparameters"]["epochs"] == 3 and set(submitted["hyperparameters"]) == {"epochs", "lr", "hidden"}
    assert 1e-4 <= submitted["hyperparameters"]["lr"] <= 1e-1 and submitted["hyperparameters"]["hidden"] % 4 == 0
    assert submitted["labels"] == {"experiment": "exp-1", "trial": "0"}, "the trial label, on records and resources"
    assert jobs(h.submit()) == ["exp-1-t0", "exp-1-t1"], "a redelivered submission starts nothing new"
    h.controller = h.restart()
    assert jobs(h.end("exp-1-t0", 0.5)) == ["exp-1-t2"]
    assert jobs(h.end("exp-1-t0", 0.5)) == [], "a redelivered end changes nothing"
    assert jobs(h.end("exp-1-t1", 0.2)) == ["exp-1-t3"]
    assert jobs(h.end("exp-1-t2", None)) == ["exp-1-t4"], "no metric: the trial failed, the next one starts"
    assert h.end("exp-1-t3", 0.9) == []
    [done] = h.end("exp-1-t4", 0.7)
    check_event(done)
    d = done.get_data()
    assert done["type"] == "io.cascade.experiment.succeeded.v1" and d["bestTrial"] == "exp-1-t1" and d["value"] == 0.2
    assert d["trials"] == {"complete": 4, "pruned": 0, "failed": 1} and d["reason"] == "all 5 trials ran"
    params = {e: experiments.read(h.store, "exp-1")["trials"][i]["params"]["lr"] for i, e in enumerate(range(5))}
    assert len(set(params.values())) == 5, "every trial draws new parameters"
    assert experiments.summary(experiments.read(h.store, "exp-1"))["best"]["jobId"] == "exp-1-t1"


def test_a_trial_that_falls_behind_is_pruned_and_its_slot_reused(tmp_path: Path) -> None:
    h = Harness(tmp_path, trials=6, parallel=3, algorithm={"name": "random", "pruner": "median", "seed": 1})
    h.submit()
    for step in range(4):  # two good trials report first ...
        h.report("exp-1-t0", step, 1.0 / (step + 1))
        h.report("exp-1-t1", step, 1.1 / (step + 1))
    h.end("exp-1-t0", 0.25)
    h.end("exp-1-t1", 0.27)
    assert h.cancelled == []
    for step in range(3):  # ... then one far worse at the same steps
        started = h.report("exp-1-t2", step, 50.0)
        if h.cancelled:
            break
    assert h.cancelled == [("exp-1-t2", "pruned")], "cancelled at once, reason pruned"
    assert jobs(started), "its slot goes to the next trial"
    state = experiments.read(h.store, "exp-1")
    assert state["trials"][2]["state"] == "pruned" and state["trials"][2]["why"].startswith("pruned at step")
    assert h.end("exp-1-t2", None, "cancelled") == [], "the cancellation's own event changes nothing"
    assert experiments.read(h.store, "exp-1")["trials"][2]["state"] == "pruned"


def test_asha_keeps_its_rungs_across_rebuilt_studies(tmp_path: Path) -> None:
    h = Harness(tmp_path, trials=9, parallel=9, algorithm={"name": "random", "pruner": "asha", "seed": 3})
    h.submit()
    for step in range(1, 4):
        for n in range(9):
            if experiments.read(h.store, "exp-1")["trials"][n]["state"] == "running":
                h.report(f"exp-1-t{n}", step, float(n) + 1 / step)  # trial n's loss grows with n
    pruned = {job for job, why in h.cancelled if why == "pruned"}
    assert pruned and "exp-1-t0" not in pruned, "the best trial is never pruned"
    assert len(pruned) >= 4, "successive halving keeps about a third at each rung"
    attrs = experiments.read(h.store, "exp-1")["trials"][0]["attrs"]
    assert any(k.startswith("completed_rung") for k in attrs), "the rung a trial passed is kept for the next rebuild"


def test_the_goal_ends_the_experiment_and_stops_the_rest(tmp_path: Path) -> None:
    h = Harness(tmp_path, trials=10, parallel=3, objective={"metric": "accuracy", "direction": "maximize", "goal": 0.95},
                algorithm={"name": "tpe", "seed": 2})
    h.submit()
    events = h.controller.ended(new_event("job.succeeded", {"jobId": "exp-1-t1", "artifactUri": "file:///x",
                                                            "metrics": {"accuracy": 0.97}}, source="/t"))
    [done] = [e for e in events if e["type"] == "io.cascade.experiment.succeeded.v1"]
    assert done.get_data()["bestTrial"] == "exp-1-t1" and "reached the goal" in done.get_data()["reason"]
    assert sorted(j for j, _ in h.cancelled) == ["exp-1-t0", "exp-1-t2"]


def test_stop_cancels_the_running_trials_and_a_search_with_nothing_done_fails(tmp_path: Path) -> None:
    h = Harness(tmp_path, trials=4, parallel=2, algorithm={"name": "grid"},
                searchSpace={"hidden": {"type": "choice", "values": [8, 16]}, "depth": {"type": "int", "low": 1, "high": 2}})
    assert sorted(jobs(h.submit())) == ["exp-1-t0", "exp-1-t1"]
    grid = {tuple(sorted(t["params"].items())) for t in experiments.read(h.store, "exp-1")["trials"]}
    assert len(grid) == 2, "a grid search never repeats a point"
    [failed] = h.controller.stopped(new_event("experiment.stopped", {"experimentId": "exp-1", "reason": "by alice"},
                                              source="/t"))
    assert failed["type"] == "io.cascade.experiment.failed.v1" and failed.get_data()["reason"] == "by alice"
    assert sorted(j for j, _ in h.cancelled) == ["exp-1-t0", "exp-1-t1"]


@pytest.mark.parametrize("space, field", [
    ({"lr": {"type": "uniform", "low": 1, "high": 0.5}}, "/spec/searchSpace/lr/low"),
    ({"lr": {"type": "loguniform", "low": 0, "high": 1}}, "/spec/searchSpace/lr/low"),
    ({"opt": {"type": "choice"}}, "/spec/searchSpace/opt/values"),
    ({"lr": {"type": "uniform", "low": 0, "high": 1, "when": {"opt": "sgd"}}, "opt": {"type": "choice", "values": ["sgd"]}},
     "/spec/searchSpace/lr/when"),
    ({"n": {"type": "int", "low": 1.5, "high": 3}}, "/spec/searchSpace/n/low"),
    ({"n": {"type": "bogus"}}, "/spec/searchSpace/n/type"),
])
def test_a_bad_search_space_is_refused_naming_the_field(space: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidInput) as bad:
        experiments.check({"trial": TRIAL, "searchSpace": space, "objective": {"metric": "loss"}})
    assert bad.value.field == field


def test_trial_jobs_name_their_experiment() -> None:
    assert experiment_of("exp-1a2b-t12") == "exp-1a2b" and experiment_of("job-123") is None
    assert experiment_of("exp-1a2b-tx") is None


def test_no_trial_starts_once_the_budget_is_spent(tmp_path: Path) -> None:
    h = Harness(tmp_path, trials=10, parallel=2, budget={"wallSeconds": 100}, algorithm={"name": "random"})
    h.submit()
    h.now += 150
    assert jobs(h.end("exp-1-t0", 0.3)) == [], "past the wall-time budget nothing new starts"
    [done] = h.end("exp-1-t1", 0.2)
    assert done.get_data()["reason"] == "the wall-time budget of 100 s is spent"
    cards = Harness(tmp_path / "b", trials=10, parallel=1, budget={"gpuHours": 1},
                    trial={**TRIAL, "resources": {"accelerator": "2"}}, algorithm={"name": "random"})
    cards.submit()
    cards.now += 1800  # two cards for half an hour: the card-hour budget
    [spent] = cards.end("exp-1-t0", 0.4)
    assert spent.get_data()["reason"] == "the budget of 1 card-hours is spent"


def test_the_best_trials_model_is_released_through_the_release_path(tmp_path: Path) -> None:
    from cascade.events import jobrecords

    released: list[CloudEvent] = []
    h = Harness(tmp_path, trials=2, parallel=2, algorithm={"name": "random"}, release="data.loss < 0.5",
                trial={**TRIAL, "model": {"name": "mlp", "file": "model.pt", "format": "torchscript"}})
    h.controller = Experiments(h.store, lambda job, why: None, clock=lambda: h.now,
                               release=lambda e: released.append(e) or [new_event("model.registered", {
                                   "model": "mlp", "version": "1", "artifactUri": "file:///o/model.pt",
                                   "sha256": "0" * 64, "format": "torchscript"}, source="/t")])
    submitted = h.submit()
    assert all("model" not in e.get_data()["spec"] for e in submitted), "trials register nothing themselves"
    for job, loss in (("exp-1-t0", 0.4), ("exp-1-t1", 0.3)):
        jobrecords.update(h.store, job, "succeeded", artifactUri=f"file:///out/{job}", metrics={"loss": loss})
    h.end("exp-1-t0", 0.4)
    ending = h.end("exp-1-t1", 0.3)
    assert [e["type"] for e in ending] == ["io.cascade.experiment.succeeded.v1", "io.cascade.model.registered.v1"]
    [best] = released
    assert best.get_data() == {"jobId": "exp-1-t1", "artifactUri": "file:///out/exp-1-t1", "metrics": {"loss": 0.3}}
    model = jobrecords.get(h.store, "exp-1-t1")["spec"]["model"]  # type: ignore[index]
    assert model["release"]["when"] == "data.loss < 0.5" and model["name"] == "mlp"
