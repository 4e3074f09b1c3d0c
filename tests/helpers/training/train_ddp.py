"""A tiny PyTorch DDP job (gloo, CPU): linear regression on generated data, loss per step."""

import json
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")  # MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE from the operator's env
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
features = torch.randn(512, 8)
truth = torch.randn(8, 1)
target = features @ truth + 0.01 * torch.randn(512, 1)
shard = slice(rank * len(features) // world, (rank + 1) * len(features) // world)
model = DistributedDataParallel(torch.nn.Linear(8, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
steps = int(json.loads(os.environ.get("CASCADE_HPARAMS", "{}")).get("steps", 60))
losses = []
for step in range(steps):
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(features[shard]), target[shard])
    loss.backward()
    optimizer.step()
    total = loss.detach().clone()
    dist.all_reduce(total)
    losses.append(total.item() / world)
    if rank == 0 and step % 10 == 0:
        print(f"step {step} loss {losses[-1]:.5f}", flush=True)
if rank == 0:
    out = os.environ["CASCADE_OUTPUT_DIR"]
    torch.save(model.module.state_dict(), f"{out}/model.pt")
    torch.jit.script(model.module).save(f"{out}/model.torchscript.pt")
    with open(f"{out}/metrics.json", "w") as f:
        json.dump({"loss": losses[-1], "first_loss": losses[0], "world_size": world}, f)
dist.destroy_process_group()
