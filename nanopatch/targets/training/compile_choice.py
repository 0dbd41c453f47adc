"""``compile="auto"``: torch.compile for a model only where the run's own steps measure it faster.

Whether ``torch.compile`` pays on a CPU depends on the model, the CPU and the torch: on a 2-core
AMD EPYC without native bf16 the bench's transformer ran 2.9-3.3 s per step eagerly and 3.3-5.8 s
compiled, after about a minute of compiling; on a 16-core Xeon with AMX compiled ran 0.90x eager.
So ``auto`` decides per model, on the run's own optimizer steps (one iteration = the time from one
``optimizer.step()``'s end to the next one's), the way the bf16 trial of :mod:`.plan` does:

1. **Eager first.** The model trains eagerly (after the bf16 trial, when there is one) and its
   iterations are timed. Compiling is tried only once the run has spent, in eager iterations,
   as long as compiling is expected to take (the time an earlier run measured for this model on
   this machine, else :data:`PRIOR_COMPILE_S`) and at least :data:`MIN_STEPS` of them: a short
   script never pays for a compile it cannot win back, and a long one risks at most what it has
   already run (the ski-rental rule).
2. **Compile, then duel.** The next training call compiles (that iteration's excess over the
   eager one is the compile time); then the iterations alternate between the compiled and the
   eager forward (both stay built; switching costs nothing) until each has
   ``CompileTrial.rounds`` timings and the faster is ahead by more than the noise of those
   timings (the gap between a mode's fastest and its median), or
   ``CompileTrial.max_rounds`` each. Compiled stays only where it was clearly faster;
   otherwise eager, the known-safe choice.
3. **Fall back.** A compile error, or more than :data:`GRAPH_LIMIT` graphs (graph breaks or
   recompiles), ends the trial at once with eager.
   In data-parallel training (a ``DistributedDataParallel`` over two processes or more) the
   ranks agree: each step's time is the slowest rank's and a failure is any rank's (one
   all-reduce a step while the trial lasts), so every rank compiles at the same step and keeps
   the same forward; a rank whose compile failed runs eagerly until that step's end, where every
   rank ends the trial together (one that ended it alone would leave the others waiting in the
   all-reduce).
4. **Remember.** The decision, the compile time and both step times are kept per model and
   machine (``NANOPATCH_CACHE_DIR``, else ``$XDG_CACHE_HOME/nanopatch``, else
   ``~/.cache/nanopatch``; ``compile.json``), keyed by the model's class and parameter shapes,
   torch's version, the CPU and its threads: the next run of the script does not compile where
   compiling measured slower, and expects the compile time it measured.

The choice and its figures are in ``status()`` (the model's ``compile_choice``), ``-v`` and
``--compare``'s summary.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import logging
import time
from collections.abc import Callable
from typing import Any

import torch

from nanopatch.foundation.records import cache_dir, read_record, write_record

from .plan import UNTIMED, beyond_noise, step_time

logger = logging.getLogger("nanopatch")

#: more graphs than this from one model's forward (graph breaks, recompiles): eager
GRAPH_LIMIT = 8
#: the compile time expected where no earlier run measured it (a minute: the bench's transformer
#: took 53-69 s to compile on a 2-core EPYC and a 16-core Xeon)
PRIOR_COMPILE_S = 60.0
#: eager steps timed, at least, before compiling is tried
MIN_STEPS = 30
#: the record file's name in the cache folder
RECORD_FILE = "compile.json"


def model_key(model: torch.nn.Module, mode: str) -> str:
    """What a record is filed under: the model's class and parameter shapes, the compile mode,
    torch's version, this CPU and the threads torch uses."""
    from nanopatch.foundation import cpu

    shapes = hashlib.sha1(
        ";".join(f"{name}:{tuple(p.shape)}:{p.dtype}" for name, p in model.named_parameters()).encode()
    ).hexdigest()[:12]
    facts = cpu.host_facts()
    cls = type(model)
    return (
        f"{cls.__module__}.{cls.__qualname__}|{shapes}|{mode}|torch {torch.__version__}|"
        f"{facts.model_name}|{torch.get_num_threads()} threads"
    )


def start(plan: Any, model: torch.nn.Module, mode: str = "default") -> None:
    """``compile="auto"`` for a newly paired model: it runs eagerly, measured by a
    :class:`CompileTrial`, unless an earlier run on this machine measured compiling slower."""
    plan.compile_mode = False
    try:
        key: str | None = model_key(model, mode)
    except Exception:  # a model whose parameters cannot be listed: no record
        key = None
    record = read_record(key, RECORD_FILE) if key is not None else None
    if record is not None and record.get("compiled") is False:
        plan.compile_choice = (
            f"eager: an earlier run on this machine measured torch.compile slower for this model "
            f"({record.get('date', '?')}: compiled {record.get('compiled_ms', '?')} ms, eager "
            f"{record.get('eager_ms', '?')} ms per step; {cache_dir() / RECORD_FILE})"
        )
        plan.notes.append(f"compile=auto: {plan.compile_choice}")
        return
    plan.compile_trial = CompileTrial(mode=mode, key=key, record=record)


def agree_ranks(plan: Any, agree: Callable[[list[float]], list[float]]) -> None:
    """Data-parallel training: every rank runs the trial, or none does (a rank whose own record
    skipped it, with other threads or another CPU, would leave the others waiting in the trial's
    all-reduce); the trial then agrees on each step (:class:`CompileTrial`'s ``agree``). Called
    on every rank as the model is set up."""
    trial = plan.compile_trial
    skipped = agree([0.0 if trial is not None else 1.0])[0]
    if trial is None:
        return
    if skipped:
        trial.decide(plan, False, "another rank's record of an earlier run measured torch.compile slower")
    else:
        trial.agree = agree


def graph_count() -> int:
    """The graphs torch.compile has made in this process so far."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return 0
    return int(counters["stats"]["unique_graphs"])


@dataclasses.dataclass
class CompileTrial:
    """The measurement behind ``compile="auto"`` for one model (see the module's docstring).
    ``on_step`` is called at the end of each of the model's optimizer steps; ``decide`` ends the
    trial early (a compile error). The plan's ``compile_mode`` says which forward the next
    iteration runs: ``mode`` (compiled) or False (eager)."""

    mode: str = "default"
    key: str | None = None
    prior_compile_s: float = dataclasses.field(default_factory=lambda: PRIOR_COMPILE_S)
    min_steps: int = dataclasses.field(default_factory=lambda: MIN_STEPS)
    rounds: int = 3
    max_rounds: int = 8
    margin: float = 0.02
    phase: str = "eager"  # "eager", "compiling", "duel"
    last: float | None = None
    eager_spent: float = 0.0
    eager_steps: int = 0
    recent: list[float] = dataclasses.field(default_factory=list)  # the last eager iterations
    times: dict[bool, list[float]] = dataclasses.field(default_factory=lambda: {True: [], False: []})
    compile_s: float | None = None
    graphs_before: int = 0
    record: dict[str, Any] | None = None
    compiled_now: bool = False  # the forward the iteration running now uses
    agree: Callable[[list[float]], list[float]] | None = None  # (step time, failed) -> the ranks' maxima
    failed: str | None = None  # why compiling failed here, waiting for the step's end to agree on

    def expected_compile_s(self) -> float:
        if self.record and isinstance(self.record.get("compile_s"), (int, float)):
            return float(self.record["compile_s"])
        return self.prior_compile_s

    def on_step(self, plan: Any, now: float | None = None) -> None:
        real = now is None
        now = time.perf_counter() if now is None else now
        last, self.last = self.last, now
        if last is None:
            return
        took = step_time(plan, now - last)
        if self.phase == "duel" and self.failed is None:
            graphs = graph_count() - self.graphs_before
            if graphs > GRAPH_LIMIT:
                self.failed = f"torch.compile made {graphs} graphs of it (graph breaks or recompiles)"
        if self.agree is not None:  # every rank, at every step of the trial: a collective
            took, failed = self.agree([took, 1.0 if self.failed else 0.0])
            if failed and self.failed is None:
                self.failed = "torch.compile failed on another rank"
            if real:  # the all-reduce's own time is no step's
                self.last = time.perf_counter()
        if self.failed is not None:
            self.decide(plan, False, self.failed)
            return
        if took == UNTIMED:  # a step under a dispatch mode ran eagerly, whatever the phase: again
            return
        if self.phase == "eager":
            self._eager(plan, took)
        elif self.phase == "compiling":
            self._compiled_first(plan, took)
        else:
            self.times[self.compiled_now].append(took)
            self._duel(plan)

    def _eager(self, plan: Any, took: float) -> None:
        self.eager_spent += took
        self.eager_steps += 1
        self.recent = [*self.recent, took][-self.rounds :]
        if self.eager_steps < self.min_steps or self.eager_spent < self.expected_compile_s():
            return
        self.phase = "compiling"
        self.graphs_before = graph_count()
        self.compiled_now = True
        plan.compile_mode = self.mode
        logger.info(
            "%s: compile=auto tries torch.compile after %d eager steps (%.0f s)",
            plan.name,
            self.eager_steps,
            self.eager_spent,
        )

    def _compiled_first(self, plan: Any, took: float) -> None:
        self.compile_s = max(0.0, took - min(self.recent))
        self.phase = "duel"
        self._switch(plan, False)  # eager next, then alternating

    def _duel(self, plan: Any) -> None:
        counted = min(len(v) for v in self.times.values())
        if counted >= self.rounds:
            compiled, eager = min(self.times[True]), min(self.times[False])
            verdict, noise = beyond_noise(self.times[True], self.times[False], self.margin)
            if verdict != "within" or counted >= self.max_rounds:
                figures = (
                    f"compiled {compiled * 1e3:.0f} ms, eager {eager * 1e3:.0f} ms per step "
                    f"(fastest of {counted} each), {self.compile_s:.0f} s to compile"
                )
                if verdict == "faster":
                    self.decide(plan, True, f"measured faster: {figures}", compiled=compiled, eager=eager)
                elif verdict == "slower":
                    self.decide(plan, False, f"measured slower: {figures}", compiled=compiled, eager=eager)
                else:
                    self.decide(
                        plan,
                        False,
                        f"not measured clearly faster (within the steps' noise of {noise:.0%}): {figures}",
                        compiled=compiled,
                        eager=eager,
                    )
                return
        self._switch(plan, not self.compiled_now)

    def _switch(self, plan: Any, compiled: bool) -> None:
        self.compiled_now = compiled
        plan.compile_mode = self.mode if compiled else False

    def fail(self, plan: Any, why: str) -> None:
        """Compiling failed (``why``): eager from the next call on, and the trial ends now, or,
        where the ranks agree, at the end of this step on every rank together."""
        plan.compile_mode = False
        if self.agree is None:
            self.decide(plan, False, why)
        elif self.failed is None:
            self.failed = why

    def decide(
        self, plan: Any, keep: bool, why: str, compiled: float | None = None, eager: float | None = None
    ) -> None:
        """End the trial: the model runs compiled (``keep``) or eagerly from the next call on."""
        plan.compile_trial = None
        plan.compile_mode = self.mode if keep else False
        if not keep:
            plan.compiled = None  # the compiled code is not kept around
        plan.compile_choice = f"{'compiled' if keep else 'eager'}: {why}"
        plan.notes.append(f"compile=auto: {plan.compile_choice}")
        logger.info("%s: compile=auto chose %s", plan.name, plan.compile_choice)
        if self.key is not None and compiled is not None and eager is not None:
            write_record(
                self.key,
                {
                    "compiled": keep,
                    "compile_s": round(self.compile_s or 0.0, 2),
                    "compiled_ms": round(compiled * 1e3, 2),
                    "eager_ms": round(eager * 1e3, 2),
                    "date": datetime.date.today().isoformat(),
                },
                RECORD_FILE,
            )
