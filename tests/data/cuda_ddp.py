"""A DistributedDataParallel script written for N GPUs, launched by torchrun: ``nccl``,
``LOCAL_RANK``, ``torch.cuda.set_device``, ``device_ids=[local_rank]``, AMP with a scaler. It
writes each rank's final weights to ``<--out>/rank<RANK>.pt``."""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
args = parser.parse_args()

local_rank = int(os.environ["LOCAL_RANK"])
dist.init_process_group(backend="nccl")
torch.cuda.set_device(local_rank)
device = torch.device("cuda", local_rank)
assert torch.cuda.device_count() >= dist.get_world_size()

torch.manual_seed(0)
g = torch.Generator().manual_seed(1)
x = torch.randn(128, 3, 8, 8, generator=g)
y = (x[:, 0].mean((1, 2)) > 0).long()
dataset = TensorDataset(x, y)
sampler = DistributedSampler(dataset, shuffle=True, seed=0)
loader = DataLoader(dataset, batch_size=16, sampler=sampler, pin_memory=True)

model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 8 * 8, 2)).to(device)
model = DDP(model, device_ids=[local_rank], output_device=local_rank)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
scaler = torch.amp.GradScaler("cuda")
for epoch in range(2):
    sampler.set_epoch(epoch)
    for xb, yb in loader:
        xb, yb = xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
        with torch.autocast(device_type="cuda", dtype=torch.float16):
            loss = F.cross_entropy(model(xb), yb)
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    if dist.get_rank() == 0:
        print(f"epoch {epoch} loss {loss.item():.4f}")

torch.save(
    {k: v.detach().cpu() for k, v in model.module.state_dict().items()},
    os.path.join(args.out, f"rank{dist.get_rank()}.pt"),
)
dist.barrier(device_ids=[local_rank])
dist.destroy_process_group()
