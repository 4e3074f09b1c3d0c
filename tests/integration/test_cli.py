"""The command line, run as a user would: projects, tokens, a served gateway, emit and tail."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from cascade.core.ports import free_port
from tests.helpers.platform import wait_ready
from tests.helpers.waiting import events_until

CASCADE = [sys.executable, "-m", "cascade.cli"]


def cli(home: Path, *args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CASCADE_HOME": str(home)}
    result = subprocess.run([*CASCADE, *args], capture_output=True, text=True, env=env, timeout=timeout)
    if check:
        assert result.returncode == 0, result.stdout + result.stderr
    return result


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    port = free_port()
    env = {**os.environ, "CASCADE_HOME": str(tmp_path), "CASCADE_FUNCTIONS__PORT": str(free_port()),
           "CASCADE_DISPATCHER__METRICS_PORT": "0", "CASCADE_DASHBOARD__PORT": "0"}
    proc = subprocess.Popen([*CASCADE, "up", "--port", str(port)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        wait_ready(proc, [f"http://127.0.0.1:{port}/readyz"], 30, lambda: proc.stdout.read() if proc.stdout else "")
        yield tmp_path, port
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_projects_and_tokens(tmp_path: Path) -> None:
    assert "project vision created" in cli(tmp_path, "projects", "create", "vision").stdout
    token = cli(tmp_path, "tokens", "create", "vision").stdout.strip()
    assert token.startswith("cas_")
    reader = cli(tmp_path, "tokens", "create", "vision", "--scope", "read", "--description", "dashboards").stdout.strip()
    listed = [line.split("\t") for line in cli(tmp_path, "tokens", "ls", "vision").stdout.splitlines()]
    assert sorted(row[2] for row in listed) == ["infer,publish,read,submit", "read"]
    assert token not in str(listed) and reader not in str(listed), "ls shows ids, never tokens"
    assert cli(tmp_path, "projects", "ls").stdout.split("\t")[0] == "vision"
    [read_id] = [row[0] for row in listed if row[2] == "read"]
    assert "revoked token" in cli(tmp_path, "tokens", "revoke", read_id).stdout
    assert [row[2] for row in (line.split("\t") for line in cli(tmp_path, "tokens", "ls").stdout.splitlines())] == [
        "infer,publish,read,submit"]
    wrong = cli(tmp_path, "tokens", "create", "vision", "--scope", "admin", check=False)
    assert wrong.returncode == 2 and "scopes must be some of" in wrong.stderr
    bad = cli(tmp_path, "projects", "create", "Bad_Name", check=False)
    assert bad.returncode == 2 and "lowercase" in bad.stderr
    missing = cli(tmp_path, "tokens", "create", "nope", check=False)
    assert missing.returncode == 2 and "cascade projects create nope" in missing.stderr


def test_up_then_emit_then_tail(served: tuple[Path, int]) -> None:
    home, port = served
    assert (home / "token").read_text().startswith("cas_"), "cascade up created a first token"
    gateway = f"http://127.0.0.1:{port}"
    data = '{"dataset": "cats", "uri": "file:///tmp/cats/a.jpg", "size": 1, "origin": "api"}'
    out = cli(home, "emit", "dataset.uploaded", "--data", data, "--key", "cats", "--gateway", gateway).stdout
    assert out.startswith("published io.cascade.dataset.uploaded.v1")
    tail = cli(home, "events", "tail", "--from-beginning", "--count", "1", "--type", "dataset").stdout
    assert "dataset.uploaded" in tail and "cats" in tail
    bad = cli(home, "emit", "dataset.uploaded", "--data", '{"dataset": "cats"}', "--gateway", gateway, check=False)
    assert bad.returncode == 2 and "/data/uri" in bad.stderr


def test_dispatcher_commands_on_the_embedded_platform(tmp_path: Path) -> None:
    from tests.helpers.subscriber import Subscriber

    sub = Subscriber(behaviours={"/down": lambda d, i: (500, {}, b"subscriber is down")})
    triggers = tmp_path / "hooks.triggers.yaml"
    triggers.write_text(f"triggers:\n- name: hook\n  subscriber: {sub.url('/ok')}\n  start: earliest\n"
                        f"- name: broken\n  subscriber: {sub.url('/down')}\n  start: earliest\n"
                        "  delivery: {retry: 1, backoffDelay: PT0.01S}\n")
    port, metrics = free_port(), free_port()
    env = {**os.environ, "CASCADE_HOME": str(tmp_path), "CASCADE_DISPATCHER__TRIGGERS": json.dumps([str(triggers)]),
           "CASCADE_DISPATCHER__METRICS_PORT": str(metrics), "CASCADE_FUNCTIONS__PORT": str(free_port()),
           "CASCADE_DASHBOARD__PORT": "0"}
    proc = subprocess.Popen([*CASCADE, "up", "--port", str(port)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        gateway = f"http://127.0.0.1:{port}"
        wait_ready(proc, [f"{gateway}/readyz"], 30, lambda: proc.stdout.read() if proc.stdout else "")
        data = '{"jobId": "job-1"}'
        refused = cli(tmp_path, "emit", "job.cancelled", "--data", data, "--gateway", gateway, check=False)
        assert refused.returncode == 2 and "403" in refused.stderr, "a project token cannot publish platform events"
        cli(tmp_path, "emit", "job.cancelled", "--data", data, "--gateway", gateway, "--platform")
        deadline = time.monotonic() + 30
        while not (sub.at("/ok") and len(sub.at("/down")) == 2):
            assert time.monotonic() < deadline, "not delivered"
            time.sleep(0.1)
        deadline = time.monotonic() + 30  # stats are saved every 2 s
        while True:
            listing = cli(tmp_path, "triggers", "ls", "--triggers", str(triggers)).stdout
            row = next(line for line in listing.splitlines() if "hook" in line)
            if " 1 " in row:
                break
            assert time.monotonic() < deadline, listing
            time.sleep(0.5)
        letters = cli(tmp_path, "dlq", "ls", "broken", "--triggers", str(triggers)).stdout
        assert "io.cascade.job.cancelled.v1" in letters and "500" in letters and "1 dead letter(s)" in letters
        sub.behaviours["/down"] = lambda d, i: (200, {}, b"")
        assert "replayed 1" in cli(tmp_path, "dlq", "replay", "broken", "--triggers", str(triggers)).stdout
        deadline = time.monotonic() + 30
        while len(sub.at("/down")) < 3:
            assert time.monotonic() < deadline, "replay not delivered"
            time.sleep(0.1)
        assert 'cascade_trigger_delivered_total{trigger="hook"} 1.0' in httpx.get(f"http://127.0.0.1:{metrics}/metrics").text
        missing = cli(tmp_path, "dlq", "ls", "nope", "--triggers", str(triggers), check=False)
        assert missing.returncode == 2 and "cascade triggers ls" in missing.stderr
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        sub.close()


def test_render_writes_the_cluster_form_and_check_catches_drift(tmp_path: Path) -> None:
    out = tmp_path / "repo"
    written = cli(tmp_path, "render", "--out", str(out)).stdout
    assert "knative/base/kustomization.yaml" in written and "images/matrix.yaml" in written
    assert cli(tmp_path, "render", "--out", str(out), "--check").returncode == 0
    (out / "knative" / "base" / "broker.yaml").write_text("# edited by hand\n")
    (out / "images" / "leftover.Dockerfile").write_text("FROM scratch\n")
    drift = cli(tmp_path, "render", "--out", str(out), "--check", check=False)
    assert drift.returncode == 1 and "broker.yaml" in drift.stderr and "leftover.Dockerfile" in drift.stderr
    cli(tmp_path, "render", "--out", str(out))
    assert not (out / "images" / "leftover.Dockerfile").exists()


def test_functions_serve_answers_one_function_at_the_root_as_in_a_knative_pod(tmp_path: Path) -> None:
    fn = tmp_path / "functions" / "stamp"
    fn.mkdir(parents=True)
    (fn / "func.yaml").write_text("name: stamp\nmodule: handler\n")
    (fn / "handler.py").write_text(f"def handle(event):\n    open({str(tmp_path / 'seen')!r}, 'a').write(event['id'])\n")
    port = free_port()
    env = {**os.environ, "CASCADE_HOME": str(tmp_path), "CASCADE_FUNCTION": "stamp", "PORT": str(port)}
    proc = subprocess.Popen([*CASCADE, "functions", "serve", "--host", "127.0.0.1"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_ready(proc, [f"http://127.0.0.1:{port}/healthz"], 30, lambda: proc.stdout.read() if proc.stdout else "")
        reply = httpx.post(f"http://127.0.0.1:{port}/", json={"jobId": "job-1"}, timeout=30, headers={
            "ce-specversion": "1.0", "ce-id": "serve-1", "ce-source": "/test", "ce-type": "io.cascade.job.cancelled.v1"})
        assert reply.status_code < 300, reply.text
        assert (tmp_path / "seen").read_text() == "serve-1"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    missing = cli(tmp_path, "functions", "serve", "nope", check=False)
    assert missing.returncode == 2 and "stamp" in missing.stderr


def test_a_release_names_its_accelerator_and_replica_resources(tmp_path: Path) -> None:
    from cascade.events.bus.embedded import EmbeddedBus
    from cascade.serving.registry import Registry
    from cascade.stores.sqlite import SqliteStore

    store = SqliteStore(tmp_path / "state.db")
    Registry(store).register({"model": "cats", "version": "1", "artifactUri": "file:///m/model.pt", "sha256": "0" * 64,
                              "format": "torchscript"})
    store.close()
    bad = cli(tmp_path, "models", "release", "cats", "1", "--accelerator", "two cards", check=False)
    assert bad.returncode == 2 and "accelerator request 'two cards' is not one of" in bad.stderr
    cli(tmp_path, "models", "release", "cats", "1", "--accelerator", "1(T4)", "--cpu", "2", "--memory", "4Gi")
    bus = EmbeddedBus(tmp_path / "bus.db")
    try:
        [released] = events_until(bus, "cascade.events", lambda seen: len(seen) >= 1, 30, what="model.released")
    finally:
        bus.close()
    data = released.get_data()
    assert (data["accelerator"], data["resources"]) == ("1(T4)", {"cpu": "2", "memory": "4Gi"})


def test_nodes_probe_writes_an_inventory_and_frameworks_recommend_walks_the_tree(tmp_path: Path) -> None:
    inventory = tmp_path / "inventory.yaml"
    probed = cli(tmp_path, "nodes", "probe", "--output", str(inventory))
    doc = yaml.safe_load(inventory.read_text())
    cpu = next(f for f in doc["flavors"] if f["vendor"] == "cpu")
    assert cpu["nodes"][0]["cpu"] == os.cpu_count() and cpu["nodes"][0]["hostMemoryGiB"] > 0
    if len(doc["flavors"]) == 1:  # this machine has no accelerator, and the probe says so
        assert "no accelerator found" in probed.stdout
    advice = cli(tmp_path, "frameworks", "recommend", "--task", "nlp", "--deploy", "cloud", "--team", "python",
                 "--priority", "scale", "--inventory", str(inventory))
    assert "recommended: pytorch, scaled with deepspeed" in advice.stdout
    assert "4. what matters most? scale: models beyond one card's memory need ZeRO sharding" in advice.stdout
    assert "pytorch on cpu: ghcr.io/cascade-ml/pytorch-cpu:0.1" in advice.stdout
    bad = cli(tmp_path, "frameworks", "recommend", "--task", "audio", "--deploy", "cloud", "--team", "python",
              "--priority", "scale", check=False)
    assert bad.returncode == 2 and "--task must be one of vision, nlp, recsys, rl" in bad.stderr
