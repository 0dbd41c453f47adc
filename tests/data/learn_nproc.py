"""A training script that knows nothing of torch.distributed, for the learning oracle's
``--nproc`` case: run alone, or under ``python -m nanopatch --nproc N``. It records each
optimizer step (nanopatch.learning.Recorder) and writes them to ``<--out>/rank<RANK>.json``."""

import argparse
import json
import os

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import nanopatch
from nanopatch.learning import Recorder

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--batch", type=int, default=32)
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--conv", action="store_true", help="a small convolutional net on images instead")
parser.add_argument("--own-ddp", action="store_true", help="its own process group, sampler and DDP (torchrun-style)")
parser.add_argument("--sparse", action="store_true", help="a recommender with a sparse embedding bag, SGD")
parser.add_argument("--shuffle", action="store_true", help="a shuffling loader (sharded under --nproc whatever trains)")
args = parser.parse_args()
ddp = args.own_ddp and int(os.environ.get("WORLD_SIZE", "1")) > 1
if ddp:
    import torch.distributed as dist
    from torch.utils.data.distributed import DistributedSampler

    dist.init_process_group("gloo")

torch.manual_seed(0)
g = torch.Generator().manual_seed(1)
n, width = 128, 32
if args.sparse:  # item ids; the class: whether the first item is in the lower half
    X = torch.randint(0, 200, (n, 4), generator=g)
    y = (X[:, 0] < 100).long()
elif args.conv:
    X = torch.randn(n, 3, 16, 16, generator=g)
    y = (X[:, 0].mean((1, 2)) > 0).long()
else:
    X = torch.randn(n, 16, width, generator=g)
    y = (X[:, :, :4].sum((1, 2)) > 0).long()
data = TensorDataset(X, y)
# a rank's batch k holds every other sample of the one-process batch k (of twice its size)
sampler = DistributedSampler(data, shuffle=False) if ddp else None
loader = DataLoader(data, batch_size=args.batch, shuffle=args.shuffle and sampler is None, sampler=sampler)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.TransformerEncoderLayer(width, 4, 2 * width, dropout=0.1, batch_first=True)
        self.head = nn.Linear(width, 2)

    def forward(self, x):
        return self.head(self.encoder(x).mean(1))


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, stride=2))
        self.head = nn.Linear(16, 2)

    def forward(self, x):
        return self.head(self.features(x).mean((2, 3)))


class Recommender(nn.Module):
    """Its embedding's gradients are sparse tensors (gloo sums them across the processes)."""

    def __init__(self):
        super().__init__()
        self.embed = nn.EmbeddingBag(200, width, mode="mean", sparse=True)
        self.head = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 2))

    def forward(self, ids):
        return self.head(self.embed(ids))


model = Recommender() if args.sparse else ConvNet() if args.conv else Net()
trained = nn.parallel.DistributedDataParallel(model) if ddp else model
if args.sparse:  # AdamW takes no sparse gradients
    optimizer = torch.optim.SGD(trained.parameters(), lr=0.5)
else:
    optimizer = torch.optim.AdamW(trained.parameters(), lr=3e-3)
trained.train()
with Recorder() as recorder:
    for _ in range(args.epochs):
        for xb, yb in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(trained(xb), yb)
            loss.backward()
            optimizer.step()
rank = os.environ.get("RANK", "0")
with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
    plans = nanopatch.status()["targets"].get("training", {}).get("details") or [] if nanopatch.is_patched() else []
    notes = [note for plan in plans for note in plan.get("notes", [])]
    world = os.environ.get("WORLD_SIZE", "1")
    weights = float(sum(p.detach().double().sum() for p in model.parameters()))
    json.dump({"steps": [s.as_dict() for s in recorder.steps], "world": world, "notes": notes, "weights": weights}, f)
