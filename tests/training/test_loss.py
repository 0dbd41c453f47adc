"""Cross-entropy over a large vocabulary in chunks (nanopatch.targets.training.loss): stock's loss and
gradients, taken only inside a paired model's training forward, stock everywhere else, gone
after unpatch; a language model computing its loss in its forward learns as stock."""

from __future__ import annotations

import importlib

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import nanopatch
from nanopatch.targets.training import loss
from nanopatch.targets.training import patch as training

from helpers.learning_oracle import framework, learns_as_stock
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


@pytest.mark.parametrize("layout", ["contiguous", "strided", "bf16"])
def test_every_chunk_of_any_layout_gets_stocks_loss_and_gradient(layout, monkeypatch):
    """Many chunks (a few rows each, the last one short), logits as a strided view, and bf16
    logits read through the fp32 buffers: stock's loss and gradient (for bf16, stock's on the
    fp32 copy, rounded once into bf16)."""
    monkeypatch.setattr(loss, "CHUNK_ELEMENTS", 3 * VOCAB)
    monkeypatch.setattr(loss, "THREAD_ELEMENTS", 1)
    assert loss._rows(VOCAB) == 3
    logits, target = _logits_and_targets(rows=31)
    if layout == "strided":
        logits = logits.detach().t().contiguous().t().requires_grad_()
        assert not logits.is_contiguous()
    if layout == "bf16":
        logits = logits.detach().bfloat16().requires_grad_()
    reference = logits.detach().float().requires_grad_()
    stock = F.cross_entropy(reference, target)
    (stock_grad,) = torch.autograd.grad(stock * 1.3, reference)
    ours = loss.ChunkedCrossEntropy.apply(logits, target, -100, True, torch.float32)
    (our_grad,) = torch.autograd.grad(ours * 1.3, logits)
    assert our_grad.dtype == logits.dtype and our_grad.stride() == logits.stride()
    torch.testing.assert_close(ours, stock, rtol=1e-6, atol=1e-6)
    if layout == "bf16":
        stock_grad = stock_grad.bfloat16()
    torch.testing.assert_close(our_grad, stock_grad, rtol=1e-5, atol=1e-7)


class InForwardLM(nn.Module):
    """A language model that computes its loss in its own forward, as Hugging Face's do
    (``logits.float()``, then ``cross_entropy`` with ``ignore_index``), and returns both."""

    def __init__(self, vocab: int = VOCAB, width: int = 32, cast: bool = True) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.mix = nn.Linear(width, width)
        self.head = nn.Linear(width, vocab)
        self.cast = cast  # False: nanoGPT's way, the head's logits handed to cross_entropy as they are
        self.seen: list[str] = []
        self.dtypes: list[torch.dtype] = []
        self.inputs: list[str] = []

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor):
        logits = self.head(torch.relu(self.mix(self.embed(tokens))))
        self.dtypes.append(logits.dtype)
        scores = logits.float() if self.cast else logits
        value = F.cross_entropy(scores.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100)
        self.seen.append(type(value.grad_fn).__name__)
        self.inputs.append(type(value.grad_fn.next_functions[0][0]).__name__)  # what fed the loss
        assert value.dtype == torch.float32
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


@pytest.mark.parametrize("cast", [True, False], ids=["fp32-logits", "bf16-logits"])
def test_a_model_computing_its_loss_in_its_forward_takes_it_and_learns_as_stock(cast):
    models = []

    def train():
        model = InForwardLM(cast=cast)
        models.append(model)
        loop(model, torch.optim.AdamW(model.parameters(), lr=1e-2), _batches(), lambda m, b: m(*b)[0])

    learns_as_stock(train, options={"bf16": True}, min_steps=STEPS)
    stock, patched = models
    assert "ChunkedCrossEntropyBackward" not in stock.seen
    assert set(patched.seen) == {"ChunkedCrossEntropyBackward"}, patched.seen
    assert torch.bfloat16 in patched.dtypes
    if not cast:  # the bf16 logits reached it as they are: no cast of them all to fp32 before it
        assert "ToCopyBackward0" not in patched.inputs, patched.inputs


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


# --- transformers' causal-LM loss on the bf16 logits -------------------------------------------


def _loss_utils():
    framework("transformers")
    return importlib.import_module("transformers.loss.loss_utils")


def _bf16_logits(shape=(3, 20, VOCAB), seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * 3).bfloat16()


def _labels(shape=(3, 20), seed=1, ignored=(0, 5)):
    labels = torch.randint(0, VOCAB, shape, generator=torch.Generator().manual_seed(seed))
    labels[ignored] = -100
    return labels


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"num_items_in_batch": torch.tensor(41)},
        {"num_items_in_batch": 41},
        {"shift_labels": _labels(seed=2).roll(-1, 1).contiguous()},
        {"output_attentions": None, "output_hidden_states": False},  # what peft's forward passes on
    ],
)
def test_the_loss_on_bf16_logits_is_transformers_own(extra):
    """The same loss (fp32) and the same bf16 gradient as transformers' function, which copies the
    logits to fp32, from the bf16 logits themselves."""
    original = _loss_utils().ForCausalLMLoss
    signature = loss._signature(original)
    logits, labels = _bf16_logits(), _labels()
    theirs_in, ours_in = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    theirs = original(theirs_in, labels, vocab_size=VOCAB, **extra)
    ours = loss._on_logits(signature, (ours_in, labels), {"vocab_size": VOCAB, **extra})
    assert ours is not None and ours.dtype == theirs.dtype == torch.float32
    assert type(ours.grad_fn).__name__ != "ToCopyBackward0"
    (theirs * 2.5).backward()
    (ours * 2.5).backward()
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-6)
    assert ours_in.grad.dtype == theirs_in.grad.dtype == torch.bfloat16
    torch.testing.assert_close(ours_in.grad.float(), theirs_in.grad.float(), rtol=1 / 128, atol=1e-8)
    assert (ours_in.grad != theirs_in.grad).float().mean() < 1e-3  # one rounding apart, rarely


@pytest.mark.parametrize(
    "change",
    [
        lambda logits, labels: (logits.float(), labels, {}),  # fp32 logits: transformers' own
        lambda logits, labels: (logits.transpose(0, 1), labels.t(), {}),  # not contiguous
        lambda logits, labels: (logits[..., :64], labels, {}),  # fewer classes than MIN_CLASSES
        lambda logits, labels: (logits, labels, {"position_ids": torch.arange(20)}),  # unknown tensor argument
        lambda logits, labels: (logits, labels.int(), {}),  # int32 labels
    ],
)
def test_calls_the_bf16_loss_does_not_take_are_left_to_transformers(change):
    logits, labels, extra = change(_bf16_logits().requires_grad_(), _labels())
    vocab = logits.shape[-1]
    assert loss._on_logits(loss._signature(_loss_utils().ForCausalLMLoss), (logits, labels, vocab), extra) is None


def _small_gpt2(dropout: float = 0.0):
    transformers = framework("transformers")
    config = transformers.GPT2Config(
        n_layer=1, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=32,
        resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout,
    )  # fmt: skip
    return transformers.GPT2LMHeadModel(config)


def test_a_gpt2_takes_it_while_patched_and_transformers_gets_its_function_back():
    utils = _loss_utils()
    original = utils.LOSS_MAPPING["ForCausalLM"]
    torch.manual_seed(0)
    model = _small_gpt2()
    tokens = torch.randint(0, VOCAB, (2, 16))
    with nanopatch.patched(bf16=True, ipex=False, compile=False):
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        for _ in range(2):
            optimizer.zero_grad()
            out = model(input_ids=tokens, labels=tokens)
            out.loss.backward()
            optimizer.step()
        assert utils.LOSS_MAPPING["ForCausalLM"] is not original
        assert utils.LOSS_MAPPING["ForCausalLM"].__wrapped__ is original
        assert out.loss.dtype == out.logits.dtype == torch.float32  # types out as stock's
        assert type(out.loss.grad_fn).__name__ == "ChunkedCrossEntropyBackward"
        # (a model IPEX optimized in an earlier test of this process stays listed: IPEX's changes stay)
        [plan] = [m for m in nanopatch.status()["targets"]["training"]["details"] if m["model"] == type(model).__name__]
        assert plan["loss_on_bf16_logits"] is True
        assert "causal-LM loss on the bf16 logits" in training.plans[model].summary()
        with torch.no_grad():  # outside a training call: transformers' own
            assert type(model(input_ids=tokens, labels=tokens).loss.grad_fn) is type(None)
    assert utils.LOSS_MAPPING["ForCausalLM"] is original


def test_in_fp32_the_mapping_is_left_alone():
    utils = _loss_utils()
    original = utils.LOSS_MAPPING["ForCausalLM"]
    model = _small_gpt2()
    tokens = torch.randint(0, VOCAB, (2, 16))
    with nanopatch.patched(bf16=False, ipex=False, compile=False):
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
        model(input_ids=tokens, labels=tokens).loss.backward()
        optimizer.step()
        model(input_ids=tokens, labels=tokens).loss.backward()
        assert utils.LOSS_MAPPING["ForCausalLM"] is original
        [plan] = nanopatch.status()["targets"]["training"]["details"]
        assert plan["loss_on_bf16_logits"] is False


def test_a_loss_function_that_computes_something_else_keeps_it(monkeypatch):
    utils = _loss_utils()
    original = utils.ForCausalLMLoss

    def smoothed(logits, labels, vocab_size, num_items_in_batch=None, ignore_index=-100, shift_labels=None, **kwargs):
        return original(logits, labels, vocab_size, num_items_in_batch, ignore_index, shift_labels) * 1.01

    monkeypatch.setitem(utils.LOSS_MAPPING, "ForCausalLM", smoothed)
    monkeypatch.setattr(loss, "_checked", {})
    model = _small_gpt2()
    tokens = torch.randint(0, VOCAB, (2, 16))
    with nanopatch.patched(bf16=True, ipex=False, compile=False):
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
        for _ in range(2):
            model(input_ids=tokens, labels=tokens).loss.backward()
            optimizer.step()
        assert utils.LOSS_MAPPING["ForCausalLM"] is smoothed
        assert loss._checked == {smoothed: False}
    assert loss.same_loss(original, loss._signature(original))


def test_a_gpt2_with_its_loss_on_the_bf16_logits_learns_as_stock():
    tokens = torch.randint(0, VOCAB, (6, 4, 24), generator=torch.Generator().manual_seed(3))

    def train():
        model = _small_gpt2(dropout=0.1)
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        for batch in tokens:
            optimizer.zero_grad()
            model(input_ids=batch, labels=batch).loss.backward()
            optimizer.step()

    outcome = learns_as_stock(train, {"bf16": True, "ipex": False, "compile": False}, min_steps=len(tokens))
    assert [m["loss_on_bf16_logits"] for m in outcome.models] == [True]
