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
import os
import threading
import time
from typing import Any, NamedTuple

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


def drawable(p: Any) -> bool:
    """Whether a dropout probability can be drawn from 16-bit lanes closely enough: a number at
    least 1/1024 from 0 and 1."""
    return isinstance(p, (float, int)) and _EDGE <= p <= 1 - _EDGE


def eligible(tensor: torch.Tensor, p: Any, generator: Any) -> bool:
    return (
        type(tensor) is torch.Tensor
        and tensor.device.type == "cpu"
        and tensor.is_floating_point()
        and tensor.numel() >= MIN_ELEMENTS
        and drawable(p)
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


# --- the random words: torch's generator, NumPy's PCG64DXSM on threads, or a counter hash -------

#: masks of fewer 64-bit words than this draw them from torch's generator (the other methods'
#: set-up would cost more than they save)
HASH_MIN_WORDS = 1 << 16
#: the words each method draws, timed, to choose between them (once per process and thread count)
CALIBRATION_WORDS = 1 << 18
#: another method is chosen where it drew the calibration's words in at most this share of the
#: generator's time: a clear win, so that a machine on which they are close keeps one choice from
#: run to run
HASH_WINS_BELOW = 0.67
#: NumPy draws a mask's words in parts of this many, each from a PCG64DXSM stream of its own
#: (seeded by the mask's key and the part's index), spread over torch's thread count: the words
#: depend on the key and the count only, never on how many threads drew them
NUMPY_PART_WORDS = 1 << 17
#: the methods, by the name ``dropout.json`` and :func:`method` give them
GENERATOR, NUMPY, HASH = "generator", "numpy", "hash"


class Choice(NamedTuple):
    """How large masks draw their words at one thread count, and the calibration's times (ms for
    :data:`CALIBRATION_WORDS` words; None for a method not timed)."""

    method: str
    generator_ms: float
    hash_ms: float | None
    numpy_ms: float | None


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


def numpy_words(count: int, key: int) -> torch.Tensor:
    """``count`` 64-bit words (as int64) from NumPy's PCG64DXSM: part ``i`` of
    :data:`NUMPY_PART_WORDS` words from the stream seeded by ``SeedSequence([key, i])`` (``key``
    as an unsigned 64-bit value). NumPy draws without the GIL, so the parts are drawn on as many
    threads as torch has intra-op threads (a pool of this process's), each straight into its
    slice of the result."""
    import numpy as np

    words = torch.empty(count, dtype=torch.int64)
    out = words.numpy()
    seed = key & ((1 << 64) - 1)
    starts = range(0, count, NUMPY_PART_WORDS)

    def draw(index: int) -> None:
        start = starts[index]
        stop = min(start + NUMPY_PART_WORDS, count)
        stream = np.random.PCG64DXSM(np.random.SeedSequence([seed, index]))
        np.copyto(out[start:stop], stream.random_raw(stop - start).view(np.int64))

    pool = _pool() if len(starts) > 1 else None
    if pool is None:
        for index in range(len(starts)):
            draw(index)
    else:
        for _ in pool.map(draw, range(len(starts))):
            pass
    return words


_pools: dict[tuple[int, int], Any] = {}
_pool_lock = threading.Lock()  # not _lock: the calibration, under _lock, draws through the pool


def _pool() -> Any:
    """This process's thread pool for :func:`numpy_words`, one thread per intra-op thread of
    torch's (None for one thread); a forked child makes its own."""
    threads = torch.get_num_threads()
    if threads < 2:
        return None
    key = (os.getpid(), threads)
    pool = _pools.get(key)
    if pool is None:
        with _pool_lock:
            pool = _pools.get(key)
            if pool is None:
                from concurrent.futures import ThreadPoolExecutor

                pool = _pools[key] = ThreadPoolExecutor(threads, thread_name_prefix="nanopatch-dropout")
    return pool


def _generator_words(count: int, generator: Any) -> torch.Tensor:
    return torch.empty(count, dtype=torch.int64).random_(-(2**63), None, generator=generator)


def draw_words(count: int, generator: Any = None) -> torch.Tensor:
    """``count`` uniformly random int64 values. Torch's CPU generator draws them in one thread
    whatever the tensor's size, one Mersenne-Twister step per 32 bits: on a 16-core AMX Xeon the
    transformer's 24 dropout masks took a third of its training step there (``aten::random_``).
    Where :func:`current_method` measured another method clearly faster on this process's threads,
    a large mask's words come from it instead, under a key drawn from ``generator``, so a seed
    still reproduces them: NumPy's PCG64DXSM on threads (:func:`numpy_words`) or a counter hash
    on torch's (:func:`hash_words`)."""
    if count < HASH_MIN_WORDS:
        return _generator_words(count, generator)
    how = current_method()
    if how == GENERATOR:
        return _generator_words(count, generator)
    key = int(_generator_words(1, generator).item())
    return numpy_words(count, key) if how == NUMPY else hash_words(count, key)


_lock = threading.Lock()
#: torch's intra-op thread count -> how large masks draw there, as measured
chosen: dict[int, Choice] = {}
#: where the measurement is kept for later runs, in nanopatch's cache folder
RECORD_FILE = "dropout.json"


def current_method() -> str:
    """How large masks draw their words at this process's intra-op thread count: measured once
    per count, on :data:`CALIBRATION_WORDS` words drawn by each method (the best of three each,
    from generators of its own, so the run's random stream is untouched), and kept in
    ``dropout.json`` of nanopatch's cache folder for this torch, CPU and thread count: later runs
    on the machine use the same method, so a seed gives them the same masks."""
    threads = torch.get_num_threads()
    found = chosen.get(threads)
    if found is None:
        with _lock:
            found = chosen.get(threads)
            if found is None:
                found = chosen[threads] = _recorded_or_measured(threads)
    return found.method


def machine_key(threads: int) -> str:
    """What a measurement made here holds for, as its record's key starts: this torch, the CPU
    and torch's thread count (the dropout words' and the attention's records)."""
    from nanopatch.foundation import cpu

    return f"torch {torch.__version__}|{cpu.host_facts().model_name}|{threads} threads"


def _recorded_or_measured(threads: int) -> Choice:
    key = machine_key(threads)
    record = records.read_record(key, RECORD_FILE)
    try:
        found = Choice(
            str(record["method"]),  # type: ignore[index]
            float(record["generator_ms"]),  # type: ignore[index]
            optional_ms(record.get("hash_ms")),  # type: ignore[union-attr]
            optional_ms(record.get("numpy_ms")),  # type: ignore[union-attr]
        )
        if found.method in (GENERATOR, NUMPY, HASH):
            return found
    except (TypeError, KeyError, ValueError, AttributeError):
        pass
    found = _calibrate()
    records.write_record(key, {name: _round(value) for name, value in found._asdict().items()}, RECORD_FILE)
    return found


def optional_ms(value: Any) -> float | None:
    """A record's time in ms, or None where it has none."""
    return None if value is None else float(value)


def _round(value: Any) -> Any:
    return round(value, 3) if isinstance(value, float) else value


def _calibrate() -> Choice:
    own = torch.Generator().manual_seed(0)
    generator_s = _best(lambda: _generator_words(CALIBRATION_WORDS, own))
    hash_s = _best(lambda: hash_words(CALIBRATION_WORDS, 1))
    numpy_s = _best(lambda: numpy_words(CALIBRATION_WORDS, 1))
    how, fastest = min(((NUMPY, numpy_s), (HASH, hash_s)), key=lambda item: item[1])
    if fastest > HASH_WINS_BELOW * generator_s:
        how = GENERATOR
    return Choice(how, 1000 * generator_s, 1000 * hash_s, 1000 * numpy_s)


def _best(draw: Any, times: int = 3) -> float:
    draw()  # the first call pays for first use (pages, thread start)
    best = float("inf")
    for _ in range(times):
        start = time.perf_counter()
        draw()
        best = min(best, time.perf_counter() - start)
    return best


def method() -> tuple[Choice, int, int] | None:
    """How large masks draw their words at this thread count: (the :class:`Choice`, the words
    timed, the thread count); None where not measured yet."""
    threads = torch.get_num_threads()
    found = chosen.get(threads)
    return None if found is None else (found, CALIBRATION_WORDS, threads)


def fill_bernoulli(tensor: torch.Tensor, p: float, generator: Any = None) -> torch.Tensor:
    """``tensor.bernoulli_(p)`` from the lanes of :func:`keep_mask`, compared straight into
    ``tensor`` (one pass: no bool mask to convert, which torch does element by element)."""
    n = tensor.numel()
    lanes = draw_words((n + 3) // 4, generator).view(torch.int16)[:n]
    return torch.lt(lanes.view(tensor.shape), round(p * _LANES) - _LANES // 2, out=tensor)


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
