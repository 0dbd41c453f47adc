"""A small deterministic training script that knows nothing of torch.distributed, for the
launcher tests: run alone, or under ``python -m nanopatch --nproc N``. It writes what it saw
(and its final weights) to ``<--out>/<rank>.pt``."""

import argparse
import os

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--batch", type=int, default=4)
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--shuffle", action="store_true")
parser.add_argument("--lr", type=float, default=0.1)
parser.add_argument("--lr-factors", default="", help="reference runs: the lr multiplier of each step")
parser.add_argument("--own-ddp", action="store_true", help="do distributed training itself")
parser.add_argument("--fail-rank", type=int, default=-1)
parser.add_argument("--exit-code", type=int, default=0)
parser.add_argument("--sys-exit", action="store_true", help="end with sys.exit(0), as sys.exit(main()) does")
parser.add_argument("--report-listening", action="store_true", help="rank 0: what the job listens on")
args = parser.parse_args()

rank = os.environ.get("RANK", "single")
print(f"hello from rank {rank}", flush=True)
if rank == str(args.fail_rank):
    if args.exit_code:
        raise SystemExit(args.exit_code)
    raise ValueError(f"rank {rank} is broken")

torch.manual_seed(0)
n = 64
X = torch.randn(n, 10)
y = (X[:, :5].sum(1) > X[:, 5:].sum(1)).long()
train = TensorDataset(X, y, torch.arange(n))
val = TensorDataset(X[:20], y[:20], torch.arange(20))
sampler = None
if args.own_ddp:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    sampler = torch.utils.data.DistributedSampler(train, shuffle=args.shuffle)
generator = torch.Generator().manual_seed(1)
train_loader = DataLoader(
    train, batch_size=args.batch, shuffle=args.shuffle and sampler is None, sampler=sampler, generator=generator
)
val_loader = DataLoader(val, batch_size=5)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(10, 16)
        self.b = nn.Linear(16, 2)
        self.unused = nn.Linear(3, 3)  # a parameter the forward never uses

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


model = Net()
if args.own_ddp:
    model = nn.parallel.DistributedDataParallel(model, find_unused_parameters=True)
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
factors = [float(f) for f in args.lr_factors.split(",") if f]
epochs, lrs_seen, val_seen, step = [], set(), [], 0
for epoch in range(args.epochs):
    if sampler is not None:
        sampler.set_epoch(epoch)
    model.train()
    seen = []
    for xb, yb, idx in train_loader:
        seen += idx.tolist()
        if factors:
            for group in optimizer.param_groups:
                group["lr"] = args.lr * factors[step]
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        optimizer.step()
        lrs_seen.add(optimizer.param_groups[0]["lr"])
        step += 1
    epochs.append(seen)
    model.eval()
    with torch.no_grad():
        for xb, _, idx in val_loader:
            val_seen += idx.tolist()
            model(xb)
print(f"final loss {loss.item():.6f}", flush=True)

import nanopatch  # noqa: E402  (only to report what nanopatch did; absent in stock runs)

state = (model.module if args.own_ddp else model).state_dict()
torch.save(
    {
        "state": state,
        "epochs": epochs,
        "val": val_seen,
        "batches": len(train_loader),
        "sampler": type(train_loader.sampler).__name__,
        "lrs": sorted(lrs_seen),
        "steps": step,
        "cpus": sorted(os.sched_getaffinity(0)),
        "threads": torch.get_num_threads(),
        "omp": os.environ.get("OMP_NUM_THREADS"),
        "status": nanopatch.status()["targets"].get("distributed", {}).get("details"),
    },
    os.path.join(args.out, f"{rank}.pt"),
)
if args.report_listening and rank == "0":
    import json

    from helpers.listening import children, listening

    launcher = os.getppid()  # torchrun's agent, in the runner's process
    pids = {launcher, *children(launcher)}
    with open(os.path.join(args.out, "listening.json"), "w") as f:
        json.dump({"pids": sorted(pids), "listening": listening(pids)}, f)
if args.sys_exit:
    import atexit
    import sys

    import torch.distributed as dist

    def _group_at_exit() -> None:
        # what the interpreter's shutdown finds: a group still up is torn down by it, in whatever
        # order, where gloo's threads can abort the process
        with open(os.path.join(args.out, f"{rank}.exit"), "w") as f:
            f.write("up" if dist.is_initialized() else "down")

    atexit.register(_group_at_exit)
    sys.exit(0)
