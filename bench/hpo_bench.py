"""Hyper-parameter search benchmark: TPE (with and without ASHA) against random search, same budget.

The experiment controller (``cascade.functions.experiments.controller``) runs as it does on the
platform (state in a real SQLite store, every decision rebuilt from it), driven by a simulated
clock: each trial "trains" for 30 steps of a synthetic objective over a log learning rate and a
hidden size (noisy, with a curved valley), reporting every step, so pruning saves trial time.
Reported per algorithm, over seeds: the best loss after the budget, the simulated time until a
trial first reached what random search reached with the whole budget (and the speed-up that
makes), the time the whole budget took, and the controller's own time per decision. Run:  .venv/bin/python -m bench.hpo_bench [--seeds 8] [--trials 24]
"""

from __future__ import annotations

import argparse
import heapq
import math
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import table
from cascade.events.envelope import new_event
from cascade.functions.experiments.controller import Experiments
from cascade.stores.sqlite import SqliteStore

SPACE = {"lr": {"type": "loguniform", "low": 1e-4, "high": 1.0}, "hidden": {"type": "int", "low": 2, "high": 128, "step": 2}}
STEPS, STEP_SECONDS = 30, 10.0


def curve(params: dict[str, Any], step: int, noise: random.Random) -> float:
    """Loss after ``step`` steps: best near lr 0.03 and 64 hidden units; slow or unstable elsewhere."""
    distance = (math.log10(params["lr"]) + 1.5) ** 2 + ((params["hidden"] - 64) / 48) ** 2
    floor = 0.05 + 0.4 * distance
    return floor + (1.5 - floor) * math.exp(-(step + 1) / (4 + 6 * distance)) + noise.gauss(0, 0.01)


def run(algorithm: dict[str, Any], seed: int, trials: int, parallel: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteStore(Path(tmp) / "state.db")
        clock = [0.0]
        cancelled: set[str] = set()
        controller = Experiments(store, lambda job, why: cancelled.add(job), clock=lambda: clock[0])
        spec = {"trial": {"framework": "pytorch", "entrypoint": {"script": "t.py"}}, "searchSpace": SPACE,
                "objective": {"metric": "loss"}, "algorithm": {**algorithm, "seed": seed}, "trials": trials,
                "parallel": parallel}
        noise = random.Random(seed)
        queue: list[tuple[float, str, int, dict[str, Any]]] = []  # (time, job, step, params)
        decisions, decided = 0, 0.0

        def submit(events: list[Any]) -> None:
            for e in events:
                if e["type"] == "io.cascade.job.submitted.v1":
                    d = e.get_data()
                    heapq.heappush(queue, (clock[0] + STEP_SECONDS, d["jobId"], 0, d["spec"]["hyperparameters"]))

        def timed(call: Any, event: Any) -> list[Any]:
            nonlocal decisions, decided
            started = time.perf_counter()
            out = call(event)
            decided += time.perf_counter() - started
            decisions += 1
            return list(out)

        submit(timed(controller.submitted, new_event("experiment.submitted", {
            "experimentId": "exp-bench", "project": "p", "spec": spec}, source="/bench")))
        first_hit: dict[float, float] = {}
        best = math.inf
        while queue:
            clock[0], job, step, params = heapq.heappop(queue)
            if job in cancelled:
                continue
            loss = curve(params, step, noise)
            submit(timed(controller.reported, new_event("trial.reported", {
                "jobId": job, "step": step, "metrics": {"loss": loss}}, source="/bench")))
            if job in cancelled:
                continue
            if step + 1 < STEPS:
                heapq.heappush(queue, (clock[0] + STEP_SECONDS, job, step + 1, params))
                continue
            if loss < best:
                best = loss
                first_hit[loss] = clock[0]
            submit(timed(controller.ended, new_event("job.succeeded", {
                "jobId": job, "artifactUri": "file:///x", "metrics": {"loss": loss}}, source="/bench")))
        store.close()
        return {"best": best, "hits": first_hit, "ms": 1000 * decided / max(1, decisions), "end": clock[0]}  # type: ignore[dict-item]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--trials", type=int, default=24)
    parser.add_argument("--parallel", type=int, default=3)
    args = parser.parse_args()
    algorithms = {"random": {"name": "random"}, "tpe": {"name": "tpe"}, "tpe+asha": {"name": "tpe", "pruner": "asha",
                                                                                 "minSteps": 2}}
    results = {name: [run(a, seed, args.trials, args.parallel) for seed in range(args.seeds)]
               for name, a in algorithms.items()}
    rows = []
    target = sorted(r["best"] for r in results["random"])[args.seeds // 2]  # random search's median final best
    for seed in range(args.seeds):
        for name in algorithms:
            hits = results[name][seed]["hits"]
            reached = [t for loss, t in hits.items() if loss <= target]  # type: ignore[union-attr]
            results[name][seed]["to_target"] = min(reached) if reached else results[name][seed]["end"]
    base = sorted(r["to_target"] for r in results["random"])[args.seeds // 2]
    for name in algorithms:
        runs = results[name]
        median_best = sorted(r["best"] for r in runs)[args.seeds // 2]
        median_time = sorted(r["to_target"] for r in runs)[args.seeds // 2]
        rows.append([name, f"{median_best:.4f}", f"{median_time / 3600:.2f} h", f"{base / median_time:.2f}x",
                     f"{sorted(r['end'] for r in runs)[args.seeds // 2] / 3600:.2f} h",
                     f"{sum(r['ms'] for r in runs) / len(runs):.1f} ms"])
    print(table(f"{args.trials} trials, {args.parallel} in parallel, {STEPS} steps of {STEP_SECONDS:g} s each, "
                f"{args.seeds} seeds (medians); time to target: until a trial reaches random search's median final best "
                f"({target:.4f}; the whole budget when never)",
                ["algorithm", "best loss", "time to target", "speed-up vs random", "whole budget", "per decision"],
                rows))


if __name__ == "__main__":
    main()
