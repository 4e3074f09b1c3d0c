"""Inference routing: a model name (and version, or the canary split) -> the serving service.

The activator serves the KServe protocols itself: ``/v1/models/{name}:predict`` and
``/v2/models/{name}[/versions/{v}]/infer`` go to the live version's model server, or split
by ``canaryTrafficPercent`` while two versions are live. Deploying a version goes through
``PUT /_runtime/models/{name}/versions/{version}``: the runtime starts the model server,
waits until the model is loaded, and only then routes traffic to it; a version that fails
to load is removed and the previous one keeps serving.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

_V1 = re.compile(r"^/v1/models/(?P<name>[^/:]+)(?::(?P<verb>predict|explain))?$")
_V2 = re.compile(r"^/v2/models/(?P<name>[^/]+)(?:/versions/(?P<version>[^/]+))?(?:/(?P<verb>infer|ready))?$")


def parse_path(path: str) -> tuple[str, str | None] | None:
    """(model, version) for an inference path, or None for any other path."""
    for pattern in (_V1, _V2):
        match = pattern.match(path)
        if match:
            return match["name"], match.groupdict().get("version")
    return None


@dataclass
class Route:
    version: str
    service: str
    percent: int


@dataclass
class ModelRoutes:
    routes: dict[str, list[Route]] = field(default_factory=dict)
    rng: random.Random = field(default_factory=random.Random)

    def pick(self, model: str, version: str | None = None) -> Route | None:
        routes = self.routes.get(model, [])
        if version is not None:
            return next((r for r in routes if r.version == version), None)
        if not routes:
            return None
        roll = self.rng.uniform(0, 100)
        total = 0.0
        for route in routes:
            total += route.percent
            if roll < total:
                return route
        return routes[-1]

    def promote(self, model: str, route: Route, canary: int | None) -> list[str]:
        """Route to the new version (all of it, or ``canary`` percent); returns services no longer routed."""
        current = [r for r in self.routes.get(model, []) if r.version != route.version]
        if canary is not None and current and canary < 100:
            stable = max(current, key=lambda r: r.percent)
            self.routes[model] = [Route(stable.version, stable.service, 100 - canary),
                                  Route(route.version, route.service, canary)]
            dropped = [r.service for r in current if r is not stable]
        else:
            self.routes[model] = [Route(route.version, route.service, 100)]
            dropped = [r.service for r in current]
        return dropped

    def withdraw(self, model: str, version: str) -> list[str]:
        """Stop routing to ``version``; the other version, if any, takes all the traffic. Services no longer routed."""
        routes = self.routes.get(model, [])
        gone = [r.service for r in routes if r.version == version]
        rest = [Route(r.version, r.service, 100) for r in routes if r.version != version]
        if rest:
            self.routes[model] = rest[:1]
        else:
            self.routes.pop(model, None)
        return gone

    def live(self) -> dict[str, list[dict[str, object]]]:
        return {m: [{"version": r.version, "percent": r.percent, "service": r.service} for r in rs]
                for m, rs in self.routes.items()}
