"""Model and data classes for tests/training/test_frameworks.py and the test scripts beside this file
that a fresh interpreter must be able to import (whole-model pickles are loaded there without
nanopatch): plain torch, nothing else."""

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset


class Sentences(Dataset):
    """Random token sequences whose first token (1 or 2) gives the label; a dict per item, as
    HF collators expect."""

    def __init__(self, n: int = 24, length: int = 16, vocab: int = 100) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(3, vocab, (n, length), generator=g)
        self.labels = torch.arange(n) % 2
        self.ids[:, 0] = 1 + self.labels

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "attention_mask": torch.ones_like(self.ids[i]), "labels": self.labels[i]}


def sentences_bert(transformers, **config):
    """A 2-layer BERT sequence classifier sized for :class:`Sentences` (100 tokens, sequences of
    16), built from a config (``transformers`` passed in: this module imports plain torch only);
    ``config`` adds to the config's arguments (its dropout, say)."""
    return transformers.BertForSequenceClassification(
        transformers.BertConfig(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            vocab_size=100,
            max_position_embeddings=32,
            **config,
        )
    )


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
