"""Model classes for tests/test_frameworks.py that a fresh interpreter must be able to import
(whole-model pickles are loaded there without nanopatch): plain torch, nothing else."""

import torch.nn.functional as F
from torch import nn


class PickleNet(nn.Module):
    """A small conv net with a Sigmoid head, as a binary classifier trained with BCELoss."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.Conv2d(8, 8, 3, padding=1),
        )
        self.fc = nn.Linear(8, 1)
        self.head = nn.Sigmoid()

    def forward(self, x):
        x = F.relu(self.features(x))
        return self.head(self.fc(x.mean((2, 3)))).squeeze(1)
