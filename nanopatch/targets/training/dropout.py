"""Dropout masks from a faster generator, inside an accelerated model's training forward.

Dropout draws its mask with ``bernoulli_`` (``nn.Dropout``, ``F.dropout``, the attention dropout
inside ``scaled_dot_product_attention``, ``Dropout2d``'s feature noise). On CPU that draws one
value per element from torch's Mersenne Twister in one thread.

While the patch is on, nanopatch registers a kernel for that one operator,
``aten::bernoulli_.float``, at the dispatcher's ``BackendSelect`` key: below autograd, autocast
and any dispatch mode, just above the CPU kernel, so it also sees the calls torch's C++
operators make. Inside a *mask region* (a paired model's training forward, and activation
checkpointing's replay of one: :mod:`.replay`) it fills an eligible tensor from 64-bit draws of
the same generator cut into four 16-bit lanes: an element is 1 when its lane falls below
``round(p * 65536)`` of the 65536 values. The mask has the distribution stock's has, with the
probability rounded to 1/65536 (``p=0.9`` becomes 0.899994); it is not the same random stream,
so a patched run's masks differ from stock's (as bf16 makes its numbers differ), and a seed
still reproduces a run. Large masks take their 64-bit values from a counter hash computed on
all of torch's threads instead, where that measured clearly faster than the generator's one
thread (:func:`draw_words`). Everywhere else, and for masks with ``p`` closer than 1/1024 to 0 or 1,
small tensors, a generator that is not the CPU's, the call goes on to the CPU kernel unchanged.
``fast_dropout=False`` turns it off.

It is a kernel for one operator, not a ``TorchDispatchMode``, on purpose: a mode receives every
operator below autograd as one call, so a library that gives a CompositeImplicitAutograd
operator a backend kernel of its own (IPEX registers a CPU ``aten::layer_norm``, whose autograd
comes from the operators that kernel calls) records no autograd history under it, and every
gradient before that operator is lost.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import torch

from nanopatch.foundation import records
from nanopatch.foundation.log import log_once, warnings_from

from .plan import config, context, local

_aten = torch.ops.aten
#: tensors smaller than this draw their mask stock (the kernel's own cost would outweigh the gain)
MIN_ELEMENTS = 4096
_LANES = 65536
_EDGE = 1 / 1024

#: set when a self-check found that fast masks do not learn as stock: every mask is stock's
disabled = [False]
_installed: list[Any] = []  # the journal's entry while the kernel is registered


def eligible(tensor: torch.Tensor, p: Any, generator: Any) -> bool:
    return (
        type(tensor) is torch.Tensor
        and tensor.device.type == "cpu"
        and tensor.is_floating_point()
        and tensor.numel() >= MIN_ELEMENTS
        and isinstance(p, (float, int))
        and _EDGE <= p <= 1 - _EDGE
        and (generator is None or generator.device.type == "cpu")
    )


def keep_mask(shape: torch.Size | tuple[int, ...], p: float, generator: Any = None) -> torch.Tensor:
    """A bool tensor of ``shape``, each element True with probability ``p`` rounded to 1/65536,
    drawn four elements per 64-bit random value (:func:`draw_words`, from ``generator``: the
    default CPU generator when None)."""
    n = torch.Size(shape).numel()
    lanes = draw_words((n + 3) // 4, generator).view(torch.int16)[:n]
    below = round(p * _LANES) - _LANES // 2  # P(lane < below) = round(p * 65536) / 65536
    return torch.lt(lanes, below).view(shape)


# --- the random words: torch's generator, or a counter hash on torch's threads ---------------

#: masks of fewer 64-bit words than this draw them from the generator (the hash's dozen
#: operator calls would cost more than they save)
HASH_MIN_WORDS = 1 << 16
#: the words each method draws, timed, to choose between them (once per process and thread count)
CALIBRATION_WORDS = 1 << 18
#: the hash is chosen where it drew the calibration's words in at most this share of the generator's
#: time: a clear win, so that a machine on which the two are close keeps one choice from run to run
HASH_WINS_BELOW = 0.67


def _int64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


# SplitMix64 (Steele, Lea and Flood, 2014; the seeding generator of xoshiro): a counter times an
# odd constant plus a key, through three xor-shift-multiply rounds. int64 arithmetic wraps as
# uint64's does; a logical shift is an arithmetic one with the sign bits masked off.
_GAMMA = _int64(0x9E3779B97F4A7C15)
_MIX1 = _int64(0xBF58476D1CE4E5B9)
_MIX2 = _int64(0x94D049BB133111EB)


def hash_words(count: int, key: int) -> torch.Tensor:
    """SplitMix64's outputs for counters 1..``count`` from the 64-bit ``key`` (as int64), computed
    by torch's element-wise operators: on all of its intra-op threads, where torch's generator
    draws in one."""
    words = torch.arange(1, count + 1, dtype=torch.int64)
    words.mul_(_GAMMA).add_(key)
    _xor_shift(words, 30)
    words.mul_(_MIX1)
    _xor_shift(words, 27)
    words.mul_(_MIX2)
    _xor_shift(words, 31)
    return words


def _xor_shift(words: torch.Tensor, shift: int) -> None:
    shifted = torch.bitwise_right_shift(words, shift)
    shifted.bitwise_and_((1 << (64 - shift)) - 1)
    words.bitwise_xor_(shifted)


def _generator_words(count: int, generator: Any) -> torch.Tensor:
    return torch.empty(count, dtype=torch.int64).random_(-(2**63), None, generator=generator)


def draw_words(count: int, generator: Any = None) -> torch.Tensor:
    """``count`` uniformly random int64 values. Torch's CPU generator draws them in one thread
    whatever the tensor's size: on a 16-core AMX Xeon the transformer's 24 dropout masks took a
    third of its training step there (``aten::random_``). Where :func:`hash_method` measured it
    clearly faster on this process's threads, a large mask's words are instead a counter hash
    (:func:`hash_words`) under a key drawn from ``generator``, so a seed still reproduces them."""
    if count < HASH_MIN_WORDS or not hash_method():
        return _generator_words(count, generator)
    key = int(_generator_words(1, generator).item())
    return hash_words(count, key)


_lock = threading.Lock()
#: torch's intra-op thread count -> (whether the hash draws, generator ms, hash ms), as measured
chosen: dict[int, tuple[bool, float, float]] = {}
#: where the measurement is kept for later runs, in nanopatch's cache folder
RECORD_FILE = "dropout.json"


def hash_method() -> bool:
    """Whether large masks draw their words through :func:`hash_words` at this process's
    intra-op thread count: measured once per count, on :data:`CALIBRATION_WORDS` words drawn by
    each method (the best of three each, from a generator of its own, so the run's random stream
    is untouched), and kept in ``dropout.json`` of nanopatch's cache folder for this torch, CPU
    and thread count: later runs on the machine use the same method, so a seed gives them the
    same masks."""
    threads = torch.get_num_threads()
    found = chosen.get(threads)
    if found is None:
        with _lock:
            found = chosen.get(threads)
            if found is None:
                found = chosen[threads] = _recorded_or_measured(threads)
    return found[0]


def _recorded_or_measured(threads: int) -> tuple[bool, float, float]:
    from nanopatch.foundation import cpu

    key = f"torch {torch.__version__}|{cpu.host_facts().model_name}|{threads} threads"
    record = records.read_record(key, RECORD_FILE)
    try:
        return bool(record["hash"]), float(record["generator_ms"]), float(record["hash_ms"])  # type: ignore[index]
    except (TypeError, KeyError, ValueError):
        pass
    found = _calibrate()
    records.write_record(
        key, {"hash": found[0], "generator_ms": round(found[1], 3), "hash_ms": round(found[2], 3)}, RECORD_FILE
    )
    return found


def _calibrate() -> tuple[bool, float, float]:
    own = torch.Generator().manual_seed(0)
    generator_s = _best(lambda: _generator_words(CALIBRATION_WORDS, own))
    hash_s = _best(lambda: hash_words(CALIBRATION_WORDS, 1))
    return hash_s <= HASH_WINS_BELOW * generator_s, 1000 * generator_s, 1000 * hash_s


def _best(draw: Any, times: int = 3) -> float:
    draw()  # the first call pays for first use (pages, thread start)
    best = float("inf")
    for _ in range(times):
        start = time.perf_counter()
        draw()
        best = min(best, time.perf_counter() - start)
    return best


def method() -> tuple[bool, float, float, int] | None:
    """How large masks draw their words at this thread count: (the counter hash or not, the
    generator's and the hash's milliseconds for the words timed, those words); None where not
    measured yet."""
    found = chosen.get(torch.get_num_threads())
    return None if found is None else (*found, CALIBRATION_WORDS)


def fill_bernoulli(tensor: torch.Tensor, p: float, generator: Any = None) -> torch.Tensor:
    """``tensor.bernoulli_(p)`` from :func:`keep_mask` (copied as bytes: torch converts uint8 to
    floating types in vector code and bool element by element, five times slower)."""
    return tensor.copy_(keep_mask(tensor.shape, p, generator).view(torch.uint8))


def note_drawn() -> None:
    """Count a fast draw in this thread (a region's ``fast`` reads it)."""
    local.drawn = getattr(local, "drawn", 0) + 1


def in_region() -> bool:
    """Whether this thread is inside a mask region."""
    return getattr(local, "masks", 0) > 0


def _kernel(keyset: Any, tensor: torch.Tensor, p: Any = 0.5, generator: Any = None) -> torch.Tensor:
    if getattr(local, "masks", 0) > 0 and not disabled[0] and eligible(tensor, p, generator):
        note_drawn()  # per thread: a region counts its own thread's
        return fill_bernoulli(tensor, p, generator)
    return _aten.bernoulli_.float.redispatch(
        keyset.remove(torch._C.DispatchKey.BackendSelect), tensor, p, generator=generator
    )


def install() -> bool:
    """Register the kernel while the training target is applied (an entry of the patch
    engine's journal: unregistered at unpatch). Returns whether it is registered; when torch
    cannot take it, says so once and masks stay stock."""
    return register(
        _installed, "bernoulli_.float", _kernel, "BackendSelect", "fast dropout masks off", "fast dropout mask kernel"
    )


def register(installed: list[Any], op: str, kernel: Any, key: str, refused: str, what: str, undo: Any = None) -> bool:
    """Register ``kernel`` for ``aten::<op>`` at dispatch key ``key`` as an entry of the patch
    engine's journal, noted in ``installed`` while it is on (``undo`` also runs when it comes
    off); outside a patch, for good. When torch cannot take it, logs ``refused`` once and returns False."""
    if installed:
        return True
    try:
        library = torch.library.Library("aten", "IMPL")
        # torch < 2.13 warns (once, as a UserWarning) on replacing autocast's own kernel
        with warnings_from(r"torch\.library\Z", "ignore", "Warning only once for all operators", UserWarning):
            library.impl(op, kernel, key, with_keyset=True)
    except Exception as exc:
        log_once(
            f"kernel-{op}",
            "%s: torch %s cannot register the kernel for aten::%s (%s: %s)",
            refused,
            torch.__version__,
            op,
            type(exc).__name__,
            exc,
            level=logging.INFO,
        )
        return False

    def remove() -> None:
        installed.clear()
        if undo is not None:
            undo()
        library._destroy()

    if config() is None:  # outside a patch (bench/'s prototypes): registered for the process's life
        installed.append(library)
        return True
    installed.append(context().on_undo(remove, f"aten::{op}: {what}"))
    return True


def installed() -> bool:
    return bool(_installed)


class region:
    """A mask region for this thread (nestable): eligible ``bernoulli_(p)`` calls inside draw
    fast; ``fast`` says afterwards whether any did."""

    def __init__(self) -> None:
        self.fast = False
        self._before = 0

    def __enter__(self) -> region:
        self._before = getattr(local, "drawn", 0)
        local.masks = getattr(local, "masks", 0) + 1
        return self

    def __exit__(self, *exc: Any) -> None:
        local.masks -= 1
        self.fast = getattr(local, "drawn", 0) != self._before
