"""A Lightning script for tests/runner/test_verify.py: automatic optimization (Lightning runs the forward
and backward inside ``optimizer.step(closure)``), a small convolutional classifier with dropout,
shuffled data, more steps than ``--verify`` asks for."""

from __future__ import annotations

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Classifier(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.model = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(4),
            nn.Flatten(),
            nn.Dropout(0.2),
            nn.Linear(128, 4),
        )

    def training_step(self, batch, batch_index):
        x, y = batch
        loss = nn.functional.cross_entropy(self.model(x), y)
        self.log("loss", loss, prog_bar=False)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-2)


def main() -> None:
    pl.seed_everything(0)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(64, 3, 16, 16, generator=g), torch.randint(0, 4, (64,), generator=g)
    x += y.view(-1, 1, 1, 1)
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=100,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Classifier(), loader)


if __name__ == "__main__":
    main()
