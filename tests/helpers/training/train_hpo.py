"""A trial of the hyper-parameter tests: a small MLP on a fixed synthetic regression, its validation loss
appended to metrics.jsonl after every step (what an experiment prunes on) and written to metrics.json at the end."""

import json
import os
from pathlib import Path

import torch

params = json.loads(os.environ["CASCADE_HPARAMS"])
out = Path(os.environ["CASCADE_OUTPUT_DIR"])
torch.manual_seed(0)
torch.set_num_threads(1)
x = torch.randn(2048, 8)
y = torch.sin(x[:, :1] * 2) + x[:, 1:2] * x[:, 2:3] + 0.05 * torch.randn(2048, 1)
train, valid = (x[:1536], y[:1536]), (x[1536:], y[1536:])
hidden = int(params["hidden"])
model = torch.nn.Sequential(torch.nn.Linear(8, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 1))
optimizer = torch.optim.Adam(model.parameters(), lr=float(params["lr"]))
loss = torch.tensor(0.0)
for step in range(int(params.get("steps", 30))):
    for _ in range(int(params.get("iterations", 40))):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(train[0]), train[1]).backward()
        optimizer.step()
    with torch.no_grad():
        loss = torch.nn.functional.mse_loss(model(valid[0]), valid[1])
    with (out / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"step": step, "loss": float(loss)}) + "\n")
    print(f"step {step} loss {float(loss):.4f}", flush=True)
(out / "metrics.json").write_text(json.dumps({"loss": float(loss)}))
torch.jit.trace(model, valid[0][:1]).save(str(out / "model.pt"))  # what an experiment may release
