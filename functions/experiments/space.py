"""An experiment's search space as Optuna sees it (the spec's own checks: ``cascade.events.experiments``).

``suggest`` asks an Optuna trial for each parameter in order, skipping a conditional one whose
condition does not hold; ``distributions`` gives the same ranges back for trials rebuilt from
the store; ``grid`` lists the values of a grid search.
"""

from __future__ import annotations

from typing import Any

from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import Trial


def distribution(p: dict[str, Any]) -> BaseDistribution:
    if p["type"] == "choice":
        return CategoricalDistribution(list(p["values"]))
    if p["type"] == "int":
        return IntDistribution(int(p["low"]), int(p["high"]), step=int(p.get("step", 1)))
    return FloatDistribution(float(p["low"]), float(p["high"]), log=p["type"] == "loguniform")


def distributions(space: dict[str, dict[str, Any]], params: dict[str, Any]) -> dict[str, BaseDistribution]:
    """The distributions of the parameters a trial has (conditional ones may be absent)."""
    return {name: distribution(space[name]) for name in params if name in space}


def suggest(trial: Trial, space: dict[str, dict[str, Any]]) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for name, p in space.items():
        if any(params.get(k) != v for k, v in (p.get("when") or {}).items()):
            continue
        if p["type"] == "choice":
            params[name] = trial.suggest_categorical(name, list(p["values"]))
        elif p["type"] == "int":
            params[name] = trial.suggest_int(name, int(p["low"]), int(p["high"]), step=int(p.get("step", 1)))
        else:
            params[name] = trial.suggest_float(name, float(p["low"]), float(p["high"]), log=p["type"] == "loguniform")
    return params


def grid(space: dict[str, dict[str, Any]]) -> dict[str, list[Any]]:
    return {name: list(p["values"]) if p["type"] == "choice" else
            list(range(int(p["low"]), int(p["high"]) + 1, int(p.get("step", 1)))) for name, p in space.items()}
