"""Placement benchmark: 10,000 jobs on a synthetic 1,000-node heterogeneous inventory.

The same arrival trace is replayed twice: with Cascade's matcher (flavor order, best-fit
nodes, shares packed onto partly used cards) and with naive first-fit (first node with room,
a fraction takes a whole card). Both queue what does not fit (FIFO). Reported: placement
time, accelerator utilisation (requested card-time over capacity card-time until the
last job ends) and queueing delay.
Run:  .venv/bin/python -m bench.placement_bench
"""

from __future__ import annotations

import argparse
import heapq
import random
import time
from collections import deque
from typing import Any

from bench.common import mean, percentile, table
from cascade.scheduling.accelerators import parse
from cascade.scheduling.matcher import Matcher
from cascade.scheduling.placement import Inventory, Job, NoFit, Placement

FLAVORS = [("t4", "nvidia", "T4", 16, 400, 4), ("v100", "nvidia", "V100", 32, 150, 8),
           ("a100", "nvidia", "A100", 80, 250, 8), ("ascend", "npu", "910B", 64, 150, 8), ("cpu", "cpu", "", 0, 50, 0)]
REQUESTS = [("0.25", 0.12), ("0.5", 0.13), ("8G,0.5", 0.10), ("1", 0.25), ("2", 0.12), ("4", 0.08), ("8", 0.05),
            ("1(A100)", 0.05), ("1(npu,910B)", 0.04), ("4(npu,910B)", 0.03), ("0", 0.03)]


def inventory() -> Inventory:
    return Inventory.from_dict({"flavors": [
        {"name": n, "vendor": v, "model": m, "memoryGiB": mem, "count": count, "cardsPerNode": cards,
         "sharing": "none" if v == "npu" else "hami"} for n, v, m, mem, count, cards in FLAVORS]})


def trace(n: int, seed: int, gap: float) -> list[tuple[float, Job, float]]:
    rng = random.Random(seed)
    texts, weights = zip(*REQUESTS)
    jobs, now = [], 0.0
    for i in range(n):
        now += rng.expovariate(1 / gap)
        text = rng.choices(texts, weights)[0]
        workers = 2 if text == "8" and rng.random() < 0.3 else 1
        framework = "sklearn" if text == "0" else "pytorch"
        jobs.append((now, Job(f"j{i}", parse(text), workers, framework), rng.expovariate(1 / 60)))
    return jobs


def simulate(jobs: list[tuple[float, Job, float]], naive: bool) -> dict[str, Any]:
    inv = inventory()
    matcher = Matcher(inv, naive=naive)
    accel_cards = sum(f.cards for f in inv.flavors.values() if f.vendor != "cpu")
    running: list[tuple[float, int, Placement]] = []
    queue: deque[tuple[float, Job, float]] = deque()
    waits, work, place_seconds, placed, end = [], 0.0, 0.0, 0, 0.0
    counter = 0
    clock = {"t": 0.0, "used": 0.0, "area": 0.0, "span": 0.0}  # requested cards in use, integrated while jobs wait

    def advance(now: float) -> None:
        if queue and now > clock["t"]:
            clock["area"] += clock["used"] * (now - clock["t"])
            clock["span"] += now - clock["t"]
        clock["t"] = max(clock["t"], now)

    def cards(job: Job) -> float:
        return 0.0 if job.request.none else job.workers * job.request.count

    def try_place(now: float, job: Job, duration: float) -> bool:
        nonlocal place_seconds, placed, work, counter, end
        t0 = time.perf_counter()
        try:
            placement = matcher.place(job)
        except NoFit:
            place_seconds += time.perf_counter() - t0
            return False
        matcher.allocate(placement)
        place_seconds += time.perf_counter() - t0
        placed += 1
        counter += 1
        heapq.heappush(running, (now + duration, counter, placement))
        end = max(end, now + duration)
        work += cards(job) * duration
        clock["used"] += cards(job)
        return True

    def finish_until(now: float) -> None:
        while running and running[0][0] <= now:
            done, _, placement = heapq.heappop(running)
            advance(done)
            matcher.release(placement)
            clock["used"] -= cards(placement.job)
            while queue:  # FIFO: the head must go first
                arrived, job, duration = queue[0]
                if not try_place(done, job, duration):
                    break
                queue.popleft()
                waits.append(done - arrived)

    for arrival, job, duration in jobs:
        finish_until(arrival)
        advance(arrival)
        if queue or not try_place(arrival, job, duration):
            queue.append((arrival, job, duration))
        else:
            waits.append(0.0)
    finish_until(float("inf"))
    return {"placed": placed, "seconds": place_seconds, "utilisation": work / (accel_cards * end), "end": end,
            "busy": clock["area"] / (accel_cards * clock["span"]) if clock["span"] else 0.0,
            "wait_mean": mean(waits), "wait_p99": percentile(waits, 99), "queued": sum(1 for w in waits if w > 0)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--gap", type=float, default=0.014, help="mean seconds between arrivals (offered load)")
    args = parser.parse_args()
    jobs = trace(args.jobs, args.seed, args.gap)
    smart, naive = simulate(jobs, naive=False), simulate(jobs, naive=True)
    rows = [[name, r["placed"], r["seconds"], r["seconds"] / r["placed"] * 1e6, r["utilisation"] * 100,
             r["busy"] * 100, r["queued"], r["wait_mean"], r["wait_p99"], r["end"]] for name, r in (("naive first-fit", naive),
                                                                                  ("cascade matcher", smart))]
    print(table(f"{args.jobs} jobs on {sum(f[4] for f in FLAVORS)} nodes "
                f"({sum(f[4] * f[5] for f in FLAVORS)} accelerator cards), same trace",
                ["placer", "placed", "place s", "us/job", "util %", "util % while queued", "queued", "wait mean",
                 "wait p99", "makespan"],
                rows))
    print(f"utilisation ratio (cascade / naive): {smart['utilisation'] / naive['utilisation']:.2f} overall, "
          f"{smart['busy'] / max(naive['busy'], 1e-9):.2f} while jobs wait; "
          f"mean queueing delay ratio: {smart['wait_mean'] / max(naive['wait_mean'], 1e-9):.2f}")


if __name__ == "__main__":
    main()
