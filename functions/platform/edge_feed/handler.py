"""edge-feed: model.released -> an entry on the release feed remote edge agents follow; their
model.deployed / model.deploy_failed open a staged rollout's next wave or halt it. (Heartbeats do
not come here: the gateway records a remote agent's itself, and `cascade edge ls` reads those of
agents on the bus from the bus, so the function can scale to zero between releases.)"""

from __future__ import annotations

from typing import Any

from cloudevents.http import CloudEvent

from cascade.core.settings import Settings
from cascade.events.edge import Feed
from cascade.stores import open_store

_feed: Feed | None = None


def start(config: dict[str, Any]) -> None:
    global _feed
    _feed = Feed(open_store(Settings().state_url))  # this process's settings, read once at its entry point


def handle(event: CloudEvent) -> None:
    assert _feed is not None
    _feed.ingest(event)
