"""Dropout masks in graphs nanopatch compiles, drawn by nanopatch's fast masks, not Inductor's.

Inductor lowers a dropout (``aten.native_dropout``) to its own random numbers: on a CPU, one
Philox draw computed per element inside the generated loops. On the bench's transformer (24
masks, 60 M elements a step) those draws took about 600 ms of a 1250 ms compiled step on a 2-core
AMX Xeon, where nanopatch's eager masks take about 60 ms, and they are most of why the compiled
step ran slower than the eager one.

So while nanopatch compiles an accelerated model's forward (``compile=``; see
:func:`.forward._compiled`), the decomposition Inductor uses for ``aten.native_dropout`` gives the
graph ``nanopatch::keep_mask``, an operator of nanopatch's own that Inductor calls as an
external kernel: :func:`.dropout.keep_mask` draws the mask (four elements per 64-bit word, the
method :mod:`.dropout` measured fastest) and hands it over as uint8, and Inductor fuses the mask's
use (``mask * x * scale``, and the backward's ``grad * mask * scale``) into the kernels around it.
uint8, not bool: Inductor's CPU kernels read and write a bool tensor an element at a time
(:func:`_no_saved_bools`). The operator is
tagged ``nondeterministic_seeded``, so Inductor keeps it in program order and AOTAutograd saves its
mask for the backward instead of recomputing it; each call in a graph carries a number of its
own, so two dropouts of the same tensor are never merged into one. Every other dropout, and
every graph nanopatch does not compile (a script's own ``torch.compile``), keeps Inductor's
decomposition; so does a probability closer than 1/1024 to 0 or 1. The masks have the
distribution of stock's with the keep probability rounded to 1/65536, from nanopatch's random
stream (a seed reproduces them); where the self-check turned fast masks off
(:data:`.dropout.disabled`), the operator draws with ``bernoulli_``.

Inductor's caches (the compiled graphs it keeps on disk, AOTAutograd's) key a graph by the
graph dynamo traced, before decompositions: a model compiled earlier with Inductor's masks would
come back from the cache with them. So while the override is on, Inductor's
``joint_custom_pre_pass`` setting holds nanopatch's pass, whose ``uuid`` names nanopatch's masks,
its bf16 attention (:mod:`.attention`) and the pass's own changes: it is part of both caches'
keys, so graphs compiled while patched are kept apart from the others. In the graphs nanopatch
compiles (and no others), the pass keeps bool tensors out of what the forward saves for the
backward (:func:`_no_saved_bools`). Where a script set a pass there itself, nanopatch leaves the
setting, the masks and the attention to Inductor.

The override is an entry of the patch engine's journal, made on the first compile and undone
with the patch (the decomposition tables get their own functions back and the setting its
value, ``is``-identical).
"""

from __future__ import annotations

import itertools
import threading
from typing import Any

import torch

from . import dropout
from .plan import context

_aten = torch.ops.aten
_lock = threading.Lock()
_local = threading.local()
#: the operator's library (defined once per process; the operator stays defined after unpatch:
#: a graph compiled while patched may still run it)
_library: list[Any] = []
_installed: list[Any] = []
_sites = itertools.count()


def _define() -> None:
    if _library:
        return
    library = torch.library.Library("nanopatch", "DEF")
    library.define("keep_mask(Tensor like, float p, int site) -> Tensor", tags=(torch.Tag.nondeterministic_seeded,))
    # looked up at each call: the operator outlives any one binding of the module's functions
    library.impl("keep_mask", lambda like, p, site: _keep_mask(like, p, site), "CPU")
    library.impl("keep_mask", lambda like, p, site: _keep_mask_meta(like, p, site), "Meta")
    _library.append(library)


def _keep_mask(like: torch.Tensor, p: float, site: int) -> torch.Tensor:
    """A mask of ``like``'s shape as uint8 (0 or 1), each element 1 with probability ``p``."""
    _local.drawn = getattr(_local, "drawn", 0) + 1
    if dropout.disabled[0]:
        return torch.empty(like.shape, dtype=torch.float32).bernoulli_(p).to(torch.uint8)
    return dropout.keep_mask(like.shape, p).view(torch.uint8)


def _keep_mask_meta(like: torch.Tensor, p: float, site: int) -> torch.Tensor:
    return torch.empty(like.shape, dtype=torch.uint8, device=like.device)


def ours() -> bool:
    """Whether this thread is inside a forward nanopatch compiled (tracing it, or running it)."""
    return getattr(_local, "ours", 0) > 0


def drawn() -> int:
    """How many masks the operator drew in this thread so far."""
    return getattr(_local, "drawn", 0)


class tracing:
    """Around a call of a forward nanopatch compiled: graphs traced inside get the fast masks."""

    def __enter__(self) -> None:
        _local.ours = getattr(_local, "ours", 0) + 1

    def __exit__(self, *exc: Any) -> None:
        _local.ours -= 1


def _tables() -> list[dict[Any, Any]]:
    """The decomposition tables Inductor picks from (:func:`select_decomp_table`): its
    ``fast_random_decomps()`` (a cached dict) and, where it holds the op, ``decompositions``."""
    from torch._inductor import decomposition

    tables = [decomposition.fast_random_decomps()]
    if _aten.native_dropout.default in decomposition.decompositions:
        tables.append(decomposition.decompositions)
    return tables


def _cache_key_pass() -> Any:
    """The joint-graph pass: :func:`_no_saved_bools` in graphs nanopatch compiles, and a
    ``uuid`` in Inductor's cache keys."""
    from torch._inductor.custom_graph_pass import CustomGraphPass

    class FastMasksKey(CustomGraphPass):  # type: ignore[misc]
        def __call__(self, graph: Any) -> None:
            if ours():
                _no_saved_bools(graph)

        def uuid(self) -> str:
            return "nanopatch: dropout masks from nanopatch::keep_mask, attention in bf16, no saved bool masks (3)"

    return FastMasksKey()


def _no_saved_bools(graph: Any) -> None:
    """Keep bool tensors out of what a graph nanopatch compiles saves for its backward.

    Inductor's CPU kernels load and store a bool tensor an element at a time (``VecMask``'s
    generic conversions): on a 2-core AMX Xeon, torch 2.13, storing ``x <= 0`` for 4 M bf16
    elements took 16 ms and reading a bool mask into a product 11 ms, against 0.5-0.6 ms for the
    same work on uint8 or bf16 tensors. Two such masks cross from a transformer's forward into its
    backward:

    * a dropout mask: :func:`_keep_mask` gives uint8, and the backward's ``mask.bool()`` cast
      back to a float is read from the uint8 mask instead (its values are 0 and 1: the same);
    * a ReLU's ``output <= 0``, which the partitioner saves (one byte against the output's two)
      for the backward's ``where``: marked to be recomputed there from the output, which the
      forward wrote anyway.
    Values are unchanged; only what is stored between the two passes. The bench's compiled
    transformer step went from 987-1111 ms to 634-726 (three alternating processes each)."""
    from torch.utils.checkpoint import CheckpointPolicy

    convert = torch.ops.prims.convert_element_type.default
    keep = torch.ops.nanopatch.keep_mask.default
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        if node.target is keep:
            for cast in list(node.users):
                if cast.target is not convert or cast.args[1] is not torch.bool:
                    continue
                for use in list(cast.users):
                    if use.target is convert and len(use.args) == 2 and use.args[1].is_floating_point:
                        use.args = (node, use.args[1])
                if not cast.users:
                    graph.erase_node(cast)
        elif node.target is _aten.le.Scalar and node.args[1] == 0 and _relu_output(node.args[0]):
            node.meta["recompute"] = CheckpointPolicy.MUST_RECOMPUTE


def _relu_output(node: Any) -> bool:
    while getattr(node, "op", None) == "call_function" and node.target in (_aten.alias.default, _aten.detach.default):
        node = node.args[0]
    return getattr(node, "op", None) == "call_function" and node.target is _aten.relu.default


def install() -> bool:
    """Give Inductor's ``aten.native_dropout`` decomposition the fast masks, for the patch's
    life (once; the first compile calls it). False where this torch has no decomposition to
    replace or cannot define the operator, or a script set Inductor's ``joint_custom_pre_pass``:
    Inductor's own masks stay."""
    if _installed:  # every compiled forward asks: no lock once it is on
        return True
    with _lock:
        if _installed:
            return True
        try:
            from torch._inductor import config as inductor_config

            if getattr(inductor_config, "joint_custom_pre_pass", False) is not None:
                return False
            key = _cache_key_pass()
            _define()
            tables = _tables()
        except Exception:
            return False
        originals = [(table, table.get(_aten.native_dropout.default)) for table in tables]
        if any(original is None for _, original in originals):
            return False
        for table, original in originals:
            table[_aten.native_dropout.default] = _decomposition(original)
        inductor_config.joint_custom_pre_pass = key

        def undo() -> None:
            for table, original in originals:
                table[_aten.native_dropout.default] = original
            if inductor_config.joint_custom_pre_pass is key:
                inductor_config.joint_custom_pre_pass = None
            _installed.clear()

        _installed.append(context().on_undo(undo, "torch._inductor.decomposition: aten.native_dropout (fast masks)"))
        return True


def installed() -> bool:
    return bool(_installed)


def _decomposition(original: Any) -> Any:
    def native_dropout(input: torch.Tensor, p: float, train: bool | None) -> Any:
        if (
            getattr(_local, "ours", 0) > 0
            and train
            and dropout.drawable(p)
            and input.device.type == "cpu"
            and input.is_floating_point()
        ):
            mask = torch.ops.nanopatch.keep_mask(input, 1.0 - p, next(_sites))
            return mask * input * float(1.0 / (1.0 - p)), mask.bool()
        return original(input, p, train)

    return native_dropout
