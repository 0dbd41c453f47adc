"""A checkpoint round trip written for a CUDA GPU: train on "cuda", save, load back with
``map_location="cuda:0"`` (and the other forms scripts use), resume. ``--gpu-checkpoint FILE``
also loads a checkpoint whose tensors were saved on a GPU (``cuda:0``) and prints its sum."""

import argparse
import os
import tempfile

import torch
import torch.nn.functional as F
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--gpu-checkpoint")
args = parser.parse_args()

torch.manual_seed(0)
device = torch.device("cuda:0")
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)).to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
scaler = torch.amp.GradScaler("cuda")
x, y = torch.randn(32, 8, device="cuda"), torch.randint(0, 2, (32,), device="cuda")
for _ in range(3):
    with torch.autocast(device_type="cuda", dtype=torch.float16):
        loss = F.cross_entropy(model(x), y)
    optimizer.zero_grad()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()

with tempfile.TemporaryDirectory() as folder:
    path = os.path.join(folder, "ckpt.pt")
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "scaler": scaler.state_dict()}, path)
    for where in ("cuda:0", torch.device("cuda"), {"cuda:0": "cuda:0"}, lambda storage, loc: storage.cuda(0)):
        checkpoint = torch.load(path, map_location=where)
        restored = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)).cuda()
        restored.load_state_dict(checkpoint["model"])
        resumed = torch.optim.Adam(restored.parameters(), lr=1e-2)
        resumed.load_state_dict(checkpoint["optimizer"])
        resumed_scaler = torch.cuda.amp.GradScaler()
        resumed_scaler.load_state_dict(checkpoint["scaler"])
        for a, b in zip(model.parameters(), restored.parameters(), strict=True):
            assert torch.equal(a, b), "restored weights differ"
        assert resumed_scaler.state_dict() == scaler.state_dict()
    print("checkpoint round trip ok:", type(where).__name__, next(restored.parameters()).device)

if args.gpu_checkpoint:
    state = torch.load(args.gpu_checkpoint, map_location="cuda:0")
    print(f"gpu checkpoint sum {sum(float(t.sum()) for t in state.values()):.4f}")
    state = torch.load(args.gpu_checkpoint)
    print(f"gpu checkpoint default {sum(float(t.sum()) for t in state.values()):.4f}")
