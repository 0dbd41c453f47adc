"""IPEX (``intel_extension_for_pytorch``) behind a version gate.

IPEX is imported only when its package metadata says it was built for the installed torch:
importing a mismatched IPEX terminates the interpreter, so the gate reads metadata
(:func:`nanopatch.engine.config.ipex_compatibility`) before anything is imported.

``ipex.optimize(model, optimizer=..., dtype=..., inplace=True)`` changes the user's own model
and optimizer objects: with ``dtype=torch.bfloat16`` the weights become bf16 (IPEX keeps the
fp32 master weights and gives them back from ``state_dict()``), its convolutions and linears
get prepacked oneDNN weights, and the optimizer gets IPEX's fused step. None of that can be
undone, which is why the training patch treats IPEX-optimized models specially on unpatch.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from types import ModuleType

import torch
from torch import nn

from nanopatch import engine
from nanopatch.engine import config
from nanopatch.foundation import cpu
from nanopatch.foundation.log import log_once

from . import amp

#: called, in the order the targets were applied, with each optimizer ``ipex.optimize`` gave an
#: instance-level ``step`` (its fused one), which torch's optimizer step hooks never see
_instance_step_listeners: list[Callable[[torch.optim.Optimizer], None]] = []

# IPEX prepacks bf16 weights for oneDNN only with these instructions; elsewhere
# ``ipex.optimize(..., dtype=torch.bfloat16)`` raises an AssertionError.
_BF16_PREPACK_FLAGS = (("avx512bw", "avx512vl", "avx512dq"), ("avx_ne_convert",))


@functools.lru_cache(maxsize=1)
def load() -> ModuleType | None:
    """The IPEX module, or None (said once) when it is missing, mismatched or fails to import."""
    ok, why = config.ipex_compatibility()
    if not ok:
        log_once("ipex-missing", "IPEX not used: %s", why)
        return None
    try:
        import intel_extension_for_pytorch as ipex
    except Exception as exc:  # a broken install must not break training
        log_once("ipex-import", "IPEX not used: importing it failed (%s: %s)", type(exc).__name__, exc)
        return None
    return ipex


def fusable_optimizers(ipex: ModuleType) -> tuple[type, ...]:
    """The optimizer classes IPEX fuses on CPU (its own list when it publishes one)."""
    try:
        from intel_extension_for_pytorch.optim._optimizer_utils import IPEX_FUSED_OPTIMIZER_LIST_CPU
    except ImportError:
        return (torch.optim.SGD, torch.optim.Adagrad, torch.optim.Adam)
    return tuple(IPEX_FUSED_OPTIMIZER_LIST_CPU)


def bf16_cpu_why_not(flags: frozenset[str] | None = None) -> str | None:
    """Why IPEX cannot optimize for bf16 on this CPU (``flags``: the CPU's), or None when it can."""
    flags = cpu.host_facts().flags if flags is None else flags
    if not flags or any(all(f in flags for f in need) for need in _BF16_PREPACK_FLAGS):
        return None  # unknown flags (not Linux): IPEX's own check decides
    return "its bf16 weight prepack needs avx512bw, avx512vl and avx512dq or avx_ne_convert, which this CPU lacks"


def why_not(model: nn.Module, optimizer: torch.optim.Optimizer, ipex: ModuleType, bf16: bool) -> str | None:
    """Why IPEX should not optimize this pair (for bf16 when ``bf16``), or None when it can."""
    if type(optimizer) not in fusable_optimizers(ipex):
        return f"IPEX cannot fuse {type(optimizer).__name__} on CPU"
    for sub in model.modules():
        if isinstance(sub, (nn.Embedding, nn.EmbeddingBag)) and sub.sparse:
            return f"{type(sub).__name__}(sparse=True) makes sparse gradients, which IPEX's fused steps do not take"
    model_params = {id(p) for p in model.parameters()}
    chosen = amp.chosen_weight_dtypes(model)
    if chosen is not None:
        return chosen
    for group in optimizer.param_groups:
        for p in group["params"]:
            if id(p) not in model_params:
                return "the optimizer also holds parameters of another model"
            if p.dtype != torch.float32 or p.device.type != "cpu":
                return f"a parameter is {p.dtype} on {p.device.type}, not float32 on cpu"
    return bf16_cpu_why_not() if bf16 else None


def optimize(model: nn.Module, optimizer: torch.optim.Optimizer, bf16: bool) -> None:
    """``ipex.optimize`` the pair in place (the user's objects are the ones changed)."""
    ipex = load()
    assert ipex is not None
    dtype = torch.bfloat16 if bf16 else torch.float32
    # IPEX chatters through its own logger at WARNING about deprecated flags it sets itself.
    ipex_logger = logging.getLogger("IPEX")
    level = ipex_logger.level
    ipex_logger.setLevel(logging.ERROR)
    try:
        ipex.optimize(model, optimizer=optimizer, dtype=dtype, inplace=True)
    finally:
        ipex_logger.setLevel(level)
    if "step" in optimizer.__dict__:
        for listener in list(_instance_step_listeners):
            listener(optimizer)


def on_instance_step(ctx: engine.Context, listener: Callable[[torch.optim.Optimizer], None]) -> None:
    """Have ``listener(optimizer)`` called, while ``ctx``'s target is applied, for each optimizer IPEX
    gives a step of its own, so that it can wrap that step as torch's hooks would have seen it.
    Targets wrap in the order they were applied and are undone the other way round, so each
    wrapper is restored to what it wrapped."""
    _instance_step_listeners.append(listener)
    ctx.on_undo(lambda: _instance_step_listeners.remove(listener), "IPEX instance-step listener")
