"""A small convolutional training loop for the launcher's test of nanopatch's measured choices
under ``--nproc``: every rank writes what its training target decided (bf16 against fp32,
channels-last against stock's layout) to ``<--out>/<RANK>.json`` and its final weights to
``<RANK>.pt``. ``--own-ddp`` wraps the model in DistributedDataParallel itself, as a script
written for torchrun does."""

import argparse
import json
import os
import time

import torch
import torch.nn.functional as F
from torch import nn

import nanopatch

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--steps", type=int, default=60)
parser.add_argument("--own-ddp", action="store_true")
parser.add_argument("--slower", choices=["channels-last", "stock-layout"], help="make one layout's steps 30 ms slower")
parser.add_argument("--compile-soon", action="store_true", help="compile=auto tries compiling after 3 eager steps")
parser.add_argument("--compile-fails", action="store_true", help="torch.compile raises on rank 1")
args = parser.parse_args()
if args.compile_soon:
    from nanopatch.targets.training import compile_choice

    compile_choice.PRIOR_COMPILE_S, compile_choice.MIN_STEPS = 0.0, 3
if args.compile_fails and os.environ.get("RANK") == "1":

    def broken(*_args, **_kwargs):
        raise RuntimeError("this rank's compiler is broken")

    torch.compile = broken

torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(3, 16, 3, stride=2), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 4))
if args.slower:

    def slow(module, inputs):
        channels_last = not inputs[0].is_contiguous()
        if channels_last == (args.slower == "channels-last"):
            time.sleep(0.03)

    model[0].register_forward_pre_hook(slow)
if args.own_ddp:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    model = nn.parallel.DistributedDataParallel(model)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
g = torch.Generator().manual_seed(int(os.environ.get("RANK", "0")))
x, y = torch.randn(8, 3, 48, 48, generator=g), torch.randint(0, 4, (8,), generator=g)
for _ in range(args.steps):
    loss = F.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
plans = nanopatch.status()["targets"]["training"]["details"]
keys = ("bf16", "bf16_measured", "channels_last", "channels_last_measured", "data_parallel", "compile_choice", "notes")
chosen = [{key: plan.get(key) for key in keys} for plan in plans]
conv = (model.module if args.own_ddp else model)[0].weight
for plan in chosen:  # the layout the weights and the optimizer's state for them really have
    state = optimizer.state[conv]["momentum_buffer"]
    plan["weights_channels_last"] = [not t.is_contiguous() for t in (conv, state)]
name = os.environ.get("RANK", "single")
torch.save({k: v.detach().contiguous() for k, v in model.state_dict().items()}, os.path.join(args.out, f"{name}.pt"))
with open(os.path.join(args.out, f"{name}.json"), "w") as f:
    json.dump(chosen, f)
