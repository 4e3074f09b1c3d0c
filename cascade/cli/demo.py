"""``cascade demo``: the whole story, driven against a running platform, as a timeline.

A file lands in the watched folder; a Label Studio webhook says the labels are complete; the
dataset's training policy turns that into a PyTorch job placed on matching (local) hardware;
the trained model is registered, released, deployed behind the scale-to-zero runtime and by
an edge agent (started here, its own consumer group); inference calls are answered by both;
then everything goes back to zero. The demo only talks to the platform the way a user
would (files, webhooks, the bus, HTTP), and prints each event as it arrives with its latency.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

import httpx
from cloudevents.http import CloudEvent

from cascade.cli.timeline import DemoFailed, Timeline, Watcher, instances, wait_until
from cascade.core.credentials import platform_token
from cascade.core.errors import InvalidInput
from cascade.core.ports import free_port
from cascade.core.settings import Settings
from cascade.events.bus import EventBus
from cascade.functions.training.launcher import set_policy

__all__ = ["DemoFailed", "run"]

TRAIN = '''"""The demo's training script: linear regression on the dataset's CSV files, in PyTorch."""
import csv, glob, json, os
import torch

hp = json.loads(os.environ.get("CASCADE_HPARAMS", "{}"))
rows = [[float(v) for v in row] for path in sorted(glob.glob(os.path.join(hp["data"], "*.csv")))
        for row in csv.reader(open(path)) if row and not row[0].startswith("x")]
data = torch.tensor(rows)
features, target = data[:, :-1], data[:, -1:]
model = torch.nn.Linear(features.shape[1], 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(int(hp.get("steps", 200))):
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(features), target)
    loss.backward()
    optimizer.step()
    if step % 50 == 0:
        print(f"step {step} loss {loss.item():.5f}", flush=True)
out = os.environ["CASCADE_OUTPUT_DIR"]
torch.jit.script(model).save(os.path.join(out, "model.torchscript.pt"))
json.dump({"loss": loss.item(), "rows": len(rows)}, open(os.path.join(out, "metrics.json"), "w"))
'''
FEATURES = 4


def _post(url: str, token: str, body: Any) -> None:
    reply = httpx.post(url, json=body, headers={"authorization": f"Bearer {token}"}, timeout=30)
    if reply.status_code != 202:
        raise DemoFailed(f"POST {url} answered {reply.status_code}: {reply.text[:300]}")


def run(cfg: Settings, bus: EventBus, store: Any, token: str, say: Callable[[str], None],
        timeout: float = 600) -> Timeline:
    """The story; raises DemoFailed with what did not happen."""
    if importlib.util.find_spec("torch") is None:
        raise DemoFailed("the demo trains a PyTorch model: install torch into this environment "
                         "(.venv/bin/pip install torch) and run it again")
    gateway, runtime = cfg.gateway_url, cfg.runtime_url
    for url in (f"{gateway}/healthz", f"{runtime}/healthz"):
        try:
            httpx.get(url, timeout=5).raise_for_status()
        except httpx.HTTPError as exc:
            raise DemoFailed(f"{url} is not answering ({exc}); start the platform first: cascade up") from exc
    run_id = uuid.uuid4().hex[:6]
    name = f"demo-{run_id}"
    data_dir, work = cfg.inbox / name, cfg.workspaces / "default"  # jobs run scripts from their project's workspace
    work.mkdir(parents=True, exist_ok=True)
    (work / f"{name}.py").write_text(TRAIN)
    sample = [[1.0] * FEATURES]
    spec = {"framework": "pytorch", "entrypoint": {"script": f"{name}.py"}, "workers": 1,
            "resources": {"accelerator": "0", "cpu": "1", "memory": "1Gi"},
            "hyperparameters": {"data": str(data_dir), "steps": 200},
            "model": {"name": name, "file": "model.torchscript.pt", "format": "torchscript",
                      "release": {"when": "data.loss < 0.5", "sampleInput": sample}}}  # no targets: central and edge
    try:
        set_policy(store, name, spec)
    except InvalidInput as exc:
        raise DemoFailed(f"the demo's training spec is invalid: {exc}") from exc
    timeline = Timeline(say)
    watcher = Watcher(bus, cfg.bus.topic, timeline)
    say(f"demo {name}: dataset, labels, training, release, serving, edge, back to zero")
    edge_port = free_port()
    edge = subprocess.Popen([sys.executable, "-P", "-m", "cascade.cli", "edge", "agent", "--cluster", f"edge-{run_id}",
                             "--label", f"demo-run={run_id}", "--port", str(edge_port), "--heartbeat", "2"],
                            env={**os.environ, **cfg.export()}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _story(cfg, watcher, timeline, token, name, run_id, data_dir, sample, gateway, runtime,
               f"http://127.0.0.1:{edge_port}", edge, timeout)
    finally:
        edge.terminate()
        try:
            edge.wait(30)
        except subprocess.TimeoutExpired:
            edge.kill()
        watcher.consumer.close()
    return timeline


def _story(cfg: Settings, w: Watcher, tl: Timeline, token: str, name: str, run_id: str, data_dir: Any,
           sample: list[list[float]], gateway: str, runtime: str, edge_url: str, edge: Any, timeout: float) -> None:
    job = [""]

    def ours(event: CloudEvent, data: dict[str, Any]) -> bool:
        spec: dict[str, Any] = data["spec"] if isinstance(data.get("spec"), dict) else {}
        return name in (data.get("dataset"), data.get("model"), spec.get("dataset")) or data.get("jobId") == job[0]

    try:
        w.wait("edge.heartbeat", lambda e, d: d.get("cluster") == f"edge-{run_id}", 60,
               lambda d: f"edge agent {d['cluster']} is subscribed")
    except DemoFailed:
        raise DemoFailed(f"the edge agent did not start: {edge.stderr.read1(4000).decode(errors='replace')}") from None
    data_dir.mkdir(parents=True, exist_ok=True)
    part = data_dir / "part-0.csv.part"
    rows = ["x1,x2,x3,x4,y"] + [",".join(f"{v:.3f}" for v in (*x, 0.5 * x[0] - x[1] + 0.25 * x[3]))
                                 for x in ([(i * 7 % 13) / 13, (i * 5 % 11) / 11, (i * 3 % 7) / 7, (i % 5) / 5]
                                           for i in range(256))]
    part.write_text("\n".join(rows) + "\n")
    part.rename(data_dir / "part-0.csv")
    tl.mark("file written", f"{data_dir}/part-0.csv")
    w.wait("dataset.uploaded", ours, 60, lambda d: f"{d['key']} ({d['size']} bytes) via the watched folder")
    _post(f"{gateway}/webhooks/label-studio?dataset={name}", token,
          {"action": "ANNOTATION_CREATED", "annotation": {"id": 1, "updated_at": run_id},
           "project": {"id": run_id, "title": name, "task_number": 256, "num_tasks_with_annotations": 256,
                       "finished_task_number": 256}})
    tl.mark("label studio webhook sent", "256/256 tasks annotated")
    w.wait("labels.completed", ours, 60, lambda d: f"label studio project {d['project']}")
    submitted = w.wait("job.submitted", ours, 120, lambda d: f"{d['jobId']} (the dataset's training policy)")
    job[0] = str(submitted["jobId"])
    w.wait("job.started", ours, timeout, lambda d: f"pytorch, placed on {_where(d.get('placement') or {})}")
    w.wait("job.succeeded", ours, timeout, lambda d: f"loss {d['metrics'].get('loss', float('nan')):.4f} "
                                                     f"in {d.get('durationSeconds', 0):.1f}s")
    w.wait("model.registered", ours, 120, lambda d: f"{name} v{d['version']} sha256 {str(d.get('sha256'))[:12]}")
    w.wait("model.released", ours, 120, lambda d: f"{name} v{d['version']} (gate: loss < 0.5)")
    w.wait("model.deployed", lambda e, d: ours(e, d) and not d.get("cluster"), timeout,
           lambda d: f"central runtime, scale to zero (load {d.get('timings', {}).get('load', 0):.2f}s)")
    w.wait("model.deployed", lambda e, d: ours(e, d) and d.get("cluster") == f"edge-{run_id}", timeout,
           lambda d: f"edge cluster {d['cluster']} (load {d.get('timings', {}).get('load', 0):.2f}s)")
    admin = platform_token(cfg.home)  # the demo runs beside the platform, as its operator
    edge_admin = platform_token(cfg.home / "edge" / f"edge-{run_id}")
    for where, url, key in (("central", runtime, admin), ("edge", edge_url, edge_admin)):
        cold = instances(url, key).get(f"model-{name}-1", 0) == 0
        began = time.monotonic()
        reply = httpx.post(f"{url}/v1/models/{name}:predict", json={"instances": sample}, timeout=timeout,
                           headers={"authorization": f"Bearer {token}"})
        if reply.status_code != 200:
            raise DemoFailed(f"{where} inference answered {reply.status_code}: {reply.text[:300]}")
        tl.mark(f"inference answered ({where})", f"{reply.json()['predictions']} in "
                f"{(time.monotonic() - began) * 1000:.0f} ms{' from zero' if cold else ''}")
    tl.say("  waiting for every function and model server to scale to zero")
    wait_until(lambda: not any(instances(runtime, admin).values()), timeout, "scale to zero (central)")
    tl.mark("central runtime at zero", f"{len(instances(runtime, admin))} services, 0 instances")
    wait_until(lambda: not any(instances(edge_url, edge_admin).values()), timeout, "scale to zero (edge)")
    tl.mark("edge runtime at zero", "")


def _where(placement: dict[str, Any]) -> str:
    """Flavor, nodes and image of a placement, as the matcher chose them."""
    nodes = ",".join(placement.get("nodes") or []) or "this machine"
    return f"flavor {placement.get('flavor', '?')} node {nodes} image {placement.get('image', '?')}"
