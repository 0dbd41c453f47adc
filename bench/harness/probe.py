"""Inside the model: a forward-hook probe of the dtypes and layouts the layers saw."""

from __future__ import annotations

import sys
from collections import Counter
from typing import Any


class Probe:
    """A forward hook on one layer: the dtype it computed in and whether its 4-D input was
    channels-last, for every call in grad mode while ``active``."""

    def __init__(self) -> None:
        self.active = False
        self.layer: str | None = None
        self.calls = 0
        self.dtypes: Counter[str] = Counter()
        self.inputs_4d = 0
        self.channels_last = 0
        self.handle = None

    def attach(self, model, kind) -> None:
        """Hook the first module of ``model`` that ``kind(module)`` accepts (a class or a predicate)."""
        accepts = (lambda m: isinstance(m, kind)) if isinstance(kind, type) else kind
        for name, module in model.named_modules():
            if accepts(module):
                self.layer = f"{name} ({type(module).__name__})"
                self.handle = module.register_forward_hook(_outside_compile(self.hook))
                return
        raise RuntimeError(f"no {getattr(kind, '__name__', kind)} in {type(model).__name__}")

    def detach(self) -> None:
        if self.handle is not None:
            self.handle.remove()
            self.handle = None

    def hook(self, module, inputs, output) -> None:
        import torch

        if not self.active or not torch.is_grad_enabled():
            return
        self.calls += 1
        self.dtypes[str(output.dtype).removeprefix("torch.")] += 1
        x = inputs[0] if inputs else None
        if isinstance(x, torch.Tensor) and x.dim() == 4:
            self.inputs_4d += 1
            if x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous():
                self.channels_last += 1

    def as_dict(self) -> dict[str, Any]:
        return {
            "layer": self.layer,
            "calls": self.calls,
            "dtypes": dict(self.dtypes),
            "inputs_4d": self.inputs_4d,
            "channels_last": self.channels_last,
        }


def _outside_compile(hook):
    """``hook`` run eagerly even inside a compiled forward: traced, its ``self.calls += 1``
    became a guard on the count, and the model recompiled at every call (the frameworks bench's
    compiled GPT-2 under the Trainer read 0.25x eager for it)."""
    import torch

    disable = getattr(getattr(torch, "compiler", None), "disable", None)
    return disable(hook) if disable is not None else hook


def dtype_name(dtypes: dict[str, int]) -> str:
    short = {"bfloat16": "bf16", "float32": "fp32", "float16": "fp16"}
    return "+".join(short.get(d, d) for d in sorted(dtypes, key=lambda d: -dtypes[d])) or "?"


def inside(probe: dict[str, Any]) -> str:
    """The probe's verdict for the table: '<dtype> / <channels-last or not>'."""
    if not probe["calls"]:
        return "no call seen"
    text = dtype_name(probe["dtypes"])
    if probe["inputs_4d"] == 0:
        return f"{text} / n/a"
    if probe["channels_last"] == probe["inputs_4d"]:
        return f"{text} / channels-last"
    if probe["channels_last"] == 0:
        return f"{text} / contiguous"
    return f"{text} / channels-last {probe['channels_last']} of {probe['inputs_4d']}"


def measuring() -> bool:
    """Whether nanopatch is still measuring bf16 against fp32 or channels-last against stock's
    layout for a model (``status()``'s ``bf16_measured``, ``channels_last_measured``): the steps
    of that measurement are warm-up, not steady steps."""
    if "nanopatch" not in sys.modules:
        return False
    import nanopatch

    models = nanopatch.status()["targets"].get("training", {}).get("details") or []
    keys = ("bf16_measured", "channels_last_measured")
    return any(isinstance(m, dict) and "measuring" in (m.get(key) for key in keys) for m in models)
