"""A plain training loop for tests/runner/test_verify.py: an MLP with dropout on shuffled data with a
random transform, several epochs, AdamW.

It prints, per batch, the sample indices and a CRC of the (randomly transformed) inputs,
so a test can see that both runs of ``--verify`` got the same data in the same order. When it
runs patched, it also draws from the global torch RNG after each forward, as fast dropout masks
do otherwise than stock's: the order must not depend on it.

Arguments: ``--workers N`` (DataLoader worker processes, default 0), ``--crash-patched-at K``
(the patched run raises at its K-th step), ``--epochs E`` (default 10).
"""

from __future__ import annotations

import argparse
import sys
import zlib

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Noisy(Dataset):
    """Fixed points of four classes; each item gets fresh noise from the global RNG."""

    def __init__(self, n: int = 32, features: int = 16) -> None:
        g = torch.Generator().manual_seed(1)
        self.labels = torch.arange(n) % 4
        self.points = torch.randn(n, features, generator=g) + 2 * nn.functional.one_hot(self.labels, features)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        return i, self.points[i] + 0.1 * torch.randn(self.points.shape[1]), self.labels[i]


class Stem(nn.Module):
    def __init__(self, features: int, hidden: int) -> None:
        super().__init__()
        self.linear = nn.Linear(features, hidden)
        self.dropout = nn.Dropout(0.2)

    def forward(self, x):
        return self.dropout(torch.relu(self.linear(x)))


def is_patched() -> bool:
    return "nanopatch" in sys.modules and sys.modules["nanopatch"].is_patched()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--crash-patched-at", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(Stem(16, 32), nn.Linear(32, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loader = DataLoader(Noisy(), batch_size=8, shuffle=True, num_workers=args.workers)
    print(f"patched: {is_patched()}", flush=True)
    step = 0
    for epoch in range(args.epochs):
        for index, x, y in loader:
            step += 1
            print(f"batch {epoch}.{step}: {index.tolist()} {zlib.crc32(x.numpy().tobytes()):08x}", flush=True)
            loss = nn.functional.cross_entropy(model(x), y)
            if is_patched():
                torch.rand(3)
            if step == args.crash_patched_at and is_patched():
                raise RuntimeError("a patched run that breaks")
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            print(f"loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
