"""The training patch's shared state: one :class:`Plan` per model nanopatch accelerates, the
configuration in force, and the lock that guards both.

A plan says what was done to one model (channels-last, IPEX, fused steps, data-parallel) and
what its training forward really ran in (``computed_in``, ``autocast``, ``training_calls``,
observed on each training call, not planned), for :func:`nanopatch.status`.
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from nanopatch import engine

lock = threading.RLock()
local = threading.local()

_engines: dict[str, Any] = {}


def register_data_parallel(engine: Any) -> None:
    """The data-parallel engine (:mod:`nanopatch.targets.parallel.patch` registers itself when it is
    imported; training never imports it): pairing asks it to wrap the model in DDP
    (``attach(module, model, optimizer)`` -> a wrapper or None, ``world_size()``), and the
    accelerated forward routes a training call through that wrapper (``routes``, ``through``,
    ``pre_forward``, ``post_forward``)."""
    _engines["data_parallel"] = engine


def data_parallel() -> Any:
    """The registered data-parallel engine, or None."""
    return _engines.get("data_parallel")


@dataclasses.dataclass(eq=False)
class State:
    """The training target's own state besides its plans."""

    #: its context (its journal), kept from its first patch on
    ctx: engine.Context | None = None
    #: the options in force while it is applied (from that context), else None
    config: Any = None
    #: what glibc's malloc was told while patched (None where it was left alone)
    malloc: str | None = None


state = State()

#: model -> Plan, for every model nanopatch found while patched (IPEX ones also after)
plans: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


logger = logging.getLogger("nanopatch")


def config() -> Any:
    """The options in force while the training target is applied, else None."""
    return state.config


def context() -> engine.Context:
    """The training target's context: every change training makes after its patch() goes through
    it (a model's forward, a hook, an optimizer's flags), filed under the target."""
    ctx = state.ctx
    if ctx is None:
        raise RuntimeError("nanopatch: the training target has not been applied")
    return ctx


def compiling() -> bool:
    """Whether torch.compile is tracing this call (nanopatch's hooks and kernels stand aside:
    its graph gets stock's operators)."""
    compiler = getattr(torch, "compiler", None)
    return compiler is not None and compiler.is_compiling()


def tls(name: str, default: Any) -> Any:
    """A per-thread value, created with ``default`` on first use."""
    if not hasattr(local, name):
        setattr(local, name, default)
    return getattr(local, name)


@dataclasses.dataclass(eq=False)
class Seen:
    """What one model's training calls were seen to do (observed on each call in grad and training
    mode, not planned)."""

    training_calls: int = 0
    computed_in: str | None = None  # dtype name the forward's floating outputs were computed in
    autocast: str | None = None  # "nanopatch", "framework" (an autocast already on), or None
    fast_dropout: bool = False  # dropout masks of its training forward were drawn fast
    # how large masks drew their words (dropout.method(): the Choice, words timed, threads)
    dropout_method: tuple[Any, int, int] | None = None
    hashed_masks: bool = False  # its compiled forward hashed dropout masks inside its kernels (compiled_masks)
    logit_loss: bool = False  # transformers' causal-LM loss ran on its bf16 logits (loss.causal_lm_loss)
    compiled_calls: int = 0  # training calls that ran the forward nanopatch compiled
    attention_products: bool = False  # attention without dropout ran as bf16 products (attention.plain_attention)

    def observe(self, dtype: torch.dtype | None, autocast: str | None) -> None:
        self.training_calls += 1
        self.autocast = autocast
        if dtype is not None:
            self.computed_in = str(dtype).replace("torch.", "")


@dataclasses.dataclass(eq=False)
class Plan:
    """What nanopatch decided for one model and did to it, and how its forward runs; what its
    training calls were seen to do is :attr:`seen`."""

    name: str
    # decided
    amp_dtype: torch.dtype | None = None  # bf16 autocast dtype, None = off
    amp_eval: bool = True
    rank: int | None = None  # channels-last rank (4 or 5) applied, None = untouched
    ipex: bool = False  # IPEX-optimized (cannot be undone)
    compile_mode: str | bool = False  # the forward's next training call: compiled with this mode, or eager
    compile_choice: str | None = None  # compile="auto"'s decision and its figures, once made
    masks: bool = False  # its training forward may draw dropout masks fast (decided at pairing)
    bf16_measured: str | None = None  # the bf16 trial's decision, once made
    bf16_failed: str | None = None  # why bf16 autocast is off for good: the forward failed under it
    layout_unsafe: str | None = None  # why channels-last goes off at the next step: the forward failed in it
    stock: str | None = None  # why this model runs stock, if it does
    optimizers: list[str] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    # what carries the decisions out
    compiled: Any = None
    compile_trial: Any = None  # compile="auto"'s measurement while it runs (compile_choice.CompileTrial)
    trial: Trial | None = None  # bf16 against fp32 and/or channels-last against not, step by step, while measured
    #: a training call since the last optimizer step ran under a Python dispatch mode
    #: (``FlopCounterMode``): the trials do not time that step (:data:`UNTIMED`)
    odd_step: bool = False
    layout_measured: str | None = None  # the trial's decision on channels-last, once made
    fast_steps: list[Any] = dataclasses.field(default_factory=list)  # weakrefs to optimizers we switched
    heads: list[Any] = dataclasses.field(default_factory=list)  # output activations run in fp32
    gelus: list[Any] = dataclasses.field(default_factory=list)  # GELUs written out, on torch's kernel
    installed: bool = False
    previous_forward: Any = engine.NOTSET
    setup: list[Any] = dataclasses.field(default_factory=list)  # optimizers paired, set up outside the lock
    ddp: Any = None  # the DistributedDataParallel wrapper its training steps go through
    ddp_later: Any = None  # (model, optimizer) weakrefs: nanopatch's DDP wraps it once its layout is decided
    layout: Any = None  # the journal's entry for the channels-last weights nanopatch gave it
    reprobe: bool = False  # probe the next training call (what it computes in changed)
    frozen: Any = None  # bf16 copies of its frozen fp32 parameters (frozen.Copies), made once
    weight: Any = None  # a weakref to its first fp32 weight: the script casting the model shows there
    # seen
    seen: Seen = dataclasses.field(default_factory=Seen)

    @property
    def data_parallel(self) -> bool:
        """Whether it trains data-parallel: through its DDP wrapper, or, until nanopatch's DDP
        wraps it (``ddp_later``), with its gradients averaged before each step."""
        return self.ddp is not None or self.ddp_later is not None

    def describe(self) -> dict[str, Any]:
        return {
            "model": self.name,
            "optimizers": list(self.optimizers),
            "bf16": self.amp_dtype is not None,
            "bf16_eval": self.amp_dtype is not None and self.amp_eval,
            "channels_last": {None: False, 4: "channels_last", 5: "channels_last_3d"}[self.rank],
            "channels_last_measured": self._layout_state(),
            "ipex": self.ipex,
            "compile": self.compile_mode,
            "data_parallel": self.data_parallel,
            "fp32_heads": len(self.heads),
            "gelu_kernel": len(self.gelus),
            "loss_on_bf16_logits": self.seen.logit_loss,
            "attention_products": self.seen.attention_products,
            "attention_timings": None,  # the training target fills it in (attention.timings)
            "stock": self.stock,
            "notes": list(self.notes),
            "training_calls": self.seen.training_calls,
            "computed_in": self.seen.computed_in,
            "autocast": self.seen.autocast,
            "fast_dropout": self.seen.fast_dropout,
            "dropout_words": self._dropout_words() if self.seen.fast_dropout else None,
            "bf16_measured": (
                "measuring"
                if self.trial is not None and self.trial.measures_bf16 and self.bf16_failed is None
                else self.bf16_measured
            ),
            "compile_choice": self._compile_state(),
            "frozen_weights": self._frozen_weights(),
        }

    def layout_now(self) -> int | None:
        """The channels-last rank this training call's inputs get: the plan's, but None on the
        trial's steps in stock's layout."""
        trial = self.trial
        return None if trial is not None and not trial.channels_last else self.rank

    def layout_off(self) -> None:
        """The trial's "off" for channels-last: stock's layout from the next training call on
        (the trial laid the weights out so), and the journal forgets the layout it gave them."""
        if self.layout is not None:
            context().discard(self.layout)  # its undo finds the contiguous strides already there
            self.layout = None
        self.rank = None

    def _layout_state(self) -> str | None:
        if self.trial is not None and self.trial.relayout is not None:
            return "measuring"
        return self.layout_measured

    def bf16_off(self) -> None:
        """The bf16 trial's "off": fp32 from the next training call on, which is probed (it
        computes in fp32 now); no bf16 products, so no copies of frozen weights."""
        self.amp_dtype = None
        self.reprobe = True
        self.frozen = None

    def _frozen_weights(self) -> str | None:
        """How many frozen weights its bf16 products take as copies made once (frozen.Copies)."""
        copies = self.frozen
        if copies is None or copies.kept is None:
            return None
        if not copies.kept:
            return f"cast in every forward, as autocast does: copies made once would not pay ({copies.figures})"
        return (
            f"{copies.count()} frozen weights cast to bf16 once ({copies.bytes() / 2**20:.1f} MiB of copies; "
            f"{copies.figures})"
        )

    def _dropout_words(self) -> str | None:
        if self.seen.hashed_masks:
            return "hashed inside the compiled kernels (each element's index, keyed by a draw of torch's generator)"
        if self.seen.dropout_method is None:
            return None
        choice, words, threads = self.seen.dropout_method
        label = {
            "numpy": f"NumPy PCG64DXSM on {threads} thread{'s' if threads != 1 else ''}",
            "hash": "counter hash",
        }.get(choice.method, "torch generator")
        timed = [("hash", choice.hash_ms), ("NumPy", choice.numpy_ms)]
        others = "".join(f", {name} {ms:.2f}" for name, ms in timed if ms is not None)
        return f"{label} (ms per {words} words: generator {choice.generator_ms:.2f}{others})"

    def _compile_state(self) -> str | None:
        """compile="auto"'s decision; while there is none, "waiting" (eager steps until they have
        cost the compile time expected) or "measuring" (compiled and eager steps compared)."""
        if self.compile_trial is None:
            return self.compile_choice
        return "waiting" if self.compile_trial.phase == "eager" else "measuring"

    def _compiled_part(self) -> str:
        """How many training calls ran compiled, with the mode where it is not the default."""
        calls, total = self.seen.compiled_calls, self.seen.training_calls
        mode = self.compile_mode if isinstance(self.compile_mode, str) and self.compile_mode != "default" else None
        what = f"torch.compile{f' ({mode})' if mode else ''}"
        return what if calls >= total else f"{what} ({calls} of its training calls)"

    def summary(self) -> str:
        """One line: what this model ran with."""
        if self.stock is not None:
            return f"{self.name}: stock ({self.stock})"
        parts = []
        if self.seen.computed_in:
            source = f", {self.seen.autocast} autocast" if self.seen.autocast else ""
            parts.append(f"computed in {self.seen.computed_in}{source}")
        if self.rank is not None:
            parts.append("channels-last")
        if self.ipex:
            parts.append("IPEX")
        if self.seen.compiled_calls:
            parts.append(self._compiled_part())
        if self.seen.fast_dropout:
            how = self.seen.dropout_method[0].method if self.seen.dropout_method is not None else None
            where = {"hash": " (hashed on all threads)", "numpy": " (drawn on all threads)"}.get(how or "", "")
            if self.seen.hashed_masks:
                where = " (hashed inside the compiled kernels)"
            parts.append(f"fast dropout masks{where}")
        if self.seen.attention_products:
            parts.append("attention as bf16 products")
        if self.bf16_measured:
            parts.append("bf16 " + self.bf16_measured.split(" (")[0])
        if self.layout_measured:
            parts.append("channels-last " + self.layout_measured.split(" (")[0])
        if self.gelus:
            parts.append(f"GELU on torch's kernel ({len(self.gelus)} module{'s' if len(self.gelus) != 1 else ''})")
        if self.seen.logit_loss:
            parts.append("causal-LM loss on the bf16 logits")
        if self.frozen is not None and self.frozen.on and self.frozen.count():
            parts.append(f"{self.frozen.count()} frozen weights cast once")
        parts.extend(note for note in self.notes if note.endswith(" step"))
        if self.data_parallel:
            parts.append("data-parallel")
        calls = f"{self.seen.training_calls} training call{'s' if self.seen.training_calls != 1 else ''}"
        return f"{self.name}: {', '.join(parts) or 'nothing applied'} ({calls})"


#: the time a trial's step reports (to the other ranks too, whose all-reduce keeps the largest)
#: where a training call of it ran under a Python dispatch mode: a ``FlopCounterMode`` step (an
#: MFU count) runs eagerly and through Python for every operator, so it is no step of either
#: mode the trial compares. Every rank drops that step from the trial alike.
UNTIMED = float("inf")


def step_time(plan: Any, took: float) -> float:
    """``took``, or :data:`UNTIMED` where a training call of this step ran under a dispatch mode
    (the plan's ``odd_step``, cleared here: each trial reads it at the end of the step)."""
    if not plan.odd_step:
        return took
    plan.odd_step = False
    return UNTIMED


def spread(samples: list[float]) -> float:
    """How far a mode's fastest timing may be from what it runs at: the gap from its fastest to
    its median, as a share of the fastest (0 for fewer than two timings)."""
    if len(samples) < 2:
        return 0.0
    fastest = min(samples)
    return (statistics.median(samples) - fastest) / fastest if fastest > 0 else 0.0


def beyond_noise(first: list[float], second: list[float], margin: float = 0.0) -> tuple[str, float]:
    """Whether the fastest of ``first`` is ``"faster"`` or ``"slower"`` than the fastest of
    ``second`` by more than the timings' noise (the larger :func:`spread` of the two, at least
    ``margin``), or ``"within"`` it; and that noise. The one rule of the bf16 and compile
    measurements."""
    fastest, other = min(first), min(second)
    noise = max(spread(first), spread(second), margin)
    if fastest < other * (1 - noise):
        return "faster", noise
    if fastest > other * (1 + noise):
        return "slower", noise
    return "within", noise


def trial_for(model: nn.Module, bf16: bool, layout: Callable[[bool], None] | None = None) -> Trial | None:
    """The measurement a model gets on its first steps, or None: ``bf16`` against fp32 where
    nanopatch chose bf16 itself (every model is measured, since whether bf16 pays depends on the
    CPU as much as on the model: small convolutions on small images can run slower in bf16 than
    in fp32 on a CPU with AMX, and faster on one without), channels-last against stock's layout
    where nanopatch gave the model channels-last weights itself (``layout`` switches them, with
    their gradients and optimizer state, :func:`.memory_format.relayout`), or both together (the
    one pays or loses with the other: oneDNN's bf16 convolutions want channels-last most).
    Recurrent models (oneDNN's bf16 RNN kernels are not faster than fp32 everywhere) are never
    decided early."""
    if not bf16 and layout is None:
        return None
    recurrent = any(isinstance(sub, nn.RNNBase) for sub in model.modules())
    return Trial(early=None if recurrent else Trial.early, measures_bf16=bf16, relayout=layout)


Mode = tuple[bool, bool]  # (bf16 autocast on, channels-last on) for one step of a trial


@dataclasses.dataclass
class Trial:
    """Measure-and-decide on the first steps of the real run, between the modes nanopatch chose
    and stock's: bf16 autocast or fp32 (where ``measures_bf16``), channels-last weights or stock's
    layout (where there is a ``relayout``), each mode a (bf16, channels-last) pair, the one
    nanopatch chose first and stock's last (:attr:`modes`). After ``warmup`` optimizer steps in
    the chosen mode, the steps go through the others (each one's first step, which sets its
    kernels up, is not counted), then round and round, until each mode has ``rounds`` timings
    (the time from one step's end to the next one's: one whole iteration, from after the switch
    where the weights were laid out again). The fastest, not the median: whatever else the
    script does between steps (logging, a checkpoint, a slow batch) lands on some steps and not
    others, and only lengthens them. The fastest mode wins; where the answer is clear-cut it
    comes sooner: after ``early`` timings of each mode, a mode slower than the fastest one by
    more than 1 / ``clear`` is out (its steps are not run again), and the last one left wins.
    Where the steps are noisy (other work sharing the cores: a mode's median more than
    its fastest), a mode wins only where it is faster than the others by more than that noise
    (:func:`spread`, at least ``margin``); the steps go on until one is, up to ``max_rounds``
    timings of each, and where none is, the mode nearest stock's among those the noise cannot
    tell apart is kept (stock's own, then fp32 in channels-last, then bf16 in stock's layout): a
    script must not compute in bf16 in one run and in fp32 in the next by chance.

    Where the model trains data-parallel, ``agree`` turns this process's time for a step into
    the slowest rank's (an all-reduce, once a step while the trial lasts): every rank then
    records the same times and takes the same decisions at the same step, as the steps of a
    synchronous run go at the slowest rank's pace. Measured apart, two ranks decided bf16 and
    fp32 in one run. ``between`` runs after each step that switches no layout (a DDP wrapper of
    the script's records its gradients' order there, for its buckets to follow the next
    switch); a switch that fails (``relayout`` raises, having put the weights back) ends the
    layout's measuring: the weights keep the layout they have, and bf16 is measured in it."""

    warmup: int = 2
    rounds: int = 4
    max_rounds: int = 8
    margin: float = 0.0
    early: int | None = 2
    clear: float = 0.8
    measures_bf16: bool = True
    relayout: Callable[[bool], None] | None = None
    agree: Callable[[float], float] | None = None  # this rank's step time -> the slowest rank's
    between: Callable[[], None] | None = None  # after each step that switches no layout, while it lasts
    relayout_failed: str | None = None  # why the layout could not be switched (no more layouts measured)
    mode: Mode = (True, True)  # the mode of the iteration running now
    steps: int = 0
    last: float | None = None
    times: dict[Mode, list[float]] = dataclasses.field(default_factory=dict)
    seen: set[Mode] = dataclasses.field(default_factory=set)
    out: set[Mode] = dataclasses.field(default_factory=set)  # clearly slower than another: not run again

    def __post_init__(self) -> None:
        self.modes: list[Mode] = [
            (bf16, layout)
            for bf16 in (True, False)
            if bf16 or self.measures_bf16
            for layout in (True, False)
            if layout or self.relayout is not None
        ]
        self.mode = self.modes[0]
        self.times = {mode: [] for mode in self.modes}
        self.seen = {self.modes[0]}  # its set-up steps are the warm-up

    @property
    def bf16(self) -> bool:
        """Whether this step runs under bf16 autocast (the forward reads it)."""
        return self.mode[0]

    @property
    def channels_last(self) -> bool:
        """Whether this step runs in channels-last (the forward reads it)."""
        return self.mode[1]

    def on_step(self, plan: Plan, now: float | None = None) -> None:
        real = now is None
        now = time.perf_counter() if now is None else now
        if self.last is not None and self.steps > self.warmup:
            took = step_time(plan, now - self.last)
            if self.agree is not None:  # every rank, at every such step: a collective
                took = self.agree(took)
                if real:  # the all-reduce's own time is no step's
                    now = time.perf_counter()
            if took == UNTIMED:  # this rank's step or another's ran under a dispatch mode: again
                self.last = now
                return
            if self.mode in self.seen:
                self.times[self.mode].append(took)
            self.seen.add(self.mode)
        self.last = now
        self.steps += 1
        counted = min(len(self.times[mode]) for mode in self._active())
        if self.early is not None and counted >= self.early:
            best = self._best()
            fastest = self._fastest()
            self.out.update(m for m in self._active() if fastest[best] < fastest[m] * self.clear)
        if len(self._active()) == 1 or (counted >= self.rounds and self._settled(counted)):
            self._decide(plan)
            return
        mode = self._next() if self.steps > self.warmup else self.mode
        if mode[1] == self.mode[1] and self.between is not None:
            self.between()
        if mode != self.mode:
            self._switch(mode)
            if real:  # the next step's time starts once the switch is done
                self.last = time.perf_counter()

    def _next(self) -> Mode:
        """A mode not yet set up runs again (its counted step); else the next one, in order
        after this one, of those with the fewest timings."""
        if self.mode not in self.seen or (self.mode != self.modes[0] and not self.times[self.mode]):
            return self.mode
        active = self._active()
        fewest = min(len(self.times[mode]) for mode in active)
        at = self.modes.index(self.mode)
        ordered = self.modes[at + 1 :] + self.modes[: at + 1]
        return next(mode for mode in ordered if mode in active and len(self.times[mode]) == fewest)

    def _switch(self, mode: Mode) -> None:
        if mode[1] != self.mode[1] and self.relayout is not None and self.relayout_failed is None:
            try:
                self.relayout(mode[1])
            except Exception as exc:  # the weights stay as they are: the other layout is out
                self.relayout_failed = f"{type(exc).__name__}: {exc}"
                logger.warning("channels-last not measured further: switching the layout failed (%s)", exc)
                self.out.update(m for m in self.modes if m[1] == mode[1])
                mode = (mode[0], self.mode[1])
        self.mode = mode

    def _active(self) -> list[Mode]:
        return [mode for mode in self.modes if mode not in self.out]

    def _fastest(self) -> dict[Mode, float]:
        return {mode: min(times) for mode, times in self.times.items() if times}

    def _best(self) -> Mode:
        fastest = self._fastest()
        return min(self._active(), key=lambda mode: fastest[mode])

    def _noise(self) -> float:
        return max(max(spread(self.times[mode]) for mode in self._active()), self.margin)

    def _tied(self) -> list[Mode]:
        """The modes still in whose fastest step is not slower than the fastest one's by more
        than the steps' noise, the one nearest stock's first."""
        best, noise = self._best(), self._noise()
        slower = {m for m in self._active() if beyond_noise(self.times[m], self.times[best], noise)[0] == "slower"}
        return [m for m in reversed(self._active()) if m == best or m not in slower]

    def _settled(self, counted: int) -> bool:
        return self._noise() == 0 or len(self._tied()) == 1 or counted >= self.max_rounds

    def _decide(self, plan: Plan) -> None:
        chosen = self._tied()[0]
        fastest = self._fastest()
        counts = "/".join(map(str, sorted({len(v) for v in self.times.values() if v})))
        noise = self._noise()
        plan.trial = None
        if self.measures_bf16 and plan.bf16_failed is None:  # (failed: its bf16 steps ran in fp32)
            bf16, fp32 = fastest[(True, chosen[1])], fastest[(False, chosen[1])]
            if not chosen[0]:
                plan.bf16_off()
            plan.bf16_measured, note = _measured(chosen[0], bf16, fp32, ("bf16", "fp32"), counts, noise)
            plan.notes.append(f"bf16 autocast {note}")
            logger.info("%s: %s", plan.name, plan.notes[-1])
        if self.relayout is not None and self.relayout_failed is not None:
            if not chosen[1]:
                plan.layout_off()
            plan.layout_measured = f"not measured: switching the layout failed ({self.relayout_failed})"
            plan.notes.append(f"channels-last {plan.layout_measured}")
        elif self.relayout is not None:
            cl, plain = fastest[(chosen[0], True)], fastest[(chosen[0], False)]
            if chosen[1] != self.mode[1]:
                self._switch((self.mode[0], chosen[1]))
            if not chosen[1]:
                plan.layout_off()
            names = ("channels-last", "stock's layout")
            plan.layout_measured, note = _measured(chosen[1], cl, plain, names, counts, noise)
            plan.notes.append(f"channels-last {note}")
            logger.info("%s: %s", plan.name, plan.notes[-1])


def _measured(kept: bool, on: float, off: float, names: tuple[str, str], counts: str, noise: float) -> tuple[str, str]:
    """What a trial decided for one choice (bf16, channels-last), from the fastest steps with it
    ``on`` and ``off``: the plan's ``*_measured`` text and the note's, both with the figures."""
    on_name, off_name = names
    verdict = f"{on_name} {on * 1e3:.1f} ms, {off_name} {off * 1e3:.1f} ms per step (fastest of {counts} steps)"
    if kept:
        return f"kept: measured {verdict}", f"kept: measured {verdict}"
    if on <= off:
        # as long as it measured, the difference stayed within the steps' own noise (other work
        # sharing the cores): stock's choice is the known-safe one
        return (
            f"off: not measured clearly faster than {off_name} for this model on this CPU ({verdict}; "
            f"the steps' noise {noise:.0%})",
            f"off: not clearly faster than {off_name} ({verdict}, noise {noise:.0%})",
        )
    return (
        f"off: measured slower than {off_name} for this model on this CPU ({verdict})",
        f"off: measured slower for this model ({verdict})",
    )
