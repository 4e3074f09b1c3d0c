"""Hyper-parameter experiments as events: trials are training jobs, Optuna chooses and prunes them.

An experiment's state lives in the state store under ``experiment:<id>`` and changes only by
compare-and-set, so concurrent deliveries (a trial ending while another reports) never lose an
update and a redelivered event changes nothing twice. Nothing else is kept between events:
each decision rebuilds an in-memory Optuna study from the recorded trials (parameters,
intermediate values, outcome, the pruner's rung attributes) and asks it, so a restart of the
platform loses nothing and resubmits no running trial.

* ``experiment.submitted``: record the experiment, start ``parallel`` trials.
* ``trial.reported`` (a line of the trial's ``metrics.jsonl``): record the value; the pruner
  (median or ASHA) may stop the trial: it is cancelled with reason ``pruned`` at once and its
  slot goes to the next suggestion.
* ``job.succeeded`` / ``job.failed`` / ``job.cancelled`` of a trial: record the outcome, start
  the next trials while the count and the budget (wall time, card-hours) allow, and end with
  ``experiment.succeeded`` (best trial, parameters, value) or ``experiment.failed``.
* ``experiment.stopped``: cancel the running trials and end.

With a ``model`` in the trial template and a ``release`` expression in the experiment, the end
registers and releases the best trial's model through the usual release path (release-model's
registration, ``release.when`` set to the experiment's expression over the best trial's
metrics); the trials themselves register nothing.

A trial is job ``<experiment>-t<n>``, labelled ``experiment`` and ``trial``: the template's spec
with the trial's parameters merged into its hyperparameters (``CASCADE_HPARAMS``), submitted as
``job.submitted`` through the same launcher, matcher and quotas as any job.
"""

from __future__ import annotations

import copy
import json
import math
import time
import zlib
from collections.abc import Callable
from typing import Any

import optuna
from cloudevents.http import CloudEvent
from optuna.trial import TrialState, create_trial

from cascade.core.errors import NotFound, StoreUnavailable
from cascade.events import jobrecords
from cascade.events.envelope import follow_up
from cascade.events.experiments import best, key
from cascade.functions.experiments import space as spaces
from cascade.scheduling.accelerators import parse
from cascade.stores import StateStore

SOURCE = "/cascade/functions/run-experiment"
STATES = {"running": TrialState.RUNNING, "complete": TrialState.COMPLETE, "pruned": TrialState.PRUNED,
          "failed": TrialState.FAIL}
optuna.logging.set_verbosity(optuna.logging.WARNING)


def trial_job(experiment_id: str, number: int) -> str:
    return f"{experiment_id}-t{number}"


def experiment_of(job_id: str) -> str | None:
    """The experiment a trial's job belongs to (``exp-…-t3`` -> ``exp-…``), or None for another job."""
    head, sep, number = job_id.rpartition("-t")
    return head if job_id.startswith("exp-") and sep and number.isdigit() else None


def build(state: dict[str, Any], salt: int = 0) -> optuna.Study:
    """An in-memory study holding every recorded trial, with the experiment's sampler and pruner."""
    spec = state["spec"]
    algorithm = spec.get("algorithm") or {}
    seed = int(algorithm.get("seed", zlib.crc32(state["id"].encode()))) + salt  # a new draw for each new trial
    name, steps = algorithm.get("name", "tpe"), int(algorithm.get("minSteps", 1))
    sampler: optuna.samplers.BaseSampler
    if name == "grid":  # one seed for every rebuild: it shuffles the grid, and grid ids must mean the same points
        sampler = optuna.samplers.GridSampler(spaces.grid(spec["searchSpace"]), seed=seed - salt)
    elif name == "random":
        sampler = optuna.samplers.RandomSampler(seed=seed)
    else:
        sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=max(2, int(spec.get("parallel", 1))))
    pruner: optuna.pruners.BasePruner = optuna.pruners.NopPruner()
    if algorithm.get("pruner") == "median":
        pruner = optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=steps)
    elif algorithm.get("pruner") == "asha":
        pruner = optuna.pruners.SuccessiveHalvingPruner(min_resource=steps, reduction_factor=3)
    study = optuna.create_study(direction=spec["objective"].get("direction", "minimize"), sampler=sampler,
                                pruner=pruner)
    for t in state["trials"]:
        done = t["state"] == "complete"
        study.add_trial(create_trial(
            state=STATES[t["state"]], value=t["value"] if done else None, params=t["params"],
            distributions=spaces.distributions(spec["searchSpace"], t["params"]),
            intermediate_values={int(k): float(v) for k, v in t["steps"].items()},
            system_attrs=dict(t.get("attrs") or {})))
    return study


def counts(state: dict[str, Any]) -> dict[str, int]:
    return {s: sum(1 for t in state["trials"] if t["state"] == s) for s in ("complete", "pruned", "failed")}


class Experiments:
    def __init__(self, store: StateStore, cancel: Callable[[str, str], None],
                 clock: Callable[[], float] = time.time,
                 release: Callable[[CloudEvent], list[CloudEvent]] | None = None) -> None:
        self.store, self.cancel, self.clock, self.release = store, cancel, clock, release

    # -- state -------------------------------------------------------------------------
    def _change(self, experiment_id: str, change: Callable[[dict[str, Any]], Any]) -> tuple[dict[str, Any], Any]:
        """Apply ``change`` to the stored state by compare-and-set (retried when another delivery won)."""
        for _ in range(100):
            raw = self.store.get(key(experiment_id))
            if raw is None:
                raise NotFound(f"no experiment {experiment_id!r}")
            state = json.loads(raw)
            result = change(state)
            new = json.dumps(state, sort_keys=True).encode()
            if new == raw or self.store.cas(key(experiment_id), raw, new):
                return state, result
        raise StoreUnavailable(f"experiment {experiment_id}: too many concurrent updates")

    # -- decisions (pure over the state) -----------------------------------------------------
    def _cards(self, spec: dict[str, Any]) -> int:
        trial = spec["trial"]
        return parse(str((trial.get("resources") or {}).get("accelerator", "0"))).cards * int(trial.get("workers", 1))

    def _budget_left(self, state: dict[str, Any], now: float) -> str | None:
        """Why no new trial may start, or None."""
        spec = state["spec"]
        budget = spec.get("budget") or {}
        if len(state["trials"]) >= self._total(spec):
            return f"all {self._total(spec)} trials ran"
        if budget.get("wallSeconds") and now - state["created"] >= float(budget["wallSeconds"]):
            return f"the wall-time budget of {budget['wallSeconds']} s is spent"
        if budget.get("gpuHours"):
            used = sum(self._cards(spec) * ((t.get("ended") or now) - t["started"]) / 3600 for t in state["trials"])
            if used >= float(budget["gpuHours"]):
                return f"the budget of {budget['gpuHours']} card-hours is spent"
        return None

    @staticmethod
    def _total(spec: dict[str, Any]) -> int:
        total = int(spec.get("trials", 10))
        if (spec.get("algorithm") or {}).get("name") == "grid":
            sizes = [len(v) for v in spaces.grid(spec["searchSpace"]).values()]
            total = min(total, math.prod(sizes))
        return total

    def _advance(self, state: dict[str, Any], now: float) -> None:
        """Stop the running trials of a stopping experiment, start trials while slots and budget allow, and mark
        the end once nothing runs and nothing may start. Trials to submit or cancel carry a mark for ``_outcome``."""
        spec = state["spec"]
        objective = spec["objective"]
        top = best(state)
        if state["status"] == "running" and top is not None and "goal" in objective:
            reached = (top["value"] >= objective["goal"] if objective.get("direction") == "maximize"
                       else top["value"] <= objective["goal"])
            if reached:
                state["status"], state["reason"] = "stopping", f"trial {top['jobId']} reached the goal"
        if state["status"] == "stopping":
            for t in state["trials"]:
                if t["state"] == "running":
                    t.update(state="failed", why=state["reason"], ended=now, cancel=True)
        if state["status"] == "running":
            while sum(t["state"] == "running" for t in state["trials"]) < int(spec.get("parallel", 1)):
                if (why := self._budget_left(state, now)) is not None:
                    state["reason"] = why
                    break
                study = build(state, salt=len(state["trials"]))
                asked = study.ask()
                params = spaces.suggest(asked, spec["searchSpace"])
                attrs = dict(study.get_trials(deepcopy=False)[-1].system_attrs)  # e.g. the grid point it took
                number = len(state["trials"])
                state["trials"].append({"number": number, "jobId": trial_job(state["id"], number), "params": params,
                                        "state": "running", "steps": {}, "attrs": attrs, "started": now, "new": True})
        if not any(t["state"] == "running" for t in state["trials"]):
            if state["status"] == "running" and self._budget_left(state, now) is None:
                return
            state["status"] = "succeeded" if best(state) is not None else "failed"
            state["ended"] = now

    # -- events ------------------------------------------------------------------------
    def submitted(self, event: CloudEvent) -> list[CloudEvent]:
        data: dict[str, Any] = event.get_data() or {}
        experiment_id, spec = str(data["experimentId"]), dict(data["spec"])
        project = str(data.get("project") or event.get("project") or "default")
        doc = {"id": experiment_id, "project": project, "spec": spec, "status": "running", "trials": [],
               "created": self.clock()}
        self.store.cas(key(experiment_id), None, json.dumps(doc, sort_keys=True).encode())  # a redelivery: kept
        self.store.put_record("experiment", experiment_id, {"id": experiment_id, "project": project,
                                                            "name": spec.get("name", "")}, index=("project",))
        state, _ = self._change(experiment_id, lambda s: self._advance(s, self.clock()))
        return self._outcome(event, state, resubmit=True)

    @staticmethod
    def _trial(event: CloudEvent) -> tuple[dict[str, Any], str, str | None]:
        """(the event's data, its job, the experiment that job is a trial of, or None)."""
        data: dict[str, Any] = event.get_data() or {}
        return data, str(data["jobId"]), experiment_of(str(data["jobId"]))

    def reported(self, event: CloudEvent) -> list[CloudEvent]:
        data, job_id, experiment_id = self._trial(event)
        if experiment_id is None:
            return []

        def record(state: dict[str, Any]) -> bool:
            trial = next((t for t in state["trials"] if t["jobId"] == job_id), None)
            value = data["metrics"].get(state["spec"]["objective"]["metric"])
            if trial is None or trial["state"] != "running" or value is None:
                return False
            trial["steps"][str(int(data["step"]))] = float(value)
            study = build(state)
            position = [t["jobId"] for t in state["trials"]].index(job_id)
            frozen = study.get_trials(deepcopy=False)[position]
            prune = study.pruner.prune(study, frozen)
            trial["attrs"] = dict(study.get_trials(deepcopy=False)[position].system_attrs)
            if prune:
                trial["state"], trial["ended"], trial["why"] = "pruned", self.clock(), f"pruned at step {data['step']}"
                self._advance(state, self.clock())
            return bool(prune)

        state, pruned = self._change(experiment_id, record)
        if pruned:
            self.cancel(job_id, "pruned")
        return self._outcome(event, state)

    def ended(self, event: CloudEvent) -> list[CloudEvent]:
        data, job_id, experiment_id = self._trial(event)
        if experiment_id is None:
            return []
        outcome = str(event["type"]).split(".")[-2]  # succeeded | failed | cancelled

        def record(state: dict[str, Any]) -> None:
            trial = next((t for t in state["trials"] if t["jobId"] == job_id), None)
            if trial is None or trial["state"] != "running":
                return  # already pruned, or a redelivery
            value = (data.get("metrics") or {}).get(state["spec"]["objective"]["metric"])
            if outcome == "succeeded" and value is not None:
                trial["state"], trial["value"] = "complete", float(value)
            else:
                trial["state"] = "failed"
                trial["why"] = str(data.get("reason") or f"the trial ended without the metric "
                                   f"{state['spec']['objective']['metric']!r}")
            trial["ended"] = self.clock()
            self._advance(state, self.clock())

        state, _ = self._change(experiment_id, record)
        return self._outcome(event, state)

    def stopped(self, event: CloudEvent) -> list[CloudEvent]:
        data: dict[str, Any] = event.get_data() or {}
        experiment_id = str(data["experimentId"])

        def stop(state: dict[str, Any]) -> None:
            if state["status"] == "running":
                state["status"], state["reason"] = "stopping", str(data.get("reason") or "stopped on request")
                self._advance(state, self.clock())

        state, _ = self._change(experiment_id, stop)
        return self._outcome(event, state)

    def _release_best(self, cause: CloudEvent, state: dict[str, Any], top: dict[str, Any]) -> list[CloudEvent]:
        """The best trial's model, registered and (when the experiment's ``release`` holds) released."""
        model, gate = state["spec"]["trial"].get("model"), state["spec"].get("release")
        record = jobrecords.get(self.store, top["jobId"]) or {}
        if self.release is None or not model or not gate or not record.get("artifactUri"):
            return []
        spec = {**(record.get("spec") or {}), "model": {**model, "release": {**(model.get("release") or {}), "when": gate}}}
        self.store.put_record("job", top["jobId"], {**record, "spec": spec}, index=jobrecords.INDEX)
        succeeded = follow_up(cause, "job.succeeded", {"jobId": top["jobId"], "artifactUri": record["artifactUri"],
                                                       "metrics": record.get("metrics") or {}},
                              source=SOURCE, id=f"best-{state['id']}", subject=top["jobId"])
        return self.release(succeeded)

    def _announce(self, experiment_id: str) -> bool:
        """Whether this delivery is the one that announces the end (the first to mark it, by compare-and-set)."""
        def mark(state: dict[str, Any]) -> bool:
            first = not state.get("announced")
            state["announced"] = True
            return first

        return bool(self._change(experiment_id, mark)[1])

    def _outcome(self, cause: CloudEvent, state: dict[str, Any], *, resubmit: bool = False) -> list[CloudEvent]:
        """The events the new state calls for: new trials' submissions, cancellations, the end."""
        out = []
        fresh = [t for t in state["trials"] if t.pop("new", False) or (resubmit and t["state"] == "running")]
        stop = [t for t in state["trials"] if t.pop("cancel", False)]
        if fresh or stop:  # clear the marks (a later delivery must not act on them again)
            self._change(state["id"], lambda s: [(t.pop("new", None), t.pop("cancel", None)) for t in s["trials"]])
        for t in stop:
            self.cancel(t["jobId"], str(t.get("why") or "stopped"))
        for t in fresh:
            spec = copy.deepcopy(state["spec"]["trial"])
            spec["hyperparameters"] = {**(spec.get("hyperparameters") or {}), **t["params"]}
            spec["name"] = f"{state['spec'].get('name') or state['id']} trial {t['number']}"
            spec["labels"] = {**(spec.get("labels") or {}), "experiment": state["id"], "trial": str(t["number"])}
            spec.pop("model", None)  # a trial's model is not released by itself; the experiment's end says which
            if jobrecords.get(self.store, t["jobId"]) is None:
                jobrecords.create(self.store, t["jobId"], "training", state["project"], spec)
            out.append(follow_up(cause, "job.submitted", {"jobId": t["jobId"], "project": state["project"], "spec": spec},
                                 source=SOURCE, id=f"submit-{t['jobId']}", subject=t["jobId"], partitionkey=t["jobId"],
                                 extensions={"project": state["project"]}))
        if state["status"] in ("succeeded", "failed") and self._announce(state["id"]):
            top = best(state)
            if top is not None:
                data: dict[str, Any] = {"experimentId": state["id"], "bestTrial": top["jobId"], "parameters": top["params"],
                                        "metric": state["spec"]["objective"]["metric"], "value": top["value"],
                                        "trials": counts(state), "reason": state.get("reason", "")}
                out.append(follow_up(cause, "experiment.succeeded", data, source=SOURCE, id=f"end-{state['id']}",
                                     subject=state["id"], partitionkey=state["id"],
                                     extensions={"project": state["project"]}))
                out += self._release_best(out[-1], state, top)
            else:
                out.append(follow_up(cause, "experiment.failed", {
                    "experimentId": state["id"], "reason": state.get("reason") or "no trial completed",
                    "trials": counts(state)}, source=SOURCE, id=f"end-{state['id']}", subject=state["id"],
                    partitionkey=state["id"], extensions={"project": state["project"]}))
        return out
