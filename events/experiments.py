"""Experiments as the gateway and the CLI see them: the spec's checks, the id, where the state is kept.

``check`` refuses what the JSON Schema cannot say (bounds in order, a log range above zero, a
condition naming a later parameter, a grid over a continuous range), naming the field, so a bad
search space is a 400 at submission and never a failed experiment later. The state itself is
written by the experiment controller (``cascade.functions.experiments.controller``) under
``experiment:<id>``; ``read`` and ``listed`` are the views the API and ``cascade experiments``
show.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from cascade.core.errors import InvalidInput, NotFound
from cascade.events import schemas
from cascade.stores import StateStore


def key(experiment_id: str) -> str:
    return f"experiment:{experiment_id}"


def new_id() -> str:
    return "exp-" + uuid.uuid4().hex[:12]


def check(spec: Any) -> None:
    """The schema, then what it cannot say; InvalidInput naming the field."""
    schemas.validate("experiment.v1", spec, prefix="/spec")
    space: dict[str, dict[str, Any]] = spec["searchSpace"]
    seen: list[str] = []
    grid = (spec.get("algorithm") or {}).get("name") == "grid"
    for name, p in space.items():
        at = f"/spec/searchSpace/{name}"
        kind = p["type"]
        if kind == "choice" and not p.get("values"):
            raise InvalidInput("a choice needs its values", field=f"{at}/values")
        if kind != "choice":
            if "low" not in p or "high" not in p:
                raise InvalidInput(f"a {kind} range needs low and high", field=at)
            if not p["low"] < p["high"]:
                raise InvalidInput(f"low ({p['low']}) must be below high ({p['high']})", field=f"{at}/low")
        if kind == "loguniform" and p["low"] <= 0:
            raise InvalidInput("a loguniform range starts above zero", field=f"{at}/low")
        if kind == "int" and not (float(p["low"]).is_integer() and float(p["high"]).is_integer()):
            raise InvalidInput("an int range has whole bounds", field=f"{at}/low")
        for other in p.get("when") or {}:
            if other not in seen:
                raise InvalidInput(f"the condition names {other!r}, which is not an earlier parameter",
                                   field=f"{at}/when")
        if grid and kind in ("uniform", "loguniform"):
            raise InvalidInput("a grid search takes choice and int ranges only", field=f"{at}/type")
        seen.append(name)
    if grid and any(p.get("when") for p in space.values()):
        raise InvalidInput("a grid search takes no conditional parameters", field="/spec/algorithm/name")




def read(store: StateStore, experiment_id: str, project: str | None = None) -> dict[str, Any]:
    """The experiment's state (trials, best so far); NotFound for another project's."""
    raw = store.get(key(experiment_id))
    state = json.loads(raw) if raw is not None else None
    if state is None or (project is not None and state.get("project") != project):
        raise NotFound(f"no experiment {experiment_id!r}")
    return dict(state)


def _sign(state: dict[str, Any]) -> float:
    """+1 when lower is better, -1 when higher is: ``sign * value`` orders trials best first."""
    return -1.0 if state["spec"]["objective"].get("direction") == "maximize" else 1.0


def best(state: dict[str, Any]) -> dict[str, Any] | None:
    """The completed trial with the best objective value, or None before one completed."""
    done = [t for t in state.get("trials") or [] if t.get("state") == "complete"]
    return dict(min(done, key=lambda t: _sign(state) * float(t["value"]))) if done else None


def summary(state: dict[str, Any]) -> dict[str, Any]:
    """One line of a listing: status, trials by state, the best value so far."""
    trials = state.get("trials") or []
    top = best(state)
    return {"id": state["id"], "name": state["spec"].get("name", ""), "status": state["status"],
            "trials": {s: sum(1 for t in trials if t.get("state") == s) for s in ("running", "complete", "pruned", "failed")},
            "metric": state["spec"]["objective"]["metric"],
            "best": None if top is None else {"jobId": top["jobId"], "value": top["value"], "parameters": top["params"]}}


def listed(store: StateStore, project: str) -> list[dict[str, Any]]:
    out = []
    for record in store.find_records("experiment", project=project):
        try:
            out.append(summary(read(store, str(record["id"]), project)))
        except NotFound:
            continue
    return out


def progress(state: dict[str, Any]) -> list[dict[str, Any]]:
    """The objective per ended trial over time (seconds since the experiment started), with the best so far,
    for the dashboard's plot."""
    sign = _sign(state)
    points, so_far = [], None
    for t in sorted((t for t in state.get("trials") or [] if t.get("state") == "complete"), key=lambda t: t["ended"]):
        value = float(t["value"])
        so_far = value if so_far is None or sign * value < sign * so_far else so_far
        points.append({"t": round(float(t["ended"]) - float(state["created"]), 3), "value": value, "best": so_far,
                       "jobId": t["jobId"]})
    return points


def report_rows(text: bytes) -> list[tuple[int, dict[str, float]]]:
    """The ``(step, metrics)`` of each whole ``metrics.jsonl`` line (``{"step": 3, "loss": 0.4}``) in ``text``.

    Lines that are not such an object (a step of at least 0 and at least one number) are the job's own
    business and are skipped; the local supervisor and the gateway's report route read lines the same way."""
    rows = []
    for line in text.splitlines():
        try:
            row = json.loads(line)
            step = int(row.pop("step"))
            values = {k: float(v) for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
        if step >= 0 and values:
            rows.append((step, values))
    return rows
