"""The gateway as the benchmark serves it: Kafka bus, SQLite state, a token in CASCADE_BENCH_TOKEN_FILE."""

from __future__ import annotations

import os
from pathlib import Path

from cascade.core.settings import GatewaySettings
from cascade.events.bus import open_bus
from cascade.events.gateway import create_app
from cascade.events.identity import Projects
from cascade.stores.sqlite import SqliteStore

home = Path(os.environ["CASCADE_BENCH_HOME"])
store = SqliteStore(home / "state.db")
projects = Projects(store)
projects.create_project("bench")
(home / "token").write_text(projects.create_token("bench"))
app = create_app(open_bus(os.environ.get("CASCADE_BENCH_BUS", "kafka://127.0.0.1:9092")), store,
                 GatewaySettings(rate_per_second=1e9, burst=10**9), "cascade.bench")
