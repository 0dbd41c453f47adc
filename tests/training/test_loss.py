"""Cross-entropy over a large vocabulary in chunks (nanopatch.targets.training.loss): stock's loss and
gradients, taken only inside a paired model's training forward, stock everywhere else, gone
after unpatch; a language model computing its loss in its forward learns as stock."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import nanopatch
from nanopatch.targets.training import loss

from helpers.learning_oracle import learns_as_stock
from helpers.training_tasks import STEPS, loop

VOCAB = 5000


@pytest.fixture(autouse=True)
def _clean_state():
    nanopatch.unpatch_torch()
    yield
    nanopatch.unpatch_torch()


def _logits_and_targets(rows=300, classes=VOCAB, ignored=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(rows, classes, generator=g) * 3).requires_grad_()
    target = torch.randint(0, classes, (rows,), generator=g)
    if ignored:
        target[::ignored] = -100
    return logits, target


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("ignored", [0, 7, 1])  # none, every seventh, every row ignored
def test_chunked_cross_entropy_is_stocks_loss_and_gradient(reduction, ignored):
    logits, target = _logits_and_targets(ignored=ignored)
    stock = F.cross_entropy(logits, target, reduction=reduction)
    (stock_grad,) = torch.autograd.grad(stock * 1.7, logits)
    ours = loss.ChunkedCrossEntropy.apply(logits, target, -100, reduction == "mean")
    (our_grad,) = torch.autograd.grad(ours * 1.7, logits)
    torch.testing.assert_close(ours, stock, rtol=1e-6, atol=1e-6, equal_nan=True)
    torch.testing.assert_close(our_grad, stock_grad, rtol=1e-5, atol=1e-7, equal_nan=True)


class InForwardLM(nn.Module):
    """A language model that computes its loss in its own forward, as Hugging Face's do
    (``logits.float()``, then ``cross_entropy`` with ``ignore_index``), and returns both."""

    def __init__(self, vocab: int = VOCAB, width: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.mix = nn.Linear(width, width)
        self.head = nn.Linear(width, vocab)
        self.seen: list[str] = []

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor):
        logits = self.head(torch.relu(self.mix(self.embed(tokens))))
        value = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100)
        self.seen.append(type(value.grad_fn).__name__)
        return value, logits


def _batches(n=STEPS + 1):
    g = torch.Generator().manual_seed(3)
    out = []
    for _ in range(n):
        tokens = torch.randint(0, VOCAB, (4, 16), generator=g)
        labels = tokens.roll(-1, 1)
        labels[:, -1] = -100
        out.append((tokens, labels))
    return out


def test_a_model_computing_its_loss_in_its_forward_takes_it_and_learns_as_stock():
    models = []

    def train():
        model = InForwardLM()
        models.append(model)
        loop(model, torch.optim.AdamW(model.parameters(), lr=1e-2), _batches(), lambda m, b: m(*b)[0])

    learns_as_stock(train, options={"bf16": True}, min_steps=STEPS)
    stock, patched = models
    assert "ChunkedCrossEntropyBackward" not in stock.seen
    assert set(patched.seen) == {"ChunkedCrossEntropyBackward"}, patched.seen


def _under_autocast(logits, target, **kwargs):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return F.cross_entropy(logits.bfloat16(), target, **kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"weight": torch.rand(VOCAB)}, {"label_smoothing": 0.1}, {"reduction": "none"}],
)
def test_calls_it_does_not_take_are_autocasts_own(kwargs):
    """Outside a paired model's forward, and calls it does not cover anywhere: autocast's own
    kernel (the logits cast to fp32), to the bit."""
    logits, target = _logits_and_targets()
    stock = _under_autocast(logits, target, **kwargs)
    with nanopatch.patched(bf16=True, ipex=False):
        assert loss._installed
        patched = _under_autocast(logits, target, **kwargs)
    assert patched.dtype == stock.dtype == torch.float32
    assert type(patched.grad_fn) is type(stock.grad_fn)
    torch.testing.assert_close(patched, stock, rtol=0, atol=0)
    assert not loss._installed
