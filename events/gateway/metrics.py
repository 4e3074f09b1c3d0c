"""Prometheus metrics of the gateway, in a registry of its own (one per app)."""

from __future__ import annotations

from collections.abc import Sequence

from cloudevents.http import CloudEvent
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from cascade.core.errors import CascadeError
from cascade.events.gateway.errors import status_of

ROUTES = ("/events", "/webhooks/s3", "/webhooks/label-studio", "/webhooks/cvat", "/v1/jobs", "/metrics", "/readyz",
          "/healthz")


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.accepted = Counter("cascade_gateway_events_accepted", "Events durably published",
                                ["route", "type"], registry=self.registry)
        self.rejections = Counter("cascade_gateway_requests_rejected", "Requests answered with an error",
                                  ["route", "status"], registry=self.registry)
        self.publish_seconds = Histogram("cascade_gateway_publish_seconds", "Time to publish a request's events",
                                         ["route"], registry=self.registry,
                                         buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1, 5))

    def published(self, route: str, events: Sequence[CloudEvent], seconds: float) -> None:
        for event in events:
            self.accepted.labels(route, event["type"]).inc()
        self.publish_seconds.labels(route).observe(seconds)

    @staticmethod
    def route(path: str) -> str:
        """A known route the path belongs to, or ``other``: label values stay bounded whatever clients send."""
        return next((r for r in ROUTES if path == r or path.startswith(r + "/")), "other")

    def rejected(self, path: str, exc: CascadeError) -> None:
        self.rejections.labels(self.route(path), str(status_of(exc))).inc()

    def refused(self, status: int, path: str) -> None:
        """A request the HTTP guard or the error handler answered (bad host, too large, a 500)."""
        self.rejections.labels(self.route(path), str(status)).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
