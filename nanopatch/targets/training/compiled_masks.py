"""Dropout masks in graphs nanopatch compiles, hashed inside Inductor's kernels, not drawn by Inductor.

Inductor lowers a dropout (``aten.native_dropout``) to its own random numbers: on a CPU, one
Philox draw computed per element inside the generated loops. On the bench's transformer (24
masks, 60 M elements a step) those draws took about 600 ms of a 1250 ms compiled step on a 2-core
AMX Xeon, where nanopatch's eager masks take about 60 ms, and they are most of why the compiled
step ran slower than the eager one.

So while nanopatch compiles an accelerated model's forward (``compile=``; see
:func:`.forward._compiled`), the decomposition Inductor uses for ``aten.native_dropout`` gives the
graph each mask as a hash of the element's index (:func:`hashed_keep`: lowbias32 twice, in int32
operators) keyed by ``nanopatch::mask_key``, an operator of nanopatch's own that draws two int32
keys from torch's generator (one 64-bit draw: a seed reproduces the masks). Inductor computes the
hash in vector registers inside the kernel that applies the mask (``x * scale`` where kept), and
nanopatch's joint-graph pass (:func:`_recompute_hash`) has the backward hash it again from the
saved keys inside its own kernel: no mask is drawn ahead, stored or read back. On the bench's
transformer (2-core EPYC Zen 4) that took the masks' ~40 ms a step (the words hashed by torch's
element-wise operators, then compared) out of the compiled step, for ~14 ms more in the fused
kernels. ``mask_key`` is tagged ``nondeterministic_seeded``, so Inductor keeps it in program
order and AOTAutograd saves its keys for the backward instead of drawing again; each call in a
graph carries a number of its own, so two dropouts of the same tensor are never merged into one.
A mask of 2**31 elements or more (its index would not fit in int32), and every mask while the
self-check has fast masks off
(:data:`.dropout.disabled`, read when the graph is traced), is drawn by ``nanopatch::keep_mask``
instead, an external kernel: :func:`.dropout.keep_mask` (four elements per 64-bit word, the
method :mod:`.dropout` measured fastest; ``bernoulli_`` where fast masks are off) hands the mask
over as uint8, and Inductor fuses its use into the kernels around it. uint8, not bool: Inductor's
CPU kernels read and write a bool tensor an element at a time (:func:`_no_saved_bools`). Every
other dropout, and every graph nanopatch does not compile (a script's own ``torch.compile``),
keeps Inductor's decomposition; so does a probability closer than 1/1024 to 0 or 1. The masks
have the distribution of stock's with the keep probability rounded to 1/65536 (the comparison
of a 16-bit lane with it, as the eager masks'), from nanopatch's random stream.

Inductor's caches (the compiled graphs it keeps on disk, AOTAutograd's) key a graph by the
graph dynamo traced, before decompositions: a model compiled earlier with Inductor's masks would
come back from the cache with them. So while the override is on, Inductor's
``joint_custom_pre_pass`` setting holds nanopatch's pass, whose ``uuid`` names nanopatch's masks
(with the choice between hashed and drawn masks made when a graph is traced), its bf16 attention
(:mod:`.attention`) and the pass's own changes: it is part of both caches' keys, so graphs
compiled while patched are kept apart from the others. In the graphs nanopatch
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
    seeded = (torch.Tag.nondeterministic_seeded,)
    library.define("keep_mask(Tensor like, float p, int site) -> Tensor", tags=seeded)
    library.define("mask_key(Tensor like, int site) -> Tensor", tags=seeded)
    # looked up at each call: the operator outlives any one binding of the module's functions
    library.impl("keep_mask", lambda like, p, site: _keep_mask(like, p, site), "CPU")
    library.impl("keep_mask", lambda like, p, site: _keep_mask_meta(like, p, site), "Meta")
    library.impl("mask_key", lambda like, site: _mask_key(like, site), "CPU")
    library.impl("mask_key", lambda like, site: torch.empty(2, dtype=torch.int32, device=like.device), "Meta")
    _library.append(library)


def _mask_key(like: torch.Tensor, site: int) -> torch.Tensor:
    """Two int32 keys for one mask hashed inside a compiled kernel (:func:`hashed_lanes`), from
    one 64-bit draw of torch's default CPU generator: a seed reproduces them."""
    _local.drawn = getattr(_local, "drawn", 0) + 1
    _local.hashed = getattr(_local, "hashed", 0) + 1
    return dropout._generator_words(1, None).view(torch.int32)


def _keep_mask(like: torch.Tensor, p: float, site: int) -> torch.Tensor:
    """A mask of ``like``'s shape as uint8 (0 or 1), each element 1 with probability ``p``."""
    _local.drawn = getattr(_local, "drawn", 0) + 1
    if dropout.disabled[0]:
        return torch.empty(like.shape, dtype=torch.float32).bernoulli_(p).to(torch.uint8)
    return dropout.keep_mask(like.shape, p).view(torch.uint8)


def _keep_mask_meta(like: torch.Tensor, p: float, site: int) -> torch.Tensor:
    return torch.empty(like.shape, dtype=torch.uint8, device=like.device)


#: masks of at least this many elements are drawn by :func:`_keep_mask` instead (their element
#: index would not fit the int32 counter of :func:`hashed_lanes`)
HASHED_MAX_ELEMENTS = 1 << 31
# lowbias32 (Chris Wellons' hash-prospector, 2018): xor-shift 16, multiply, xor-shift 15, multiply,
# xor-shift 16, a bijection of 32-bit integers; its constants as int32
_MUL1 = 0x7FEB352D
_MUL2 = 0x846CA68B - (1 << 32)


def _lsr(x: torch.Tensor, shift: int) -> torch.Tensor:
    """``x >> shift`` as an unsigned (logical) shift of int32 values."""
    return torch.bitwise_and(torch.bitwise_right_shift(x, shift), (1 << (32 - shift)) - 1)


def _mix(x: torch.Tensor) -> torch.Tensor:
    x = torch.bitwise_xor(x, _lsr(x, 16))
    x = torch.mul(x, _MUL1)
    x = torch.bitwise_xor(x, _lsr(x, 15))
    x = torch.mul(x, _MUL2)
    return torch.bitwise_xor(x, _lsr(x, 16))


def hashed_lanes(shape: Any, key: torch.Tensor) -> torch.Tensor:
    """One signed 16-bit lane (as int32, -32768..32767) per element of ``shape``: the top half of
    lowbias32 applied twice to the element's index, keyed by ``key``'s two int32 values
    (``mix(mix(index ^ key[0]) ^ key[1])``). Written in torch's int32 operators so that Inductor
    computes it inside the kernel that uses the mask, in vector registers, where the index is the
    loop's own counter: nothing drawn ahead, stored or read back."""
    count = 1
    for size in shape:
        count = count * size
    index = torch.arange(count, dtype=torch.int32, device=key.device).view(shape)
    mixed = _mix(torch.bitwise_xor(_mix(torch.bitwise_xor(index, key[0])), key[1]))
    return torch.bitwise_right_shift(mixed, 16)


def hashed_keep(shape: Any, p: float, key: torch.Tensor) -> torch.Tensor:
    """A bool mask of ``shape``, each element True with probability ``p`` rounded to 1/65536 (as
    :func:`.dropout.keep_mask`'s), from :func:`hashed_lanes`."""
    return torch.lt(hashed_lanes(shape, key), round(p * 65536) - 32768)


def ours() -> bool:
    """Whether this thread is inside a forward nanopatch compiled (tracing it, or running it)."""
    return getattr(_local, "ours", 0) > 0


def drawn() -> int:
    """How many masks the operators drew (or keyed) in this thread so far."""
    return getattr(_local, "drawn", 0)


def hashed() -> int:
    """How many of them were keys of masks hashed inside compiled kernels."""
    return getattr(_local, "hashed", 0)


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
            # what the decomposition chose from at trace time is part of the graph: graphs traced
            # under another choice are kept apart
            hashed = "off" if dropout.disabled[0] else f"below {HASHED_MAX_ELEMENTS} elements"
            return (
                "nanopatch: dropout masks hashed in the kernels (nanopatch::mask_key; "
                f"{hashed}), else from nanopatch::keep_mask; attention in bf16; no saved bool masks (4)"
            )

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
    key = torch.ops.nanopatch.mask_key.default
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        if node.target is key:
            _recompute_hash(node, CheckpointPolicy.MUST_RECOMPUTE)
        elif node.target is keep:
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


def _recompute_hash(key: Any, policy: Any) -> None:
    """Mark a hashed mask's integer and bool nodes (the index, the hash, the comparison: everything
    computed from ``key`` that is not a floating tensor) to be recomputed in the backward from the
    saved key: the backward then hashes the mask again inside its own kernel instead of reading a
    stored one."""
    todo, seen = list(key.users), set()
    # the partitioner compares the checkpoint-region ids of two nodes both marked (torch 2.8 has no
    # default for a node outside any region): the chain shares its key's, or one of its own
    region = key.meta.get("ac_graph_id", 0)
    while todo:
        node = todo.pop()
        if node in seen or node.op != "call_function" or _floating(node):
            continue
        seen.add(node)
        node.meta["recompute"] = policy
        node.meta.setdefault("ac_graph_id", region)
        todo.extend(node.users)
        todo.extend(_index_nodes(node))


def _index_nodes(node: Any) -> list[Any]:
    """The arguments of ``node`` computed from no tensor at all (the element index and its views)."""
    return [arg for arg in node.all_input_nodes if _constant(arg)]


def _constant(node: Any) -> bool:
    # the dtype first: the walk stops at the first floating tensor instead of climbing the whole
    # forward above it (a deep model's graph would pass Python's recursion limit)
    return node.op == "call_function" and not _floating(node) and all(_constant(a) for a in node.all_input_nodes)


def _floating(node: Any) -> bool:
    value = node.meta.get("val")
    return not isinstance(value, torch.Tensor) or value.is_floating_point()


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
            if input.numel() < HASHED_MAX_ELEMENTS and not dropout.disabled[0]:
                keep = hashed_keep(input.shape, 1.0 - p, torch.ops.nanopatch.mask_key(input, next(_sites)))
                return torch.where(keep, input * float(1.0 / (1.0 - p)), 0), keep
            mask = torch.ops.nanopatch.keep_mask(input, 1.0 - p, next(_sites))
            return mask * input * float(1.0 / (1.0 - p)), mask.bool()
        return original(input, p, train)

    return native_dropout
