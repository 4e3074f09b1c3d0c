"""Placement benchmark: 10,000 jobs on a synthetic 1,000-node heterogeneous inventory.

Two request mixes: ``balanced`` (a third of the jobs ask for a share of a card) and ``shared``
(most do, as where notebooks, evaluations and small fine-tunes run beside training). For each,
the same arrival trace (arrivals and completions) is replayed twice: naive first-fit (first
node with room, a fraction takes a whole card) with a strict FIFO queue, the baseline; and the
real scheduling path, the ledger (``cascade.scheduling.ledger``: best-fit placement, bookings
and the wait queue journaled in a SQLite state store, admission at every completion), once with
a commit per decision and ``--repeat`` times with ``--group`` decisions per commit (a burst the
launcher's threads handle at once: each waits for its group's commit before it launches). Reported:
scheduler time (the ledger's calls, and the part of it spent in the store; of the repeats, the
fastest, as timeit advises on a shared machine, with every repeat printed), accelerator
utilisation (requested card-time over capacity card-time until the last job ends, and while
jobs wait) and queueing delay.
Run:  .venv/bin/python -m bench.placement_bench
"""

from __future__ import annotations

import argparse
import heapq
import random
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any, cast

from bench.common import mean, percentile, table
from cascade.scheduling import ledger as ledger_module
from cascade.scheduling.accelerators import parse
from cascade.scheduling.ledger import Ledger, Waiting
from cascade.scheduling.matcher import Matcher
from cascade.scheduling.placement import Inventory, Job, NoFit, Placement
from cascade.stores import StateStore
from cascade.stores.sqlite import SqliteStore

FLAVORS = [("t4", "nvidia", "T4", 16, 400, 4), ("v100", "nvidia", "V100", 32, 150, 8),
           ("a100", "nvidia", "A100", 80, 250, 8), ("ascend", "npu", "910B", 64, 150, 8), ("cpu", "cpu", "", 0, 50, 0)]
MIXES = {  # request -> share of the jobs
    # a third of the jobs ask for a share of a card
    "balanced": [("0.25", 0.12), ("0.5", 0.13), ("8G,0.5", 0.10), ("1", 0.25), ("2", 0.12), ("4", 0.08), ("8", 0.05),
                 ("1(A100)", 0.05), ("1(npu,910B)", 0.04), ("4(npu,910B)", 0.03), ("0", 0.03)],
    # most jobs ask for a share (notebooks, small fine-tunes and evaluations beside the training runs)
    "shared": [("0.25", 0.25), ("0.5", 0.20), ("8G,0.5", 0.15), ("1", 0.15), ("2", 0.07), ("4", 0.05), ("8", 0.04),
               ("1(A100)", 0.03), ("1(npu,910B)", 0.02), ("4(npu,910B)", 0.02), ("0", 0.02)],
}


def inventory() -> Inventory:
    return Inventory.from_dict({"flavors": [
        {"name": n, "vendor": v, "model": m, "memoryGiB": mem, "count": count, "cardsPerNode": cards,
         "sharing": "none" if v == "npu" else "hami"} for n, v, m, mem, count, cards in FLAVORS]})


def trace(n: int, seed: int, gap: float, mix: str = "balanced") -> list[tuple[float, Job, float]]:
    rng = random.Random(seed)
    texts, weights = zip(*MIXES[mix])
    jobs, now = [], 0.0
    for i in range(n):
        now += rng.expovariate(1 / gap)
        text = rng.choices(texts, weights)[0]
        workers = 2 if text == "8" and rng.random() < 0.3 else 1
        framework = "sklearn" if text == "0" else "pytorch"
        jobs.append((now, Job(f"j{i}", parse(text), workers, framework), rng.expovariate(1 / 60)))
    return jobs


class Meter:
    """Requested cards in use over time, integrated while jobs wait: every accelerator, and the GPUs alone (the
    NVIDIA flavors; the trace's Ascend cards idle whenever only GPU jobs wait, which caps the first figure)."""

    def __init__(self, inv: Inventory) -> None:
        self.accel = sum(f.cards for f in inv.flavors.values() if f.vendor != "cpu")
        self.gpu = sum(f.cards for f in inv.flavors.values() if f.vendor == "nvidia")
        self.t = self.used = self.used_gpu = self.area = self.area_gpu = self.span = 0.0

    @staticmethod
    def cards(job: Job) -> float:
        return 0.0 if job.request.none else job.workers * job.request.count

    def advance(self, now: float, waiting: bool) -> None:
        if waiting and now > self.t:
            self.area += self.used * (now - self.t)
            self.area_gpu += self.used_gpu * (now - self.t)
            self.span += now - self.t
        self.t = max(self.t, now)

    def take(self, job: Job, sign: float = 1.0) -> None:
        self.used += sign * self.cards(job)
        if not job.request.none and job.request.vendor in (None, "nvidia"):
            self.used_gpu += sign * self.cards(job)

    def busy(self) -> dict[str, float]:
        return {"busy": self.area / (self.accel * self.span) if self.span else 0.0,
                "busy_gpu": self.area_gpu / (self.gpu * self.span) if self.span else 0.0}


def simulate(jobs: list[tuple[float, Job, float]], naive: bool) -> dict[str, Any]:
    inv = inventory()
    matcher = Matcher(inv, naive=naive)
    meter = Meter(inv)
    running: list[tuple[float, int, Placement]] = []
    queue: deque[tuple[float, Job, float]] = deque()
    waits, work, place_seconds, placed, end = [], 0.0, 0.0, 0, 0.0
    counter = 0

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
        work += meter.cards(job) * duration
        meter.take(job)
        return True

    def finish_until(now: float) -> None:
        while running and running[0][0] <= now:
            done, _, placement = heapq.heappop(running)
            meter.advance(done, bool(queue))
            matcher.release(placement)
            meter.take(placement.job, -1)
            while queue:  # FIFO: the head must go first
                arrived, job, duration = queue[0]
                if not try_place(done, job, duration):
                    break
                queue.popleft()
                waits.append(done - arrived)

    for arrival, job, duration in jobs:
        finish_until(arrival)
        meter.advance(arrival, bool(queue))
        if queue or not try_place(arrival, job, duration):
            queue.append((arrival, job, duration))
        else:
            waits.append(0.0)
    finish_until(float("inf"))
    return {"placed": placed, "seconds": place_seconds, "utilisation": work / (meter.accel * end), "end": end,
            **meter.busy(), "wait_mean": mean(waits), "wait_p99": percentile(waits, 99),
            "queued": sum(1 for w in waits if w > 0)}


class TimedStore:
    """The store the ledger writes through, with the seconds spent inside it counted."""

    def __init__(self, store: StateStore) -> None:
        self.store, self.seconds = store, 0.0

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.store, name)

        def timed(*args: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return method(*args, **kw)
            finally:
                self.seconds += time.perf_counter() - t0
        return timed


def simulate_ledger(jobs: list[tuple[float, Job, float]], naive: bool, folder: Path, group: int = 1) -> dict[str, Any]:
    """The real path: book at arrival, release at completion, the admitted start then. ``group``: decisions taken
    before the launcher waits for them to be durable (``sync``) and starts what they placed; the launcher's threads
    do the same when ``group`` events arrive at once (group commit). Simulated time is the trace's: a launch that
    waits for its commit does not move it."""
    inv = inventory()
    store = TimedStore(SqliteStore(folder / f"ledger-{'naive' if naive else 'cascade'}.db"))
    ledger = Ledger(cast(StateStore, store), inv, naive=naive)
    meter = Meter(inv)
    durations = {job.id: duration for _, job, duration in jobs}
    arrived = {job.id: at for at, job, _ in jobs}
    running: list[tuple[float, int, Job]] = []
    waits: list[float] = []
    seconds, work, end, counter, waiting, decisions = 0.0, 0.0, 0.0, 0, 0, 0

    def decided() -> float:
        nonlocal decisions
        decisions += 1
        if decisions % group:
            return 0.0
        t0 = time.perf_counter()
        ledger.sync()
        return time.perf_counter() - t0

    def start(now: float, job: Job) -> None:
        nonlocal counter, work, end
        counter += 1
        heapq.heappush(running, (now + durations[job.id], counter, job))
        end = max(end, now + durations[job.id])
        work += meter.cards(job) * durations[job.id]
        meter.take(job)
        waits.append(now - arrived[job.id])

    def finish_until(now: float) -> None:
        nonlocal seconds, waiting
        while running and running[0][0] <= now:
            done, _, job = heapq.heappop(running)
            meter.advance(done, waiting > 0)
            meter.take(job, -1)
            t0 = time.perf_counter()
            admitted = ledger.release(job.id, wait=False)
            seconds += time.perf_counter() - t0 + decided()
            waiting -= len(admitted)
            for a in admitted:
                start(done, a.placement.job)

    for arrival, job, _ in jobs:
        finish_until(arrival)
        meter.advance(arrival, waiting > 0)
        t0 = time.perf_counter()
        booked = ledger.book(job, wait=False)
        seconds += time.perf_counter() - t0 + decided()
        if isinstance(booked, Waiting):
            waiting += 1
        else:
            start(arrival, job)
    finish_until(float("inf"))
    t0 = time.perf_counter()
    ledger.sync()
    seconds += time.perf_counter() - t0
    return {"placed": len(waits), "seconds": seconds, "store": store.seconds, "utilisation": work / (meter.accel * end),
            "end": end, **meter.busy(), "wait_mean": mean(waits), "wait_p99": percentile(waits, 99),
            "queued": sum(1 for w in waits if w > 0)}


BUILD = ("cascade.scheduling compiled by mypyc" if ledger_module.__file__ and not ledger_module.__file__.endswith(".py")
         else "cascade.scheduling as plain Python")
GAPS = {"balanced": 0.014, "shared": 0.010}  # mean seconds between arrivals: the ledger's queue forms in both


def run(mix: str, n: int, seed: int, gap: float, group: int, repeat: int) -> None:
    jobs = trace(n, seed, gap, mix)
    naive = simulate(jobs, naive=True)
    with tempfile.TemporaryDirectory() as folder:
        alone = simulate_ledger(jobs, False, Path(folder) / "alone", 1)
        # The scheduler's own cost is the fastest of the repeats (a fresh store each): on a shared VM the slower ones
        # measure the neighbours too (timeit's advice); every repeat is printed.
        runs = [simulate_ledger(jobs, False, Path(folder) / f"grouped-{i}", group) for i in range(repeat)]
        smart = min(runs, key=lambda r: r["seconds"])
    repeats = " / ".join(f"{r['seconds']:.2f}" for r in runs)
    rows = [[name, r["placed"], r["seconds"], r.get("store", 0.0), r["seconds"] / r["placed"] * 1e6,
             r["utilisation"] * 100, r["busy"] * 100, r["busy_gpu"] * 100, r["queued"], r["wait_mean"], r["wait_p99"],
             r["end"]]
            for name, r in (("first-fit, strict FIFO (baseline)", naive),
                            ("ledger, a commit per decision", alone),
                            (f"ledger, {group} decisions per commit", smart))]
    print(table(f"{mix} mix: {n} jobs on {sum(f[4] for f in FLAVORS)} nodes "
                f"({sum(f[4] * f[5] for f in FLAVORS)} accelerator cards), a job every {gap * 1000:g} ms on average, "
                "same trace with arrivals and completions",
                ["scheduler", "placed", "sched s", "of it store s", "us/job", "util %", "util % while queued",
                 "GPU util % while queued", "queued", "wait mean", "wait p99", "makespan"], rows))
    print(f"{mix} mix, cascade's ledger against the baseline: utilisation {smart['utilisation'] / naive['utilisation']:.2f}x "
          f"overall, {smart['busy'] / max(naive['busy'], 1e-9):.2f}x while jobs wait (GPUs alone "
          f"{smart['busy_gpu'] / max(naive['busy_gpu'], 1e-9):.2f}x, where no scheduler gets past "
          f"{1 / max(naive['busy_gpu'], 1e-9):.2f}x: every GPU busy while one waits); mean queueing delay "
          f"{smart['wait_mean']:.2f} s against {naive['wait_mean']:.2f} s; scheduler time "
          f"{smart['seconds']:.2f} s for {smart['placed']} jobs with {group} decisions per commit "
          f"({smart['seconds'] - smart['store']:.2f} s deciding, {smart['store']:.2f} s in the store; a commit per "
          f"decision: {alone['seconds']:.2f} s; the fastest of {repeat} repeats: "
          f"{repeats} s; {BUILD})\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--mix", choices=[*MIXES, "both"], default="both")
    parser.add_argument("--gap", type=float, help="mean seconds between arrivals (offered load; default per mix)")
    parser.add_argument("--repeat", type=int, default=5, help="runs of the grouped ledger; the fastest is reported")
    parser.add_argument("--group", type=int, default=16,
                        help="decisions per commit: events the launcher handles at once (its threads) in a burst")
    args = parser.parse_args()
    for mix in MIXES if args.mix == "both" else [args.mix]:
        run(mix, args.jobs, args.seed, args.gap or GAPS[mix], args.group, args.repeat)


if __name__ == "__main__":
    main()
