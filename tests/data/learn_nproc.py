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

from nanopatch.learning import Recorder

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--batch", type=int, default=32)
parser.add_argument("--epochs", type=int, default=3)
args = parser.parse_args()

torch.manual_seed(0)
g = torch.Generator().manual_seed(1)
n, width = 128, 32
X = torch.randn(n, 16, width, generator=g)
y = (X[:, :, :4].sum((1, 2)) > 0).long()
loader = DataLoader(TensorDataset(X, y), batch_size=args.batch, shuffle=False)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.TransformerEncoderLayer(width, 4, 2 * width, dropout=0.1, batch_first=True)
        self.head = nn.Linear(width, 2)

    def forward(self, x):
        return self.head(self.encoder(x).mean(1))


model = Net()
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
model.train()
with Recorder() as recorder:
    for _ in range(args.epochs):
        for xb, yb in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            optimizer.step()
rank = os.environ.get("RANK", "0")
with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
    json.dump({"steps": [s.as_dict() for s in recorder.steps], "world": os.environ.get("WORLD_SIZE", "1")}, f)
