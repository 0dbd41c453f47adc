"""Training loops, models and data the training tests share: the short loop, the transformer
language model and the checkpointed residual MLP the learning tests run stock and patched, and a
small CNN task with a known answer whose test accuracy a bf16 run must reach."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

#: optimizer steps per run (the issue's "loss within 5% at step 12")
STEPS = 12


def loop(model: nn.Module, optimizer: torch.optim.Optimizer, batches, loss_of, steps: int = STEPS) -> None:
    model.train()
    for step in range(steps):
        batch = batches[step % len(batches)]
        optimizer.zero_grad()
        loss = loss_of(model, batch)
        loss.backward()
        optimizer.step()


class TransformerLM(nn.Module):
    def __init__(self, vocab: int = 512, width: int = 64, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        layer = nn.TransformerEncoderLayer(width, 4, 2 * width, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(tokens.shape[1])
        return self.head(self.encoder(self.embed(tokens), mask=mask, is_causal=True))


def lm_batches(vocab: int = 512, n: int = 3, batch: int = 8, length: int = 33) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, vocab, (batch, length), generator=g) for _ in range(n)]


def lm_loss(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


# --- a residual MLP, its blocks checkpointed or not (the checkpointing tests)


class Block(nn.Module):
    def __init__(self, width: int = 128) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)
        self.drop = nn.Dropout(0.3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.drop(self.down(F.relu(self.up(self.norm(x)))))


class ResidualMLP(nn.Module):
    def __init__(self, checkpointing: str | None) -> None:
        super().__init__()
        self.stem = nn.Linear(128, 128)  # the blocks' input requires grad (reentrant checkpointing needs it)
        self.blocks = nn.ModuleList(Block() for _ in range(3))
        self.head = nn.Linear(128, 10)
        self.checkpointing = checkpointing

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            if self.checkpointing is None:
                x = block(x)
            else:
                x = checkpoint(block, x, use_reentrant=self.checkpointing == "reentrant")
        return self.head(x)


# --- a task with a known answer (test_training_numerics, test_training_ipex, test_training_fast_paths)


def shifted_templates_task(seed=0, n_train=2048, n_test=1024, noise=0.6):
    """Ten classes of smooth 16x16 patterns, randomly shifted, under Gaussian noise: a task
    with a known answer that a small CNN learns to ~80% in a few epochs (not a trivial 100%)."""
    g = torch.Generator().manual_seed(seed)
    templates = F.avg_pool2d(torch.randn(10, 1, 16, 16, generator=g), 5, stride=1, padding=2) * 2

    def sample(n):
        labels = torch.randint(0, 10, (n,), generator=g)
        shifts = torch.randint(-2, 3, (n, 2), generator=g).tolist()
        pairs = zip(labels.tolist(), shifts, strict=True)
        images = torch.stack([torch.roll(templates[c], s, (1, 2)) for c, s in pairs])
        return images + noise * torch.randn(images.shape, generator=g), labels

    return sample(n_train), sample(n_test)


def small_net() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, 10),
    )


def train_and_score(data, epochs=5, make_model=None, make_optimizer=None) -> float:
    """Train a fresh model (``small_net`` and SGD unless given) on ``data`` from seed 0 in
    batches of 64; its test accuracy in %."""
    (x_train, y_train), (x_test, y_test) = data
    torch.manual_seed(0)
    model = (make_model or small_net)()
    if make_optimizer is None:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    else:
        optimizer = make_optimizer(model.parameters())
    for epoch in range(epochs):
        model.train()
        order = torch.randperm(len(x_train), generator=torch.Generator().manual_seed(epoch))
        for i in range(0, len(x_train), 64):
            batch = order[i : i + 64]
            optimizer.zero_grad()
            F.cross_entropy(model(x_train[batch]), y_train[batch]).backward()
            optimizer.step()
    model.eval()
    with torch.no_grad():
        return (model(x_test).argmax(1) == y_test).float().mean().item() * 100


class LeNet(nn.Module):
    """The classic: ``x.view(-1, 16 * 5 * 5)`` after the convolutions, which channels-last
    strides do not allow (``view`` cannot flatten channels with rows; ``reshape`` copies)."""

    def __init__(self, views_in_eval_only: bool = False) -> None:
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(3, 6, 5), nn.Conv2d(6, 16, 5)
        self.f1, self.f2 = nn.Linear(16 * 5 * 5, 32), nn.Linear(32, 4)
        self.views_in_eval_only = views_in_eval_only

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.c2(F.max_pool2d(F.relu(self.c1(x)), 2))), 2)
        x = x.reshape(-1, 16 * 5 * 5) if self.training and self.views_in_eval_only else x.view(-1, 16 * 5 * 5)
        return self.f2(F.relu(self.f1(x)))
