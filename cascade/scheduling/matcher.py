"""The accelerator matcher: the first flavor with room wins, best-fit inside it.

``place`` finds a placement without taking anything; ``allocate``/``release`` book and
free cards and quota. ``naive=True`` gives the baseline the benchmark compares against:
first-fit over nodes, and fractional requests take a whole card.
"""

from __future__ import annotations

from cascade.scheduling import frameworks
from cascade.scheduling.placement import Flavor, Inventory, Job, Node, NoFit, Placement, _cards_needed

EPS = 1e-9


class Matcher:
    def __init__(self, inventory: Inventory, *, default_vendor: str = "nvidia", naive: bool = False) -> None:
        self.inventory, self.default_vendor, self.naive = inventory, default_vendor, naive

    def vendor_of(self, job: Job) -> str:
        return "cpu" if job.request.none else (job.request.vendor or self.default_vendor)

    def _reason(self, flavor: Flavor, job: Job) -> str | None:
        req, vendor = job.request, self.vendor_of(job)
        if flavor.vendor != vendor:
            return f"wrong vendor: the job wants {vendor}, this flavor is {flavor.vendor}"
        if req.model and flavor.model.upper() != req.model.upper():
            return f"wrong model: the job wants {req.model}, this flavor is {flavor.model or 'unnamed'}"
        if not frameworks.supports(job.framework, vendor):
            return f"framework unsupported: {job.framework} does not run on {vendor}"
        if req.share and flavor.sharing == "none" and not self.naive:
            return "no card sharing on this flavor"
        need = max(req.memory_gib or 0.0, job.min_memory_gib)
        have = flavor.memory_gib * (req.count if req.share else 1)
        if need and vendor != "cpu" and need > have + EPS:
            return f"not enough memory: needs {need:g} GiB per card, this flavor gives {have:g} GiB"
        quota = self.inventory.quotas.get(job.project, {}).get(vendor)
        used = self.inventory.used.get((job.project, vendor), 0.0)
        if quota is not None and used + _cards_needed(job) > quota + EPS:
            return f"quota exhausted: project {job.project} uses {used:g} of {quota:g} {vendor} cards"
        return None

    def _fit(self, flavor: Flavor, job: Job) -> list[tuple[Node, list[int], float]] | None:
        """Slots for every worker on a copy of the free state, or None."""
        free = {id(n): list(n.free) for n in flavor.nodes}
        slots: list[tuple[Node, list[int], float]] = []
        req = job.request
        for _ in range(job.workers):
            if req.none:
                node = flavor.nodes[0] if flavor.nodes else None
                if node is None:
                    return None
                slots.append((node, [], 0.0))
            elif req.share and not self.naive:
                cards = [(f, n, i) for n in flavor.nodes for i, f in enumerate(free[id(n)]) if f + EPS >= req.count]
                if not cards:
                    return None
                _, node, index = min(cards, key=lambda c: c[0])  # the fullest card that still fits
                free[id(node)][index] -= req.count
                slots.append((node, [index], req.count))
            else:
                want = req.cards
                fits = [n for n in flavor.nodes if sum(1 for f in free[id(n)] if f >= 1 - EPS) >= want]
                if not fits:
                    return None
                node = fits[0] if self.naive else min(fits, key=lambda n: sum(1 for f in free[id(n)] if f >= 1 - EPS))
                idle = [i for i, f in enumerate(free[id(node)]) if f >= 1 - EPS][:want]
                for i in idle:
                    free[id(node)][i] = 0.0
                slots.append((node, idle, 1.0))
        return slots

    def place(self, job: Job) -> Placement:
        reasons: dict[str, str] = {}
        order = self.inventory.queues.get(job.queue)
        if order is None:
            raise NoFit(job, {"queue": f"no queue named {job.queue!r}"})
        for name in order:
            flavor = self.inventory.flavors[name]
            reason = self._reason(flavor, job)
            if reason is None:
                slots = self._fit(flavor, job)
                if slots is not None:
                    return Placement(job, flavor, slots, frameworks.image(job.framework, flavor.vendor), reasons)
                largest = max((n.idle_cards for n in flavor.nodes), default=0)
                reason = (f"not enough free cards: needs {job.request.raw} x{job.workers}, "
                          f"the emptiest node has {largest} idle of {flavor.cards} cards in the flavor")
            reasons[name] = reason
        raise NoFit(job, reasons)

    def allocate(self, placement: Placement) -> None:
        for node, cards, amount in placement.slots:
            for i in cards:
                node.free[i] -= amount
        key = (placement.job.project, placement.flavor.vendor)
        self.inventory.used[key] = self.inventory.used.get(key, 0.0) + _cards_needed(placement.job)

    def release(self, placement: Placement) -> None:
        for node, cards, amount in placement.slots:
            for i in cards:
                node.free[i] = min(1.0, node.free[i] + amount)
        key = (placement.job.project, placement.flavor.vendor)
        self.inventory.used[key] = max(0.0, self.inventory.used.get(key, 0.0) - _cards_needed(placement.job))

    def submit(self, job: Job) -> Placement:
        placement = self.place(job)
        self.allocate(placement)
        return placement
