"""safetensors' savers, handed the weights nanopatch laid out channels-last in stock's strides.

safetensors saves no non-contiguous tensor ("You are trying to save a non contiguous tensor"),
and the weights of a model nanopatch trains channels-last are not contiguous: a script's
``save_file(model.state_dict(), path)`` after training, which runs stock, raised. (Hugging
Face's ``save_pretrained`` makes its tensors contiguous itself; a plain ``nn.Module``'s state
dict, a Trainer's non-Hugging-Face model and ``safetensors.torch.save_model`` do not.) While
patched, ``safetensors.torch.save_file`` and ``save`` get a contiguous copy of each tensor that
is a weight nanopatch laid out (the same values; the file is the one stock writes). Any other
tensor is passed as it is, so a tensor the script laid out itself raises as in stock.
"""

from __future__ import annotations

from typing import Any

from nanopatch import engine
from nanopatch.engine import versions

from . import memory_format as mf


class Safetensors(engine.Target):
    """``safetensors.torch.save_file`` / ``save`` given nanopatch's channels-last weights in
    stock's strides."""

    supported = versions.supported("torch")

    def patch(self, ctx: engine.Context) -> None:
        import safetensors.torch as saver

        for name in ("save_file", "save"):
            if callable(getattr(saver, name, None)):
                ctx.wrap(saver, name, _in_stock_strides)


def _in_stock_strides(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    if args:
        args = (mf.in_stock_strides(args[0]), *args[1:])
    elif "tensors" in kwargs:
        kwargs = {**kwargs, "tensors": mf.in_stock_strides(kwargs["tensors"])}
    return wrapped(*args, **kwargs)
