"""IPEX (``intel_extension_for_pytorch``) behind a version gate.

IPEX is imported only when its package metadata says it was built for the installed torch:
importing a mismatched IPEX terminates the interpreter, so the gate reads metadata
(:func:`nanopatch.config.ipex_compatibility`) before anything is imported.

``ipex.optimize(model, optimizer=..., dtype=..., inplace=True)`` changes the user's own model
and optimizer objects: with ``dtype=torch.bfloat16`` the weights become bf16 (IPEX keeps the
fp32 master weights and gives them back from ``state_dict()``), its convolutions and linears
get prepacked oneDNN weights, and the optimizer gets IPEX's fused step. None of that can be
undone, which is why the training patch treats IPEX-optimized models specially on unpatch.
"""

from __future__ import annotations

import functools
import logging
from types import ModuleType

import torch
from torch import nn

from .. import config
from .._log import log_once


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


def why_not(model: nn.Module, optimizer: torch.optim.Optimizer, ipex: ModuleType) -> str | None:
    """Why IPEX should not optimize this pair, or None when it can."""
    if type(optimizer) not in fusable_optimizers(ipex):
        return f"IPEX cannot fuse {type(optimizer).__name__} on CPU"
    model_params = {id(p) for p in model.parameters()}
    for group in optimizer.param_groups:
        for p in group["params"]:
            if id(p) not in model_params:
                return "the optimizer also holds parameters of another model"
            if p.dtype != torch.float32 or p.device.type != "cpu":
                return f"a parameter is {p.dtype} on {p.device.type}, not float32 on cpu"
    return None


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
