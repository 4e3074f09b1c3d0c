"""The accelerator matcher: the first flavor with room wins, best-fit inside it.

``place`` finds a placement without taking anything; ``allocate``/``release`` book and
free cards and quota. ``naive=True`` gives the baseline the benchmark compares against:
first-fit over nodes, and fractional requests take a whole card.
"""

from __future__ import annotations

import bisect
from dataclasses import replace
from typing import NamedTuple

from cascade.scheduling import frameworks
from cascade.scheduling.placement import Flavor, Inventory, Job, Node, NoFit, Placement

EPS = 1e-9


class Option(NamedTuple):
    """One flavor of a queue as a kind of job sees it (``Matcher._plan``)."""

    flavor: Flavor
    free: FreeIndex | None  # its free index (None: its nodes are scanned)
    fixed: str | None  # why a job of this kind can never use it; None: it could
    image: str  # the image such a job runs there ("" where it cannot)


class FreeIndex:
    """One flavor's nodes by idle-card count and its cards by free share, kept current by allocate and
    release, so one worker's best fit (and a failure) is a lookup instead of a scan of every node. Only
    for flavors that do not book cores and host memory (those are scanned)."""

    def __init__(self, nodes: list[Node]) -> None:
        most = max((len(n.free) for n in nodes), default=0)
        self.by_idle: list[dict[str, Node]] = [{} for _ in range(most + 1)]  # idle cards -> nodes
        self.by_share: dict[float, dict[tuple[str, int], Node]] = {}  # free share -> cards (in the order they came)
        self.shares: list[float] = []  # the keys of by_share that hold a card, in order
        self.idle: dict[str, int] = {}  # node -> its idle cards (its place in by_idle)
        for n in nodes:
            self.idle[n.name] = n.idle_cards
            self.by_idle[n.idle_cards][n.name] = n
            for i, f in enumerate(n.free):
                if f > EPS:
                    self._add(f, (n.name, i), n)

    def _add(self, free: float, card: tuple[str, int], node: Node) -> None:
        key = round(free, 6)
        cards = self.by_share.get(key)
        if cards is None:
            cards = self.by_share[key] = {}
        if not cards:
            bisect.insort(self.shares, key)
        cards[card] = node

    def _remove(self, free: float, card: tuple[str, int]) -> None:
        key = round(free, 6)
        cards = self.by_share[key]
        if cards.pop(card, None) is not None and not cards:
            del self.shares[bisect.bisect_left(self.shares, key)]

    def shift(self, n: Node, cards: list[int], amount: float) -> None:
        """Add ``amount`` to the free share of ``cards`` on ``n`` (negative: booked; at most a whole card free):
        only those cards move in the index."""
        name, free = n.name, n.free
        was = idle = self.idle[name]
        if amount == -1.0 and all(free[i] == 1.0 for i in cards):  # whole idle cards booked: most moves are these
            whole = self.by_share[1.0]
            for i in cards:
                del whole[name, i]
                free[i] = 0.0
            if not whole:
                self.shares.pop()  # 1.0 is the largest share
            idle -= len(cards)
            cards = []
        elif amount == 1.0 and all(free[i] == 0.0 for i in cards):  # ... and given back
            whole = self.by_share.setdefault(1.0, {})
            if not whole:
                self.shares.append(1.0)
            for i in cards:
                whole[name, i] = n
                free[i] = 1.0
            idle += len(cards)
            cards = []
        for i in cards:
            f = free[i]
            if f > EPS:
                self._remove(f, (name, i))
            if f >= 1 - EPS:
                idle -= 1
            free[i] = f = min(1.0, f + amount)
            if f > EPS:
                self._add(f, (name, i), n)
            if f >= 1 - EPS:
                idle += 1
        if idle != was:
            del self.by_idle[was][name]
            self.by_idle[idle][name] = n
            self.idle[name] = idle

    def whole(self, want: int) -> Node | None:
        """The node with the fewest idle cards that still has ``want``."""
        by_idle = self.by_idle
        for k in range(want, len(by_idle)):
            if by_idle[k]:
                return next(iter(by_idle[k].values()))
        return None

    def share(self, need: float) -> tuple[Node, int] | None:
        """The fullest card that still has ``need`` free."""
        at = bisect.bisect_left(self.shares, need - EPS)
        if at == len(self.shares):
            return None
        (_, index), node = next(iter(self.by_share[self.shares[at]].items()))
        return node, index

    def fill(self, want: int, workers: int) -> list[tuple[Node, list[int], float]] | None:
        """Best fit for several workers of ``want`` whole cards each: each worker goes to the node with the fewest
        idle cards that still has ``want``, which fills one node before it opens the next."""
        if self.slots(want) < workers:
            return None  # not even with every node's idle cards
        slots: list[tuple[Node, list[int], float]] = []
        for nodes in self.by_idle[want:]:
            for node in nodes.values():
                idle = [i for i, f in enumerate(node.free) if f >= 1 - EPS]
                while len(idle) >= want and len(slots) < workers:
                    slots.append((node, idle[:want], 1.0))
                    idle = idle[want:]
                if len(slots) == workers:
                    return slots
        return None

    def slots(self, want: int) -> int:
        """How many workers of ``want`` whole cards the flavor could take at most."""
        return sum(len(nodes) * (k // want) for k, nodes in enumerate(self.by_idle) if k >= want)

    def largest(self) -> int:
        return next((k for k in range(len(self.by_idle) - 1, 0, -1) if self.by_idle[k]), 0)


class Matcher:
    def __init__(self, inventory: Inventory, *, default_vendor: str = "nvidia", naive: bool = False) -> None:
        self.inventory, self.default_vendor, self.naive = inventory, default_vendor, naive
        # Whether any project has a quota (overall or per cluster): only then does a placement depend on them.
        self.quoted = bool(inventory.quotas or inventory.cluster_quotas)
        self._indexes: dict[str, FreeIndex | None] = {}
        self._plans: dict[tuple[object, ...], tuple[list[Option], list[Option]]] = {}  # kind of job -> see _plan
        for flavor in inventory.flavors.values():  # built now, not in the first decision that needs one
            self._index(flavor)

    def _index(self, flavor: Flavor) -> FreeIndex | None:
        if flavor.name not in self._indexes:
            host = any(n.cpu_total or n.memory_total for n in flavor.nodes)
            self._indexes[flavor.name] = None if self.naive or host else FreeIndex(flavor.nodes)
        return self._indexes[flavor.name]

    def vendor_of(self, job: Job) -> str:
        return "cpu" if job.request.none else (job.request.vendor or self.default_vendor)

    def _plan(self, job: Job) -> tuple[list[Option], list[Option]]:
        """The flavors of the job's queue in order, each with its free index, why a job of its kind can never use it
        (None: it could) and the image it would run there; and the ones it could use. Worked out once per kind of job:
        the inventory's flavors do not change, so only quotas and room are left to each decision."""
        plan = self._plans.get(job.kind)
        if plan is None:
            order = []
            for name in self.inventory.queues.get(job.queue, ()):
                flavor = self.inventory.flavors[name]
                fixed = self._fixed_reason(flavor, job)
                image = "" if fixed is not None else frameworks.image(job.framework, flavor.vendor)
                order.append(Option(flavor, self._indexes[name], fixed, image))
            plan = self._plans[job.kind] = (order, [o for o in order if o.fixed is None])
        return plan

    def _reason(self, option: Option, job: Job) -> str | None:
        """Why the job cannot use the flavor whatever its room: its kind, or its project's quota."""
        if option.fixed is not None or not self.quoted:
            return option.fixed
        return self._quota(job, self.vendor_of(job), option.flavor.cluster)

    def _fixed_reason(self, flavor: Flavor, job: Job) -> str | None:
        req, vendor = job.request, self.vendor_of(job)
        if flavor.vendor != vendor:
            return f"wrong vendor: the job wants {vendor}, this flavor is {flavor.vendor}"
        if req.model and flavor.model.upper() != req.model.upper():
            return f"wrong model: the job wants {req.model}, this flavor is {flavor.model or 'unnamed'}"
        if not frameworks.supports(job.framework, vendor):
            return f"framework unsupported: {job.framework} does not run on {vendor}"
        if req.share and flavor.sharing == "none" and not self.naive:
            return "no card sharing on this flavor"
        if job.rdma and not flavor.rdma:
            return "no RDMA: the job asks for an RDMA interface per worker and this flavor has no rdma resource"
        need = max(req.memory_gib or 0.0, job.min_memory_gib)
        have = flavor.memory_gib * (req.count if req.share else 1)
        if need and vendor != "cpu" and need > have + EPS:
            return f"not enough memory: needs {need:g} GiB per card, this flavor gives {have:g} GiB"
        return None

    def _quota(self, job: Job, vendor: str, cluster: str = "") -> str | None:
        """Why the project's quota (with what its cohort lends), or its quota in the flavor's cluster, cannot
        take the job; or None."""
        inv = self.inventory
        need = job.cards_needed
        local = inv.cluster_quotas.get(cluster, {}).get(job.project, {}).get(vendor)
        there = inv.used_in.get((job.project, cluster, vendor), 0.0)
        if cluster and local is not None and there + need > local + EPS:
            return f"quota exhausted on cluster {cluster}: project {job.project} uses {there:g} of {local:g} {vendor} cards there"
        quota = inv.quotas.get(job.project, {}).get(vendor)
        used = inv.used.get((job.project, vendor), 0.0)
        if quota is None or used + need <= quota + EPS:
            return None
        cohort, members = inv.cohort(job.project)
        lenders = [m for m in members if vendor in inv.quotas.get(m, {})]
        pool = sum(inv.quotas[m][vendor] for m in lenders)
        pool_used = sum(inv.used.get((m, vendor), 0.0) for m in lenders)
        if cohort and pool_used + need <= pool + EPS:
            return None  # it borrows what the others of its cohort do not use
        lend = f"; cohort {cohort} has {max(0.0, pool - pool_used):g} unused to lend" if cohort else ""
        return f"quota exhausted: project {job.project} uses {used:g} of {quota:g} {vendor} cards{lend}"

    def _fit(self, flavor: Flavor, index: FreeIndex | None, job: Job) -> list[tuple[Node, list[int], float]] | None:
        """Slots for every worker (cards, cores, host memory), or None; nothing is taken. A flavor with a free index
        answers one worker (or several of whole cards) by a lookup; the others are scanned."""
        req = job.request
        if index is not None and not req.none:
            if job.workers == 1:
                if req.share:
                    hit = index.share(req.count)
                    return None if hit is None else [(hit[0], [hit[1]], req.count)]
                node = index.whole(req.cards)
                return None if node is None else [(node, [i for i, f in enumerate(node.free) if f >= 1 - EPS][:req.cards],
                                                   1.0)]
            if not req.share:
                return index.fill(req.cards, job.workers)
        return self._scan(flavor, job)

    def _scan(self, flavor: Flavor, job: Job) -> list[tuple[Node, list[int], float]] | None:
        """``_fit`` over every node: the nodes an earlier worker of the same job took from are seen through an
        overlay, the rest as they are."""
        req = job.request
        over: dict[int, tuple[list[float], float, float]] = {}
        slots: list[tuple[Node, list[int], float]] = []

        def state(n: Node) -> tuple[list[float], float, float]:
            return over.get(id(n)) or (n.free, n.cpu, n.memory_gib)

        def room(n: Node) -> bool:
            _, cpu, memory = state(n)
            return (not n.cpu_total or cpu + EPS >= job.cpu) and (not n.memory_total or memory + EPS >= job.memory_gib)

        def idle(n: Node) -> list[int]:
            return [i for i, f in enumerate(state(n)[0]) if f >= 1 - EPS]

        for _ in range(job.workers):
            taken: list[int] = []
            amount = 0.0
            if req.none:
                fits = [n for n in flavor.nodes if room(n)]
                if not fits:
                    return None
                node = fits[0] if self.naive else min(fits, key=lambda n: state(n)[1])  # the busiest that fits
            elif req.share and not self.naive:
                cards = [(f, n, i) for n in flavor.nodes if room(n) for i, f in enumerate(state(n)[0])
                         if f + EPS >= req.count]
                if not cards:
                    return None
                _, node, card = min(cards, key=lambda c: c[0])  # the fullest card that still fits
                taken, amount = [card], req.count
            else:
                want = req.cards
                counts = {id(n): len(idle(n)) for n in flavor.nodes} if over else None
                fits = [n for n in flavor.nodes if (counts[id(n)] if counts else n.idle_cards) >= want and room(n)]
                if not fits:
                    return None
                node = fits[0] if self.naive else min(fits, key=lambda n: counts[id(n)] if counts else n.idle_cards)
                taken, amount = idle(node)[:want], 1.0
            free, cpu, memory = state(node)
            free = list(free)
            for i in taken:
                free[i] -= amount
            over[id(node)] = (free, cpu - job.cpu, memory - job.memory_gib)
            slots.append((node, taken, amount))
        return slots

    def fits(self, job: Job, only: Flavor | None = None) -> Placement | None:
        """``place`` without the reasons: None when nothing fits now (the scheduler's admission passes ask this
        many times and need no explanation). ``only``: try that flavor alone (the others are known to be full)."""
        quoted = self.quoted
        for option in self._plan(job)[1]:
            flavor = option.flavor
            if only is not None and flavor is not only:
                continue
            if quoted and self._quota(job, self.vendor_of(job), flavor.cluster) is not None:
                continue
            slots = self._fit(flavor, option.free, job)
            if slots is not None:
                skipped = {}
                for before in self._plan(job)[0]:
                    if before.flavor is flavor:
                        break
                    skipped[before.flavor.name] = self._reason(before, job) or "no room"
                return Placement(job, flavor, slots, option.image, skipped)
        return None

    def place(self, job: Job) -> Placement:
        """Where the job would go now (nothing is taken); NoFit with one reason per flavor if nowhere."""
        placement = self.attempt(job)
        if isinstance(placement, dict):
            raise NoFit(job, placement)
        return placement

    def attempt(self, job: Job) -> Placement | dict[str, str]:
        """``place`` without raising: the placement, or the reasons per flavor (the scheduler queues most jobs that
        do not fit yet, and builds no error for them)."""
        if job.queue not in self.inventory.queues:
            return {"queue": f"no queue named {job.queue!r}"}
        reasons: dict[str, str] = {}
        for option in self._plan(job)[0]:
            flavor = option.flavor
            reason = self._reason(option, job)
            if reason is None:
                slots = self._fit(flavor, option.free, job)
                if slots is not None:
                    return Placement(job, flavor, slots, option.image, reasons)
                index = option.free
                largest = index.largest() if index else max((n.idle_cards for n in flavor.nodes), default=0)
                reason = (f"not enough free cards: needs {job.request.raw} x{job.workers}, "
                          f"the emptiest node has {largest} idle of {flavor.cards} cards in the flavor")
                if (job.cpu or job.memory_gib) and self._fit(flavor, index, replace(job, cpu=0.0, memory_gib=0.0)):
                    reason = (f"not enough free cores or host memory: needs {job.cpu:g} cores and "
                              f"{job.memory_gib:g} GiB per worker beside its cards")
            reasons[flavor.name] = reason
        return reasons

    def allocate(self, placement: Placement) -> None:
        self._move(placement, -1.0)

    def release(self, placement: Placement) -> None:
        self._move(placement, 1.0)

    def _move(self, placement: Placement, sign: float) -> None:
        """Book (``sign`` -1) or give back (+1) a placement's cards, cores and host memory, and count it in its
        project's quota use."""
        job, flavor = placement.job, placement.flavor
        index = self._indexes.get(flavor.name)
        host = job.cpu or job.memory_gib
        for node, cards, amount in placement.slots:
            if index is not None:
                index.shift(node, cards, sign * amount)
            else:
                for i in cards:
                    node.free[i] = min(1.0, node.free[i] + sign * amount)
            if host:
                node.cpu = min(node.cpu_total, node.cpu + sign * job.cpu)
                node.memory_gib = min(node.memory_total, node.memory_gib + sign * job.memory_gib)
        inv, delta = self.inventory, -sign * job.cards_needed  # booked cards count as used
        key = (job.project, flavor.vendor)
        inv.used[key] = max(0.0, inv.used.get(key, 0.0) + delta)
        where = (job.project, flavor.cluster, flavor.vendor)
        inv.used_in[where] = max(0.0, inv.used_in.get(where, 0.0) + delta)

    def submit(self, job: Job) -> Placement:
        placement = self.place(job)
        self.allocate(placement)
        return placement
