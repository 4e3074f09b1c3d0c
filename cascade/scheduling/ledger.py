"""Bookings and the wait queue: placement takes what it places, every end gives it back.

The matcher only answers "where would this job go"; the ledger makes the answer hold, as
Kueue does when it admits a workload by reserving its quota. ``book`` places a job and books
its cards (or card shares), cores and host memory on the chosen nodes and charges its project's
quota; a job that fits nowhere *now* but would fit the empty inventory waits in its queue with
the reason per flavor, and one that could never fit is refused (``NoFit``) at once. ``release``
gives a job's booking back (or takes it out of the queue) and admits the waiting jobs that now
fit, highest priority first and then in submission order; a waiting job that does not fit yet
does not hold back a smaller one behind it (Kueue's BestEffortFIFO).

Projects in a cohort lend each other the quota they do not use (Kueue's cohorts): a job may go
beyond its project's nominal quota while the cohort as a whole stays within the sum of its
members'. When a project needs its own quota back, the ledger preempts the newest bookings of
cohort members that are borrowing, just enough to place the job; each preempted job goes back to
its queue with its priority and submission order (``evictions`` names them, so the launcher stops
their runs and keeps their output, where the checkpoints are).

Bookings and waiting jobs are records in the state store (``booking``, ``waiting``), so they
survive a restart and every launcher process sees the same ones. A decision runs on the
process's own view (one thread at a time) and commits its writes in one conditional transaction over the version of the
last decision (``scheduler:version``): one round trip when nobody else decided since; otherwise
nothing is written, the view is rebuilt from the records and the decision taken again.
"""

from __future__ import annotations

import bisect
import copy
import heapq
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from cascade.core.errors import RetryableError
from cascade.scheduling import frameworks
from cascade.scheduling.accelerators import parse
from cascade.scheduling.matcher import Matcher
from cascade.scheduling.placement import Inventory, Job, NoFit, Placement
from cascade.stores import StateStore
from cascade.stores.base import RecordWrite

VERSION = "scheduler:version"  # a random id per decision: each commits only over the version it started from
T = TypeVar("T")


def job_doc(job: Job) -> dict[str, Any]:
    return {"id": job.id, "request": job.request.raw, "workers": job.workers, "framework": job.framework,
            "project": job.project, "queue": job.queue, "min_memory_gib": job.min_memory_gib, "cpu": job.cpu,
            "memory_gib": job.memory_gib, "rdma": job.rdma}


def job_from(doc: Mapping[str, Any]) -> Job:
    return Job(str(doc["id"]), parse(str(doc["request"])), int(doc["workers"]), str(doc["framework"]),
               str(doc["project"]), str(doc["queue"]), float(doc.get("min_memory_gib", 0)), float(doc.get("cpu", 0)),
               float(doc.get("memory_gib", 0)), bool(doc.get("rdma", False)))


def shape(job: Job) -> tuple[Any, ...]:
    """What decides whether a job fits: two waiting jobs of one shape fit, or not, alike."""
    return (job.request.raw, job.workers, job.framework, job.project, job.queue, job.min_memory_gib, job.cpu,
            job.memory_gib, job.rdma)


@dataclass(frozen=True)
class Waiting:
    """A job in its queue: why it waits (per flavor) and what its launcher needs to start it later."""

    job: Job
    priority: int
    seq: int
    reasons: dict[str, str]
    since: float
    payload: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Admitted:
    """A waiting job that now has its booking."""

    placement: Placement
    waited: Waiting


class Ledger:
    def __init__(self, store: StateStore, inventory: Inventory, *, naive: bool = False, lease_seconds: float = 15.0,
                 clock: Callable[[], float] = time.time) -> None:
        self.store, self.naive, self.clock = store, naive, clock
        self.lease = lease_seconds  # how long a decision may keep retrying against other launchers
        self.pristine = copy.deepcopy(inventory)
        self.capacity = Matcher(copy.deepcopy(inventory), naive=naive)  # never booked: what could ever fit
        self.matcher = Matcher(copy.deepcopy(inventory), naive=naive)
        self.booked: dict[str, Placement] = {}
        self.tickets: dict[str, Waiting] = {}  # per booking: its priority, submission order and payload
        self.waiting: dict[str, Waiting] = {}
        self.shapes: dict[tuple[Any, ...], list[tuple[int, int, str]]] = {}  # shape -> (-priority, seq, job id), sorted
        self.evicted: list[str] = []
        self._version: bytes | None = None  # the version this process's view matches (None: no decision yet)
        self._fresh = False  # whether the view was built (a failed commit or decision makes it stale)
        self._pending: dict[tuple[str, str], dict[str, Any] | None] = {}  # this decision's writes (None: delete)
        self._mutex = threading.RLock()
        self._last_seq = 0
        self._touched = False  # whether self.matcher has been booked on since it was copied
        self._full_pass = True  # whether the next admission pass must try every flavor (see _admit)
        self._never: dict[tuple[Any, ...], dict[str, str] | None] = {}  # shape -> why it never fits (None: it can)

    # -- decisions and the shared view ----------------------------------------------------------------
    def _decide(self, body: Callable[[], T]) -> T:
        """Run one decision on this process's view and commit what it wrote in one conditional transaction
        against the version of the last decision (``VERSION``): uncontended, that is the decision's only round
        trip. If another process decided since, nothing is written: the view is rebuilt from the records and the
        decision taken again. A decision that writes nothing checks the version before answering."""
        with self._mutex:  # threads of one process share the view: one decision at a time on it
            return self._decide_alone(body)

    def _decide_alone(self, body: Callable[[], T]) -> T:
        deadline = time.monotonic() + 2 * self.lease
        while True:
            if not self._fresh:
                self._rebuild()
            self._pending, evicted = {}, len(self.evicted)
            version: bytes | None
            try:
                result = body()
                if self._pending:
                    new = os.urandom(12).hex().encode()
                    puts = [RecordWrite(kind, id, doc) for (kind, id), doc in self._pending.items()
                            if doc is not None]
                    deletes = [key for key, doc in self._pending.items() if doc is None]
                    done, version = self.store.commit_records(VERSION, self._version, new, puts, deletes), new
                else:
                    done, version = self.store.get(VERSION) == self._version, self._version
            except NoFit:
                del self.evicted[evicted:]
                raise  # refused before anything changed: the view stands
            except BaseException:
                self._fresh = False  # the view may hold half a decision: rebuild it next time
                del self.evicted[evicted:]
                raise
            finally:
                self._pending = {}
            if done:
                self._version = version
                return result
            self._fresh = False
            del self.evicted[evicted:]
            if time.monotonic() > deadline:
                raise RetryableError("other launchers keep deciding before this one can; try again")

    def _rebuild(self) -> None:
        """This process's view from the shared records (another process decided since this one last did). The
        version is read first: records newer than it only make the next commit fail and rebuild again."""
        self._version = self.store.get(VERSION)
        if self._touched:  # the first rebuild starts from the untouched copy made at start
            self.matcher = Matcher(copy.deepcopy(self.pristine), naive=self.naive)
        self._touched = True
        self.booked, self.tickets, self.waiting, self.shapes = {}, {}, {}, {}
        self._full_pass = True
        for rec in self.store.find_records("booking"):
            placement = self._placement(rec)
            if placement is not None:
                self.matcher.allocate(placement)
                self.booked[placement.job.id] = placement
                self.tickets[placement.job.id] = Waiting(placement.job, int(rec.get("priority", 0)),
                                                         int(rec.get("seq", 0)), {}, float(rec.get("booked", 0)),
                                                         dict(rec.get("payload") or {}))
        for rec in self.store.find_records("waiting"):
            self._queue(Waiting(job_from(rec["job"]), int(rec["priority"]), int(rec["seq"]), dict(rec["reasons"]),
                                float(rec["since"]), dict(rec["payload"])))
        self._fresh = True  # only once it is whole: a store failure half-way leaves it to be rebuilt

    def _placement(self, rec: Mapping[str, Any]) -> Placement | None:
        flavor = self.matcher.inventory.flavors.get(str(rec["flavor"]))
        if flavor is None:  # the inventory lost the flavor: nothing to give back
            return None
        nodes = {n.name: n for n in flavor.nodes}
        slots = [(nodes[n], list(cards), float(amount)) for n, cards, amount in rec["slots"] if n in nodes]
        job = job_from(rec["job"])
        return Placement(job, flavor, slots, frameworks.image(job.framework, flavor.vendor), dict(rec.get("skipped", {})))

    # -- writes ----------------------------------------------------------------------------------------
    def _take(self, placement: Placement, ticket: Waiting) -> None:
        """Book ``placement``; ``ticket`` keeps what a preemption needs to requeue it (priority, order, payload)."""
        self.matcher.allocate(placement)
        self.booked[placement.job.id] = placement
        self.tickets[placement.job.id] = ticket
        self._pending["booking", placement.job.id] = {
            "id": placement.job.id, "project": placement.job.project, "job": job_doc(placement.job),
            "flavor": placement.flavor.name, "skipped": placement.skipped, "booked": self.clock(),
            "priority": ticket.priority, "seq": ticket.seq, "payload": ticket.payload,
            "slots": [[n.name, cards, amount] for n, cards, amount in placement.slots]}

    def _free(self, job_id: str) -> Placement | None:
        placement = self.booked.pop(job_id, None)
        self.tickets.pop(job_id, None)
        if placement is not None:
            self.matcher.release(placement)
            self._pending["booking", job_id] = None
        return placement

    def _queue(self, waiting: Waiting) -> None:
        """Into the in-memory queue: per shape, its jobs in admission order, so a pass tries each shape's head
        and never sorts or walks the whole queue."""
        self.waiting[waiting.job.id] = waiting
        bisect.insort(self.shapes.setdefault(shape(waiting.job), []), (-waiting.priority, waiting.seq, waiting.job.id))

    def _dequeue(self, job_id: str) -> Waiting | None:
        waiting = self.waiting.pop(job_id, None)
        if waiting is not None:
            kind, key = shape(waiting.job), (-waiting.priority, waiting.seq, job_id)
            line = self.shapes[kind]
            i = bisect.bisect_left(line, key)
            if i < len(line) and line[i] == key:
                del line[i]
            if not line:
                del self.shapes[kind]
        return waiting

    def _wait(self, waiting: Waiting) -> None:
        self._queue(waiting)
        self._pending["waiting", waiting.job.id] = {
            "id": waiting.job.id, "project": waiting.job.project, "job": job_doc(waiting.job),
            "priority": waiting.priority, "seq": waiting.seq, "reasons": waiting.reasons, "since": waiting.since,
            "payload": waiting.payload}

    def _unwait(self, job_id: str) -> None:
        if self._dequeue(job_id) is not None:
            self._pending["waiting", job_id] = None

    def _seq(self) -> int:
        """Submission order: microseconds, strictly increasing within this process (decisions are serialised by
        the lease, so across processes too, as far as their clocks agree)."""
        self._last_seq = max(self._last_seq + 1, time.time_ns() // 1000)
        return self._last_seq

    def _may_reclaim(self, job: Job) -> bool:
        """Whether the job's project is in a cohort and the job stays within the project's own quota."""
        inv = self.matcher.inventory
        if not inv.cohorts:
            return False
        vendor = self.matcher.vendor_of(job)
        quota = inv.quotas.get(job.project, {}).get(vendor)
        need = job.workers * (job.request.count if job.request.share else job.request.cards)
        return bool(inv.cohort(job.project)[0]) and quota is not None and \
            inv.used.get((job.project, vendor), 0.0) + need <= quota + 1e-9

    def _reclaim(self, job: Job) -> Placement | None:
        """Place ``job`` by preempting work its cohort borrowed, if the job stays within its project's own quota.

        Victims are other projects' bookings while their project uses more than its nominal quota, newest
        first; each goes back to its queue (same priority and order) and is named in ``evictions``."""
        if not self._may_reclaim(job):
            return None
        inv = self.matcher.inventory
        vendor = self.matcher.vendor_of(job)
        cohort, members = inv.cohort(job.project)
        candidates = sorted((p for p in self.booked.values() if p.job.project in members and p.job.project != job.project
                             and p.flavor.vendor == vendor), key=lambda p: -self.tickets[p.job.id].seq)
        taken: list[Placement] = []
        placement = None
        for victim in candidates:
            if inv.borrowing(victim.job.project, vendor) <= 1e-9:
                continue  # that project is back within its own quota: what it runs is its own
            self.matcher.release(victim)
            taken.append(victim)
            try:
                placement = self.matcher.place(job)
                break
            except NoFit:
                continue
        if placement is None:
            for victim in taken:  # not enough to reclaim: nobody is preempted
                self.matcher.allocate(victim)
            return None
        why = {"preempted": f"project {job.project} reclaimed its quota in cohort {cohort} (job {job.id})"}
        for victim in taken:
            ticket = self.tickets.pop(victim.job.id)
            self.booked.pop(victim.job.id)
            self._pending["booking", victim.job.id] = None
            self._wait(Waiting(victim.job, ticket.priority, ticket.seq, why, self.clock(), ticket.payload))
            self.evicted.append(victim.job.id)
        return placement

    # -- the API ---------------------------------------------------------------------------------------
    def book(self, job: Job, *, priority: int = 0, payload: Mapping[str, Any] | None = None) -> Placement | Waiting:
        """The job's booking (placed now, perhaps by preempting borrowed work: see ``evictions``), or its place in
        the queue; NoFit if it could never fit."""
        def decide() -> Placement | Waiting:
            if job.id in self.booked:
                return self.booked[job.id]  # a redelivered submission
            if job.id in self.waiting:
                return self.waiting[job.id]
            ticket = Waiting(job, priority, self._seq(), {}, self.clock(), dict(payload or {}))
            try:
                placement = self.matcher.place(job)
            except NoFit as now:
                self._ever_fits(job)  # NoFit here: not even the empty inventory takes it
                reclaimed = self._reclaim(job)
                if reclaimed is None:
                    waiting = Waiting(job, priority, ticket.seq, now.reasons, ticket.since, ticket.payload)
                    self._wait(waiting)
                    return waiting
                placement = reclaimed
            self._take(placement, ticket)
            return placement
        return self._decide(decide)

    def _ever_fits(self, job: Job) -> None:
        """NoFit if not even the empty inventory takes the job (remembered per shape: the answer never changes)."""
        kind = shape(job)
        if kind not in self._never:
            try:
                self.capacity.place(job)
                self._never[kind] = None
            except NoFit as exc:
                self._never[kind] = exc.reasons
        reasons = self._never[kind]
        if reasons is not None:
            raise NoFit(job, reasons)

    def evictions(self) -> list[str]:
        """The jobs preempted since the last call (back in their queues): their runs must be stopped."""
        with self._mutex:  # a decision in another thread may be adding to it
            out, self.evicted = self.evicted, []
        return out

    def release(self, job_id: str, wanted: Callable[[Waiting], bool] = lambda w: True) -> list[Admitted]:
        """Give ``job_id``'s booking back (or drop it from its queue), then admit what now fits.

        ``wanted`` says whether a waiting job still wants to run (False drops it: cancelled while it waited)."""
        def decide() -> list[Admitted]:
            freed = self._free(job_id)
            self._unwait(job_id)
            return self._admit(wanted, freed) if freed is not None else []
        return self._decide(decide)

    def requeue(self, job_id: str, why: str) -> None:
        """Give a booked job's booking back and put it at its old place in its queue (its launch failed for a
        reason that passes: the next admission pass tries it again)."""
        def decide() -> None:
            ticket = self.tickets.get(job_id)
            placement = self._free(job_id)
            self._full_pass = True  # room came back and no admission pass follows
            if placement is not None and ticket is not None:
                self._wait(Waiting(placement.job, ticket.priority, ticket.seq, {"launch": why}, ticket.since,
                                   ticket.payload))
        self._decide(decide)

    def admit(self, wanted: Callable[[Waiting], bool] = lambda w: True) -> list[Admitted]:
        """Admit the waiting jobs that fit now (after an inventory change, or on a periodic pass)."""
        return self._decide(lambda: self._admit(wanted))

    def _admit(self, wanted: Callable[[Waiting], bool], freed: Placement | None = None) -> list[Admitted]:
        """Admission order over the heads of each shape's line: the first head that fits is admitted and its line's
        next job takes its place; a head that does not fit blocks its shape for this pass (the same shape would not
        fit either). After a release only shapes that could use the freed cards are tried. ``wanted`` is asked
        only of a job about to be admitted."""
        admitted: list[Admitted] = []
        heads = [(line[0], kind) for kind, line in self.shapes.items()
                 if freed is None or self._could_use(self.waiting[line[0][2]].job, freed)]
        heapq.heapify(heads)
        # Every head was tried after the last change but this release, so only the freed flavor can take one now;
        # quotas (freed for every flavor) and a change that no pass followed (a requeue, a rebuild) need them all.
        only = None if freed is None or self._full_pass or self.matcher.quoted else freed.flavor
        self._full_pass = False
        while heads:
            (_, _, job_id), kind = heapq.heappop(heads)
            waiting = self.waiting[job_id]
            placement = self.matcher.fits(waiting.job, only)
            if placement is None and not self._may_reclaim(waiting.job):
                continue  # its shape is blocked for this pass
            if not wanted(waiting):
                self._unwait(job_id)  # cancelled while it waited: nobody is preempted for it
            else:
                placement = placement or self._reclaim(waiting.job)
                if placement is None:
                    continue
                self._unwait(job_id)
                self._take(placement, waiting)
                admitted.append(Admitted(placement, waiting))
            if kind in self.shapes:
                heapq.heappush(heads, (self.shapes[kind][0], kind))
        return admitted

    def _could_use(self, job: Job, freed: Placement) -> bool:
        """Whether a job (of its shape) could use what ``freed`` gave back (same vendor; or CPU work, which any node
        may take; or any job of a cohort, whose quota the release may have freed)."""
        vendor = self.matcher.vendor_of(job)
        return vendor == freed.flavor.vendor or vendor == "cpu" or bool(self.matcher.inventory.cohorts)

    def usage(self) -> dict[str, Any]:
        """Booked cards per flavor and per project and vendor, and the queue in admission order."""
        def read() -> dict[str, Any]:
            flavors = {name: {"cards": f.cards, "booked": round(sum(1 - x for n in f.nodes for x in n.free), 3)}
                       for name, f in self.matcher.inventory.flavors.items()}
            return {"flavors": flavors,
                    "projects": {f"{p}/{v}": round(used, 3) for (p, v), used in self.matcher.inventory.used.items()},
                    "waiting": [{"jobId": w.job.id, "project": w.job.project, "priority": w.priority,
                                 "reasons": w.reasons} for w in sorted(self.waiting.values(),
                                                                       key=lambda w: (-w.priority, w.seq))]}
        return self._decide(read)
