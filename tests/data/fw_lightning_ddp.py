"""A Lightning script that knows nothing of nanopatch, for tests/training/test_frameworks.py: a LightningModule
wrapping a small conv net, trained by ``Trainer(accelerator="cpu", devices=2, strategy="ddp")`` for one
epoch. Run it as ``python -m nanopatch fw_lightning_ddp.py`` (Lightning starts the second process
itself) or ``python -m nanopatch --nproc 2 fw_lightning_ddp.py`` (Lightning's DDP runs over the two
processes nanopatch started).

Each rank writes ``<--out>/rank<R>.json`` (what it saw: the sample indices of its batches, and per
training forward the dtype its second convolution computed in and whether that convolution's input
was channels-last) and ``<--out>/rank<R>.pt`` (its final parameters)."""

import argparse
import json
import os

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--root", required=True, help="the Trainer's default_root_dir (logs and checkpoints)")
parser.add_argument("--samples", type=int, default=32)
parser.add_argument("--batch", type=int, default=4)
args = parser.parse_args()


class Images(Dataset):
    def __init__(self, n):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 3, 12, 12, generator=g)
        self.y = (self.x[:, 0].mean((1, 2)) > 0).long()

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i], i


class TinyNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.fc = nn.Linear(8, 2)

    def forward(self, x):
        x = F.relu(self.bn(self.conv1(x)))
        x = F.relu(self.conv2(x))
        return self.fc(x.mean((2, 3)))


def is_channels_last(t):
    return t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous()


class Classifier(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.model = TinyNet()
        self.seen = []
        self.probe = []
        self.model.conv2.register_forward_hook(self._probe)

    def _probe(self, module, inputs, output):
        if torch.is_grad_enabled() and module.training:
            self.probe.append({"dtype": str(output.dtype), "channels_last": is_channels_last(inputs[0])})

    def training_step(self, batch, batch_idx):
        x, y, index = batch
        self.seen += index.tolist()
        loss = F.cross_entropy(self.model(x), y)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


if __name__ == "__main__":
    pl.seed_everything(0)
    model = Classifier()
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=1,
        default_root_dir=args.root,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, DataLoader(Images(args.samples), batch_size=args.batch, shuffle=True))
    rank = trainer.global_rank
    os.makedirs(args.out, exist_ok=True)
    params = {name: p.detach().clone().contiguous() for name, p in model.model.named_parameters()}
    torch.save(params, os.path.join(args.out, f"rank{rank}.pt"))
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump(
            {
                "rank": rank,
                "world_size": trainer.world_size,
                "global_step": trainer.global_step,
                "seen": model.seen,
                "probe": model.probe,
                "pid": os.getpid(),
            },
            f,
        )
