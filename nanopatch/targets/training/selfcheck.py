"""Fast paths that check themselves on the running torch before they are trusted.

Every fast path that reaches into autograd or the dispatcher runs a tiny gradient-flow probe
against the stock path the first time it is about to be used in a process:

* ``fast_dropout``: the mask kernel of :mod:`.dropout`, with the operators transformers and
  convolutional nets run around dropout (embedding, layer norm, attention, linear, GELU,
  convolution, batch norm); and, the first time activation checkpointing is used inside a mask
  region, its replays (reentrant and not) of a forward that drew fast masks;
* ``forward``: the instance forward of :mod:`.forward` (bf16 autocast, channels-last inputs,
  outputs back in fp32);
* ``step``: torch's fused or foreach step for one optimizer class and its settings;
* ``ipex``: IPEX's ``optimize`` and fused step for one optimizer class and dtype.

The probe and the stock path must agree: the same parameters get a gradient, none inf or nan,
and losses, gradients or updated weights within the fast path's own tolerance. When they
disagree (or the probe cannot run), that fast path stays off for the rest of the process, a
:class:`~nanopatch.NanopatchWarning` says so once, and ``status()`` lists it: a torch nanopatch
has never seen then loses speed, never learning.

A probe runs in a thread of its own, so nothing of the caller's thread leaks into it (autocast,
saved-tensor hooks of an activation checkpoint, dispatch modes, nanopatch's own per-thread
state), with nanopatch's model search and :class:`nanopatch.learning.Recorder` told to ignore
it, and the global RNG state restored afterwards. Its models are functional (no module hooks
fire), except IPEX's, which must be modules.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from nanopatch.foundation import learning
from nanopatch.foundation.log import warn_once

from .plan import local

#: key -> {"fast_path", "key", "passed", "detail"}, one entry per probe run in this process
_results: dict[str, dict[str, Any]] = {}
_running: set[str] = set()
_lock = threading.Lock()


def results() -> list[dict[str, Any]]:
    """Every probe run in this process (for ``status()``)."""
    with _lock:
        return [dict(result) for result in _results.values()]


def forget() -> None:
    """Forget every result, and turn back on what a failed probe turned off (tests)."""
    from . import dropout

    with _lock:
        _results.clear()
    dropout.disabled[0] = False


def check(fast_path: str, key: str, probe: Callable[[], str | None], what: str) -> bool:
    """Whether the fast path may be used: ``probe()`` returns None when it agrees with stock,
    else why not. Run once per process per ``key``; while it runs, other callers (other
    threads, or a probe that reaches the same fast path) get False: the stock path."""
    with _lock:
        found = _results.get(key)
        if found is not None:
            return found["passed"]
        if key in _running:
            return False
        _running.add(key)
    try:
        detail = _isolated(probe)
    finally:
        with _lock:
            _running.discard(key)
    passed = detail is None
    with _lock:
        _results[key] = {"fast_path": fast_path, "key": key, "passed": passed, "detail": detail or "agrees with stock"}
    if not passed:
        warn_once(
            f"selfcheck-{key}",
            f"nanopatch: {what} turned off: on torch {torch.__version__} its gradient-flow self-check disagreed "
            f"with stock ({detail}); training goes on without it",
            stacklevel=3,
        )
    return passed


def _isolated(probe: Callable[[], str | None]) -> str | None:
    outcome: list[str | None] = []

    def run() -> None:
        local.busy = 1  # nanopatch's model search and step hooks ignore this thread
        try:
            with learning.internal(), torch.enable_grad():
                outcome.append(probe())
        except Exception as exc:  # a probe that cannot run cannot vouch for its fast path
            outcome.append(f"the probe failed: {type(exc).__name__}: {exc}")

    state = torch.get_rng_state()
    # the probes build their tensors in fp32, the dtype they vouch for, whatever default the
    # script set (torch.set_default_dtype(torch.float64), a scientific script's first line); the
    # default is the process's, and the calling thread waits for the probe's
    default = torch.get_default_dtype()
    try:
        torch.set_default_dtype(torch.float32)
        thread = threading.Thread(target=run, name="nanopatch-selfcheck", daemon=True)
        thread.start()
        thread.join()
    finally:
        torch.set_default_dtype(default)
        torch.set_rng_state(state)
    return outcome[0] if outcome else "the probe did not finish"


# --- comparing -------------------------------------------------------------------------


def _gradient_problem(
    names: list[str], stock: list[torch.Tensor | None], fast: list[torch.Tensor | None]
) -> str | None:
    missing = [n for n, s, f in zip(names, stock, fast, strict=True) if s is not None and f is None]
    if missing:
        return f"{len(missing)} of {len(names)} parameters got no gradient ({', '.join(missing)})"
    extra = [n for n, s, f in zip(names, stock, fast, strict=True) if s is None and f is not None]
    if extra:
        return f"{', '.join(extra)} got a gradient stock does not give"
    bad = [n for n, f in zip(names, fast, strict=True) if f is not None and not bool(torch.isfinite(f).all())]
    if bad:
        return f"inf or nan in the gradient of {', '.join(bad)}"
    return None


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().float(), b.detach().float()
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


# --- fast dropout ----------------------------------------------------------------------

_WIDTH, _SEQ, _BATCH, _HEADS = 64, 32, 4, 4


def _dropout_parameters() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1234)

    def p(*shape: int, scale: float = 0.1) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * scale).requires_grad_()

    return {
        "embed": p(64, _WIDTH, scale=1.0),
        "norm1.weight": (1 + p(_WIDTH)).detach().requires_grad_(),
        "norm1.bias": p(_WIDTH),
        "qkv": p(3 * _WIDTH, _WIDTH),
        "proj": p(_WIDTH, _WIDTH),
        "norm2.weight": (1 + p(_WIDTH)).detach().requires_grad_(),
        "norm2.bias": p(_WIDTH),
        "up": p(2 * _WIDTH, _WIDTH),
        "down": p(_WIDTH, 2 * _WIDTH),
        "conv": p(8, 3, 3, 3),
        "bn.weight": (1 + p(8)).detach().requires_grad_(),
        "bn.bias": p(8),
        "head": p(10, _WIDTH + 8),
    }


def _dropout_loss(params: dict[str, torch.Tensor], checkpointing: str | None) -> torch.Tensor:
    from torch.utils.checkpoint import checkpoint

    g = torch.Generator().manual_seed(99)
    tokens = torch.randint(0, 64, (_BATCH, _SEQ), generator=g)
    images = torch.randn(_BATCH, 3, 32, 32, generator=g)
    labels = torch.randint(0, 10, (_BATCH,), generator=g)

    def block(x: torch.Tensor) -> torch.Tensor:
        h = F.layer_norm(x, (_WIDTH,), params["norm1.weight"], params["norm1.bias"])
        q, k, v = F.linear(h, params["qkv"]).view(_BATCH, _SEQ, 3, _HEADS, _WIDTH // _HEADS).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(q, k, v, dropout_p=0.2, is_causal=True)
        x = x + F.dropout(F.linear(attended.transpose(1, 2).reshape(_BATCH, _SEQ, _WIDTH), params["proj"]), 0.2)
        h = F.layer_norm(x, (_WIDTH,), params["norm2.weight"], params["norm2.bias"])
        return x + F.dropout(F.linear(F.gelu(F.linear(h, params["up"])), params["down"]), 0.2)

    x = F.embedding(tokens, params["embed"])
    if checkpointing is None:
        x = block(x)
    else:
        x = checkpoint(block, x, use_reentrant=checkpointing == "reentrant")
    y = F.conv2d(images, params["conv"], padding=1)
    y = F.dropout(F.relu(F.batch_norm(y, None, None, params["bn.weight"], params["bn.bias"], training=True)), 0.2)
    features = torch.cat([x.mean(1), y.mean((2, 3))], dim=1)
    return F.cross_entropy(F.linear(features, params["head"]).float(), labels)


def _dropout_run(dtype: torch.dtype | None, fast: bool, checkpointing: str | None) -> tuple[list, bool]:
    from . import dropout

    params = _dropout_parameters()
    torch.manual_seed(7)
    region = dropout.region() if fast else None
    autocast = torch.autocast("cpu", dtype=dtype) if dtype is not None else torch.autocast("cpu", enabled=False)
    with autocast:
        if region is not None:
            with region:
                loss = _dropout_loss(params, checkpointing)
        else:
            loss = _dropout_loss(params, checkpointing)
    loss.backward()  # outside the region, as a user's backward is: replays must restore it
    return [p.grad for p in params.values()], bool(region is not None and region.fast)


def probe_fast_dropout(dtype: torch.dtype | None) -> str | None:
    """The mask kernel against stock's masks: the same parameters get gradients."""
    names = list(_dropout_parameters())
    stock, _ = _dropout_run(dtype, fast=False, checkpointing=None)
    fast, drew = _dropout_run(dtype, fast=True, checkpointing=None)
    if not drew:
        return "no mask was drawn fast inside the region"
    problem = _gradient_problem(names, stock, fast)
    if problem is not None:
        return problem
    zero = [n for n, grad in zip(names, fast, strict=True) if grad is not None and not bool(grad.ne(0).any())]
    if zero:
        return f"the gradient of {', '.join(zero)} is all zeros"
    return None


def probe_replay(dtype: torch.dtype | None) -> str | None:
    """Activation checkpointing's replays (reentrant and not) of a forward that drew fast masks,
    against the same fast run without checkpointing."""
    from torch.utils.checkpoint import CheckpointError

    names = list(_dropout_parameters())
    fast, _ = _dropout_run(dtype, fast=True, checkpointing=None)
    plain = torch.cat([grad.float().flatten() for grad in fast])
    for checkpointing, limit in (("non-reentrant", 1e-6), ("reentrant", 0.05)):
        try:
            replayed, _ = _dropout_run(dtype, fast=True, checkpointing=checkpointing)
        except CheckpointError:  # the replay took another path (stock attention) than the forward
            return f"{checkpointing} checkpointing changes its gradients (its replay recomputes other tensors)"
        problem = _gradient_problem(names, fast, replayed)
        if problem is not None:
            return f"under {checkpointing} checkpointing, {problem}"
        difference = _relative(torch.cat([grad.float().flatten() for grad in replayed]), plain)
        if difference > limit:
            return f"{checkpointing} checkpointing changes its gradients by {difference:.1%}"
    return None


def _dtype_name(dtype: torch.dtype | None) -> str:
    return "bf16" if dtype is not None else "fp32"


def fast_dropout_ok(dtype: torch.dtype | None) -> bool:
    key = f"fast_dropout/{_dtype_name(dtype)}"
    return check("fast_dropout", key, lambda: probe_fast_dropout(dtype), "fast dropout masks")


def replay_ok(dtype: torch.dtype | None) -> bool:
    """Run where checkpointing is first used inside a mask region (it imports what the probe
    needs, so a script that never checkpoints never pays for it)."""
    key = f"fast_dropout/replay/{_dtype_name(dtype)}"
    return check("fast_dropout", key, lambda: probe_replay(dtype), "fast dropout masks")


# --- the instance forward --------------------------------------------------------------


class _ForwardProbe(nn.Module):
    """A convolution, batch norm and linear head, written functionally (no submodule calls)."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(4321)
        self.conv = nn.Parameter(torch.randn(8, 3, 3, 3, generator=g) * 0.3)
        self.bn_weight = nn.Parameter(torch.ones(8))
        self.bn_bias = nn.Parameter(torch.zeros(8))
        self.fc = nn.Parameter(torch.randn(10, 8, generator=g) * 0.3)
        self.fc_bias = nn.Parameter(torch.zeros(10))

    def forward(self, x: torch.Tensor, as_dict: bool = False) -> Any:
        y = F.batch_norm(F.conv2d(x, self.conv, padding=1), None, None, self.bn_weight, self.bn_bias, training=True)
        logits = F.linear(F.relu(y).mean((2, 3)), self.fc, self.fc_bias)
        return {"logits": logits} if as_dict else logits


def probe_forward(dtype: torch.dtype | None, rank: int | None) -> str | None:
    """nanopatch's instance forward against the model's own forward in fp32: outputs handed
    back in fp32, the same parameters get gradients, the loss and gradients within bf16's
    rounding."""
    from . import forward as fw
    from . import memory_format as mf
    from .plan import Plan

    g = torch.Generator().manual_seed(11)
    x, labels = torch.randn(8, 3, 16, 16, generator=g), torch.randint(0, 10, (8,), generator=g)
    # the probe's convolution is 2-D: a model with 3-D ones (rank 5) is vouched for by the same
    # machinery in channels-last of rank 4 (its key, "channels-last", is shared by both ranks)
    rank = None if rank is None else 4

    def run(accelerated: bool) -> tuple[torch.Tensor, list]:
        model = _ForwardProbe()
        call: Any = model.forward
        if accelerated:
            if rank is not None:
                model.to(memory_format=mf.memory_format(rank))
            call = fw.AcceleratedForward(model, Plan(name="self-check", amp_dtype=dtype, rank=rank))
        outputs = [call(x), call(x, as_dict=True)["logits"]]  # a tensor, and one in a container
        if any(out.dtype != torch.float32 for out in outputs):
            raise TypeError(f"an output came back in {[out.dtype for out in outputs]}, not float32")
        loss = sum(F.cross_entropy(out, labels) for out in outputs)
        loss.backward()
        return loss.detach(), [p.grad for p in model.parameters()]

    names = [n for n, _ in _ForwardProbe().named_parameters()]
    stock_loss, stock = run(False)
    loss, fast = run(True)
    problem = _gradient_problem(names, stock, fast)
    if problem is not None:
        return problem
    if _relative(loss, stock_loss) > 0.02:
        return f"the loss is {_relative(loss, stock_loss):.1%} from stock's"
    for name, s, f in zip(names, stock, fast, strict=True):
        if s is not None and f is not None and _relative(f, s) > 0.1:
            return f"the gradient of {name} is {_relative(f, s):.0%} from stock's"
    return None


def forward_ok(dtype: torch.dtype | None, rank: int | None) -> bool:
    key = f"forward/{'bf16' if dtype is not None else 'fp32'}/{'channels-last' if rank else 'as-is'}"
    return check("forward", key, lambda: probe_forward(dtype, rank), "nanopatch's accelerated forward")


# --- optimizer steps -------------------------------------------------------------------

_UNSET_FLAGS = ("foreach", "fused", "capturable", "differentiable")


def _settings(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's settings its constructor takes, without the step-path flags."""
    import inspect

    try:
        accepted = set(inspect.signature(type(optimizer).__init__).parameters)
    except (TypeError, ValueError):
        accepted = set(optimizer.defaults)
    return {k: v for k, v in optimizer.defaults.items() if k in accepted and k not in _UNSET_FLAGS}


def probe_step(cls: type, settings: dict[str, Any], flag: str) -> str | None:
    """Three steps with ``flag`` on against the same three with the single-tensor loop."""
    g = torch.Generator().manual_seed(5)
    start = [torch.randn(17, generator=g), torch.randn(5, 7, generator=g), torch.randn(3, 4, 4, generator=g)]
    grads = [[torch.randn(p.shape, generator=g) for p in start] for _ in range(3)]

    def run(fast: bool) -> list[torch.Tensor]:
        params = [p.clone().requires_grad_() for p in start]
        optimizer = cls(params, **settings, **({flag: True} if fast else {"foreach": False}))
        for step in grads:
            for p, grad in zip(params, step, strict=True):
                p.grad = grad.clone()
            optimizer.step()
        return [p.detach() for p in params]

    stock, fast = run(False), run(True)
    for i, (s, f, before) in enumerate(zip(stock, fast, start, strict=True)):
        if torch.equal(s, before) != torch.equal(f, before):
            return f"parameter {i} was {'not ' if torch.equal(f, before) else ''}updated, unlike stock"
        if not torch.allclose(f, s, rtol=1e-4, atol=1e-6):
            return f"parameter {i} is {_relative(f, s):.2%} from stock's after three steps"
    return None


def step_ok(optimizer: torch.optim.Optimizer, flag: str) -> bool:
    cls, settings = type(optimizer), _settings(optimizer)
    key = f"step/{cls.__name__}/{flag}/{sorted((k, repr(v)) for k, v in settings.items())}"
    return check("step", key, lambda: probe_step(cls, settings, flag), f"the {flag} {cls.__name__} step")


# --- IPEX ------------------------------------------------------------------------------


class _IpexProbe(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.mlp = nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, 8))
        self.head = nn.Linear(16, 10)

    def forward(self, images: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        return self.head(torch.cat([self.conv(images).mean((2, 3)), self.mlp(features)], dim=1))


def probe_ipex(cls: type, settings: dict[str, Any], bf16: bool) -> str | None:
    """``ipex.optimize`` and IPEX's step against the same model and optimizer written by hand
    (``torch.autocast`` for bf16), three steps."""
    from . import ipex as ipex_mod

    lib = ipex_mod.load()
    if lib is None:
        return "IPEX cannot be loaded"
    dtype = torch.bfloat16 if bf16 else None
    g = torch.Generator().manual_seed(17)
    batches = [
        (torch.randn(8, 3, 8, 8, generator=g), torch.randn(8, 16, generator=g), torch.randint(0, 10, (8,), generator=g))
        for _ in range(3)
    ]
    torch.manual_seed(3)
    reference = _IpexProbe()

    def run(with_ipex: bool) -> tuple[list[float], list, dict[str, torch.Tensor]]:
        model = copy.deepcopy(reference)
        optimizer = cls(model.parameters(), **settings)
        if with_ipex:
            ipex_mod.optimize(model, optimizer, bf16)
        losses, grads = [], []
        for images, features, labels in batches:
            optimizer.zero_grad()
            autocast = torch.autocast("cpu", dtype=dtype) if dtype else torch.autocast("cpu", enabled=False)
            with autocast:
                out = model(images, features)
            loss = F.cross_entropy(out.float(), labels)
            loss.backward()
            grads = [p.grad for group in optimizer.param_groups for p in group["params"]]
            optimizer.step()
            losses.append(float(loss))
        return losses, grads, {k: v.float() for k, v in model.state_dict().items() if v.is_floating_point()}

    stock_losses, stock_grads, stock_state = run(False)
    losses, grads, state = run(True)
    if len(grads) != len(stock_grads):
        return f"the optimizer holds {len(grads)} parameters after ipex.optimize, {len(stock_grads)} before"
    problem = _gradient_problem([f"parameter {i}" for i in range(len(grads))], stock_grads, grads)
    if problem is not None:
        return problem
    for i, (s, f) in enumerate(zip(stock_losses, losses, strict=True)):
        if abs(f - s) > 0.05 * abs(s):
            return f"the loss at step {i + 1} is {abs(f - s) / abs(s):.1%} from stock's"
    for name, value in stock_state.items():
        if name in state and state[name].shape == value.shape and _relative(state[name], value) > 0.05:
            return f"{name} is {_relative(state[name], value):.1%} from stock's after three steps"
    return None


def ipex_ok(optimizer: torch.optim.Optimizer, bf16: bool) -> bool:
    cls, settings = type(optimizer), _settings(optimizer)
    key = f"ipex/{cls.__name__}/{'bf16' if bf16 else 'fp32'}/{sorted((k, repr(v)) for k, v in settings.items())}"
    return check("ipex", key, lambda: probe_ipex(cls, settings, bf16), f"IPEX ({cls.__name__})")
