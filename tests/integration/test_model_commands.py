"""Release, roll back and undeploy as a user does, on a real `cascade up` that is also restarted.

Each command has its own event id, so re-releasing a version always reaches deploy-model; the
registry keeps the desired and the live split, and a restarted platform serves the live one
again. A release aimed at edge clusters is not deployed centrally, and a version that cannot
load (a LoRA adapter folder, which the model server has no format for yet) ends as
``model.deploy_failed`` while the previous version keeps serving.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from cascade.core.hashing import sha256_file
from cascade.events.bus.embedded import EmbeddedBus
from cascade.serving.registry import LIVE, Registry
from cascade.stores.sqlite import SqliteStore
from tests.helpers import models
from tests.helpers.platform import PORTS, Running, cascade_up
from tests.helpers.waiting import eventually, holds

pytestmark = pytest.mark.slow  # model servers start in every step
MODEL = "churn"


class Site:
    def __init__(self, home: Path) -> None:
        self.home, self.stack = home, ExitStack()
        self.env = {"CASCADE_SERVING__SCALE_TO_ZERO_GRACE_SECONDS": "30"}
        self.running: Running | None = None

    def start(self) -> Running:
        self.stack = ExitStack()
        self.running = self.stack.enter_context(cascade_up(self.home, **self.env))
        self.env.update({key: self.running.env[key] for key in PORTS.values()})
        return self.running

    @property
    def up(self) -> Running:
        assert self.running is not None
        return self.running

    def cascade(self, *args: str) -> str:
        done = self.up.cascade(*args, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def events(self, kind: str) -> list[Any]:
        bus = EmbeddedBus(self.home / "bus.db")
        consumer = bus.subscribe(["cascade.events"], f"check-{uuid.uuid4().hex}", start="earliest")
        seen: list[Any] = []
        try:
            while batch := consumer.poll(0.3):
                seen += [e for e in (r.event() for r in batch) if e["type"] == f"io.cascade.model.{kind}.v1"]
        finally:
            consumer.close()
            bus.close()
        return seen

    def serving(self) -> dict[str, int]:
        routes = httpx.get(f"{self.up.runtime}/_runtime/models", headers=self.up.admin).json()
        return {str(r["version"]): int(r["percent"]) for r in routes.get(MODEL, [])}

    def predict(self) -> httpx.Response:
        return httpx.post(f"{self.up.runtime}/v1/models/{MODEL}:predict", json={"instances": [[1, 1, 1, 1]]},
                          headers=self.up.auth, timeout=60)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    site = Site(tmp_path_factory.mktemp("models") / "home")
    site.start()
    artifacts = site.home / "artifacts" / "made-by-hand"
    artifacts.mkdir(parents=True)
    adapter = artifacts / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text('{"peft_type": "LORA", "base_model_name_or_path": "tiny"}')
    (adapter / "adapter_model.safetensors").write_bytes(b"\0" * 64)
    registry = Registry(SqliteStore(site.home / "state.db"))
    for version, path, fmt in (("1", models.torchscript(artifacts, bias=0.0), "torchscript"),
                               ("2", models.torchscript(artifacts, bias=100.0), "torchscript"),
                               ("3", adapter, "lora-adapter")):
        registry.register({"model": MODEL, "version": version, "artifactUri": path.as_uri(),
                           "sha256": sha256_file(path), "format": fmt, "metrics": {}, "lineage": {}})
    try:
        yield site
    finally:
        site.stack.close()
        shutil.rmtree(artifacts, ignore_errors=True)


def deployed(site: Site, version: str) -> int:
    return sum(1 for e in site.events("deployed") if e.get_data()["version"] == version)


def test_release_rerelease_canary_and_rollback_each_take_effect_once(site: Site) -> None:
    assert site.cascade("models", "release", MODEL, "1").startswith(f"released {MODEL} 1")
    eventually(lambda: site.serving() == {"1": 100}, 120, "version 1 serving")
    assert site.predict().json()["predictions"] == [[2.5]]
    eventually(lambda: deployed(site, "1") == 1, 30, "model.deployed for 1")
    again = site.cascade("models", "release", MODEL, "1")
    assert again.startswith("nothing to do"), again
    site.cascade("models", "release", MODEL, "2", "--canary", "50")
    eventually(lambda: site.serving() == {"1": 50, "2": 50}, 120, "the canary gets half")
    site.cascade("models", "rollback", MODEL, "1")
    eventually(lambda: site.serving() == {"1": 100}, 60, "the rollback restores version 1's traffic")
    eventually(lambda: deployed(site, "1") == 2, 30, "the rollback is a command of its own, not a duplicate")
    releases = [e["id"] for e in site.events("released")]
    assert len(releases) == len(set(releases)) == 3
    table = site.cascade("models", "ls")
    assert "100%" in table and "serving" in table and "desired" in table


def test_edge_only_releases_and_versions_that_cannot_load_leave_the_central_split_alone(site: Site) -> None:
    before = deployed(site, "2")  # once, as the first test's canary
    out = site.cascade("models", "release", MODEL, "2", "--label", "region=eu")
    assert out.strip().endswith("to edge clusters only"), out
    site.cascade("models", "release", MODEL, "3")
    eventually(lambda: any(e.get_data()["version"] == "3" for e in site.events("deploy_failed")), 120,
               "the adapter folder ends as model.deploy_failed")
    [failed] = [e.get_data() for e in site.events("deploy_failed") if e.get_data()["version"] == "3"]
    assert failed["serving"] == "1" and failed["reason"]
    holds(lambda: site.serving() == {"1": 100}, 2.0, "version 1 keeps all the traffic")
    assert deployed(site, "2") == before, "the edge-only release was not deployed centrally"


def test_a_restart_serves_the_live_split_again_and_undeploy_withdraws_it(site: Site) -> None:
    site.stack.close()
    site.start()
    eventually(lambda: site.serving() == {"1": 100}, 120, "the live version restored after the restart")
    assert site.predict().json()["predictions"] == [[2.5]]
    assert site.cascade("models", "undeploy", MODEL, "1").startswith(f"withdrew {MODEL} 1")
    eventually(lambda: site.serving() == {}, 60, "nothing serves the model")
    assert site.predict().status_code == 404
    registry = Registry(SqliteStore(site.home / "state.db"))
    eventually(lambda: registry.traffic(LIVE, MODEL) == {}, 30, "deploy-model recorded that nothing is live")
    assert site.cascade("models", "undeploy", MODEL, "1").startswith("nothing to do")
