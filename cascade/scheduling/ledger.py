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

Bookings and waiting jobs live in the state store, so they survive a restart and every launcher
process sees the same ones: a snapshot record and a journal of numbered entries after it, one per
commit (what the commit's decisions wrote), folded into a new snapshot once the journal holds
four times as many writes as the snapshot has records. A decision runs on the process's own view
in memory (one thread at a time), as Kueue's scheduler assumes a workload in its cache; its
writes join the open group, and one conditional transaction over the version of the last commit
(``scheduler:version``) makes a whole group durable: decisions taken while a commit is under way
share the next one (group commit), and a caller acts on an answer only once it is durable. If
another process committed since, nothing is written, the group's decisions are void, the view is
rebuilt from the store and each is taken again.
"""

from __future__ import annotations

import bisect
import copy
import heapq
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, TypeVar

from cascade.core.errors import RetryableError
from cascade.scheduling import frameworks
from cascade.scheduling.accelerators import parse
from cascade.scheduling.matcher import Matcher
from cascade.scheduling.placement import Inventory, Job, NoFit, Placement
from cascade.stores import StateStore
from cascade.stores.base import RecordWrite

VERSION = "scheduler:version"  # a random id per commit: each commits only over the version it started from
SNAPSHOT = "ledger-snapshot"  # every booking and waiting job as of journal entry "upto", in numbered chunks
CHUNK = 256  # records per snapshot chunk (SQLite slows every later write after one row of megabytes)
ENTRY = "ledger-entry"  # one per commit after the snapshot: the group's writes, numbered
COMPACT = 512  # fold the journal into a new snapshot once it holds this many writes
FOLD = 4  # ... and this many times as many as the snapshot has records (a snapshot costs about one write per record)
T = TypeVar("T")


_JOB_DEFAULTS = {f.name: f.default for f in fields(Job) if f.default is not MISSING}  # left out of job records


def job_doc(job: Job) -> dict[str, Any]:
    """A job as its records keep it: the fields that differ from a Job's defaults (every decision writes one)."""
    doc: dict[str, Any] = {"id": job.id, "request": job.request.raw}
    for name, default in _JOB_DEFAULTS.items():
        value = getattr(job, name)
        if value != default:
            doc[name] = value
    return doc


def job_from(doc: Mapping[str, Any]) -> Job:
    d = {**_JOB_DEFAULTS, **doc}
    return Job(str(d["id"]), parse(str(d["request"])), int(d["workers"]), str(d["framework"]), str(d["project"]),
               str(d["queue"]), float(d["min_memory_gib"]), float(d["cpu"]), float(d["memory_gib"]), bool(d["rdma"]))


@dataclass(slots=True)
class Waiting:
    """A job in its queue: why it waits (per flavor) and what its launcher needs to start it later."""

    job: Job
    priority: int
    seq: int
    reasons: dict[str, str]
    since: float
    payload: dict[str, Any] = field(default_factory=dict)


@dataclass(eq=False)
class _Group:
    """Decisions that one commit makes durable: their writes (the last one per record wins) and preemptions."""

    writes: dict[tuple[str, str], dict[str, Any] | None] = field(default_factory=dict)
    evicted: list[str] = field(default_factory=list)
    state: str = "open"  # open -> committing -> durable | void
    error: BaseException | None = None  # why it is void, when the store failed (None: another launcher won)
    unwaited: bool = False  # whether it holds decisions taken with wait=False (their loss is for sync to report)


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
        self._version: bytes | None = None  # the version of the last commit in this view (None: no decision yet)
        self._fresh = False  # whether the view was built (a failed commit or decision makes it stale)
        self._pending: dict[tuple[str, str], dict[str, Any] | None] = {}  # this decision's writes (None: delete)
        self._evicting: list[str] = []  # the jobs this decision preempts
        self._lock = threading.Lock()  # one decision at a time on the view
        self._cond = threading.Condition(self._lock)  # threads wait on it for a commit under way
        self._open = _Group()  # the decisions no commit has taken yet
        self._committing: _Group | None = None  # the group whose commit is under way
        self._lost: BaseException | bool | None = None  # a decision since the last sync was lost (see sync)
        self._docs: dict[tuple[str, str], dict[str, Any]] = {}  # every record of the view (what a snapshot holds)
        self._entry = 0  # the number of the last journal entry (or snapshot) in the view
        self._journal: list[str] = []  # the entries since the snapshot: the next snapshot deletes them
        self._journaled = 0  # the writes they hold
        self._legacy: list[tuple[str, str]] = []  # per-record rows of earlier releases, folded into the next snapshot
        self._chunks = 0  # the snapshot's chunks in the store
        self._last_seq = 0
        self._touched = False  # whether self.matcher has been booked on since it was copied
        self._full_pass = True  # whether the next admission pass must try every flavor (see _admit)
        self._never: dict[tuple[Any, ...], dict[str, str] | None] = {}  # shape -> why it never fits (None: it can)
        self._vendors: dict[tuple[Any, ...], str] = {}  # shape -> the vendor its jobs want

    # -- decisions, group commit and the shared view ---------------------------------------------------
    def _decide(self, body: Callable[[], T], *, wait: bool = True) -> T:
        """Run one decision on this process's view; its writes join the open group, which one commit makes durable.

        The decision is taken in memory at once; with ``wait`` the call returns when its group is durable. Threads
        that decide while a commit is under way fill the next group, so under load one round trip covers many
        decisions (group commit). A commit is conditional on the version of the last one (``VERSION``): if another
        process decided since, nothing is written, every decision of the group (and of the one filling behind it) is
        void, the view is rebuilt from the records and each waiting caller decides again. A decision that writes
        nothing waits for the writes before it and checks the version before answering. Without ``wait`` the
        caller must call ``sync`` before acting on the answer (the benchmark and batching callers do)."""
        deadline: float | None = None
        while True:
            with self._lock:  # threads of one process share the view: one decision at a time on it
                if not self._fresh:
                    self._rebuild()
                pending: dict[tuple[str, str], dict[str, Any] | None] = {}
                self._pending = pending
                self._evicting.clear()
                try:
                    result = body()
                except NoFit:
                    raise  # refused before anything changed: the view stands
                except BaseException:
                    self._void(None)  # the view may hold half a decision: what it holds unwritten is lost
                    raise
                group: _Group | None
                if pending:
                    group = self._open
                    group.writes.update(pending)
                    if self._evicting:
                        group.evicted += self._evicting
                    for key, doc in pending.items():
                        if doc is None:
                            self._docs.pop(key, None)
                        else:
                            self._docs[key] = doc
                    if not wait:
                        group.unwaited = True
                        return result
                else:
                    group = self._open if self._open.writes else self._committing
                    if group is None:  # nothing in the view that is not in the store: is it still the store's view?
                        if self.store.get(VERSION) == self._version:
                            return result
                        self._fresh = False
                if group is not None:
                    self._settle(group)
                    if group.state == "durable" and pending:
                        return result
                    if group.state == "void" and group.error is not None:
                        raise group.error
            deadline = deadline or time.monotonic() + 2 * self.lease
            if time.monotonic() > deadline:  # void (another launcher decided first), or a read that waited
                raise RetryableError("other launchers keep deciding before this one can; try again")

    def sync(self) -> None:
        """Wait until every decision taken so far is durable (what ``wait=False`` leaves to its caller).

        RetryableError if a decision since the last ``sync`` was lost because another launcher decided first: the
        view has been rebuilt from the store and the caller must decide again."""
        with self._lock:
            group = self._open if self._open.writes else self._committing
            if group is not None:
                self._settle(group)
            lost, self._lost = self._lost, None
            if lost is not None:
                raise lost if isinstance(lost, BaseException) else RetryableError(
                    "another launcher decided first: decisions since the last sync were lost; decide again")

    def _settle(self, group: _Group) -> None:
        """Until ``group`` is durable or void: commit it when it is the open group and no commit is under way (its
        caller leads the commit for every decision in it), else wait for the commit under way."""
        while group.state in ("open", "committing"):
            if group.state == "open" and self._committing is None:
                self._commit()
            else:
                self._cond.wait()

    def _commit(self) -> None:
        """Commit the open group (the lock is held, and let go during the round trip so that other threads can fill
        the next group). Once the journal is big enough (``COMPACT``, ``FOLD``), or rows of the per-record format
        are left, a snapshot of the view is written instead of an entry, and the entries are deleted."""
        group, self._open = self._open, _Group()
        group.state, self._committing = "committing", group
        base, new = self._version, os.urandom(12).hex().encode()
        self._version, self._entry = new, self._entry + 1
        entry = f"{self._entry:012d}"
        compact = bool(self._legacy) or self._journaled + len(group.writes) > max(COMPACT, FOLD * len(self._docs))
        if compact:  # the snapshot holds this group's writes too: its entry is not written
            records = [[k, i, d] for (k, i), d in self._docs.items()]
            chunks = [records[at:at + CHUNK] for at in range(0, len(records), CHUNK)]
            puts = [RecordWrite(SNAPSHOT, f"{n:06d}", {"id": f"{n:06d}", "upto": self._entry, "records": chunk})
                    for n, chunk in enumerate(chunks)]
            deletes = [(ENTRY, e) for e in self._journal] + self._legacy + \
                [(SNAPSHOT, f"{n:06d}") for n in range(len(chunks), self._chunks)]
        else:
            puts = [RecordWrite(ENTRY, entry, {"id": entry, "writes": [[k, i, d] for (k, i), d in group.writes.items()]})]
            deletes = []
        error: BaseException | None = None
        self._cond.release()
        try:
            done = self.store.commit_records(VERSION, base, new, puts, deletes)
        except BaseException as exc:  # the store is down: the group is lost, its callers get the error
            done, error = False, exc
        finally:
            self._cond.acquire()
        self._committing = None
        if done:
            group.state = "durable"
            self.evicted += group.evicted
            if compact:
                self._journal, self._journaled, self._legacy, self._chunks = [], 0, [], len(puts)
            else:
                self._journal.append(entry)
                self._journaled += len(group.writes)
        else:
            self._void(error, group)
        self._cond.notify_all()

    def _void(self, error: BaseException | None, *lost: _Group) -> None:
        """Every decision not yet durable is lost (a commit failed, or a decision broke half-way): ``lost`` and the
        open group are void and the view is rebuilt from the store at the next decision."""
        for group in (*lost, self._open):
            group.state, group.error = "void", error
            if group.unwaited:
                self._lost = error or True
        self._open = _Group()
        self._fresh = False

    def _rebuild(self) -> None:
        """This process's view from the shared records: the snapshot, then the journal entries after it (and rows of
        the per-record format of earlier releases, which the next commit folds into a snapshot). The version is read
        first: records newer than it only make the next commit fail and rebuild again."""
        self._version = self.store.get(VERSION)
        if self._touched:  # the first rebuild starts from the untouched copy made at start
            self.matcher = Matcher(copy.deepcopy(self.pristine), naive=self.naive)
        self._touched = True
        self.booked, self.tickets, self.waiting, self.shapes = {}, {}, {}, {}
        self._full_pass = True
        docs: dict[tuple[str, str], dict[str, Any]] = {}
        self._journal, self._journaled, self._legacy = [], 0, []
        for kind in ("booking", "waiting"):
            for rec in self.store.find_records(kind):
                docs[kind, str(rec["id"])] = rec
                self._legacy.append((kind, str(rec["id"])))
        chunks = self.store.find_records(SNAPSHOT)  # all written by one commit
        upto, self._chunks = max((int(c["upto"]) for c in chunks), default=0), len(chunks)
        for chunk in chunks:
            for kind, id, doc in chunk["records"]:
                docs[kind, id] = doc
        self._entry = upto
        for entry in sorted(self.store.find_records(ENTRY), key=lambda e: int(e["id"])):
            self._journal.append(str(entry["id"]))  # one folded into the snapshot already is deleted with the next
            if int(entry["id"]) <= upto:
                continue
            for kind, id, doc in entry["writes"]:
                if doc is None:
                    docs.pop((kind, id), None)
                else:
                    docs[kind, id] = doc
            self._journaled += len(entry["writes"])
            self._entry = int(entry["id"])
        self._docs = docs
        for (kind, _), rec in docs.items():
            if kind == "booking":
                placement = self._placement(rec)
                if placement is not None:
                    self.matcher.allocate(placement)
                    self.booked[placement.job.id] = placement
                    self.tickets[placement.job.id] = Waiting(placement.job, int(rec.get("priority", 0)),
                                                             int(rec.get("seq", 0)), {}, float(rec.get("booked", 0)),
                                                             dict(rec.get("payload") or {}))
            else:
                self._queue(Waiting(job_from(rec["job"]), int(rec["priority"]), int(rec["seq"]),
                                    dict(rec["reasons"]), float(rec["since"]), dict(rec["payload"])))
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
            "id": placement.job.id, "job": job_doc(placement.job), "flavor": placement.flavor.name,
            "skipped": placement.skipped, "booked": self.clock(), "priority": ticket.priority, "seq": ticket.seq,
            "payload": ticket.payload, "slots": [[n.name, cards, amount] for n, cards, amount in placement.slots]}

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
        kind = waiting.job.shape
        if kind not in self._vendors:
            self._vendors[kind] = self.matcher.vendor_of(waiting.job)
        bisect.insort(self.shapes.setdefault(kind, []), (-waiting.priority, waiting.seq, waiting.job.id))

    def _dequeue(self, job_id: str) -> Waiting | None:
        waiting = self.waiting.pop(job_id, None)
        if waiting is not None:
            kind, key = waiting.job.shape, (-waiting.priority, waiting.seq, job_id)
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
            "id": waiting.job.id, "job": job_doc(waiting.job),
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
        return bool(inv.cohort(job.project)[0]) and quota is not None and \
            inv.used.get((job.project, vendor), 0.0) + job.cards_needed <= quota + 1e-9

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
            self._evicting.append(victim.job.id)
        return placement

    # -- the API ---------------------------------------------------------------------------------------
    def book(self, job: Job, *, priority: int = 0, payload: Mapping[str, Any] | None = None,
             wait: bool = True) -> Placement | Waiting:
        """The job's booking (placed now, perhaps by preempting borrowed work: see ``evictions``), or its place in
        the queue; NoFit if it could never fit. ``wait=False``: not yet durable, see ``sync``."""
        def decide() -> Placement | Waiting:
            if job.id in self.booked:
                return self.booked[job.id]  # a redelivered submission
            if job.id in self.waiting:
                return self.waiting[job.id]
            ticket = Waiting(job, priority, self._seq(), {}, self.clock(), dict(payload or {}))
            placement = self.matcher.attempt(job)
            if isinstance(placement, dict):  # no room now: why, per flavor
                self._ever_fits(job)  # NoFit here: not even the empty inventory takes it
                reclaimed = self._reclaim(job)
                if reclaimed is None:
                    waiting = Waiting(job, priority, ticket.seq, placement, ticket.since, ticket.payload)
                    self._wait(waiting)
                    return waiting
                placement = reclaimed
            self._take(placement, ticket)
            return placement
        return self._decide(decide, wait=wait)

    def _ever_fits(self, job: Job) -> None:
        """NoFit if not even the empty inventory takes the job (remembered per shape: the answer never changes)."""
        kind = job.shape
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
        with self._lock:  # a commit in another thread may be adding to it
            out, self.evicted = self.evicted, []
        return out

    def release(self, job_id: str, wanted: Callable[[Waiting], bool] = lambda w: True, *,
                wait: bool = True) -> list[Admitted]:
        """Give ``job_id``'s booking back (or drop it from its queue), then admit what now fits.

        ``wanted`` says whether a waiting job still wants to run (False drops it: cancelled while it waited).
        ``wait=False``: not yet durable, see ``sync``."""
        def decide() -> list[Admitted]:
            freed = self._free(job_id)
            self._unwait(job_id)
            return self._admit(wanted, freed) if freed is not None else []
        return self._decide(decide, wait=wait)

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
        if freed is None or self.matcher.inventory.cohorts:  # a cohort's jobs may use quota the release freed
            heads = [(line[0], kind) for kind, line in self.shapes.items()]
        else:  # the freed cards' vendor, or CPU work, which any node may take
            vendors = (freed.flavor.vendor, "cpu")
            heads = [(line[0], kind) for kind, line in self.shapes.items() if self._vendors[kind] in vendors]
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
