"""The learning check: does a variant learn as stock? Its first steps recorded from the seed, judged
against stock's, and the rows and lines that say so.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .text import one_line

#: optimizer steps every training variant records from the seed for the learning check (full, --quick)
LEARNING_STEPS = {False: 6, True: 3}
DOES_NOT_LEARN = "does not learn"
_STANDALONE_LEARNING = "_nanopatch_learning_for_bench"


def learning_definition() -> tuple[Any, bool]:
    """(``nanopatch.learning``, standalone): the one definition of "learns as stock" that the
    test suite uses too. In a process that has not imported nanopatch (a stock variant, which
    must not) the same file is loaded on its own, without the package (it imports nothing of
    nanopatch's); ``standalone`` says so."""
    import importlib
    import importlib.util

    if "nanopatch" in sys.modules:
        return importlib.import_module("nanopatch.learning"), False
    if _STANDALONE_LEARNING in sys.modules:
        return sys.modules[_STANDALONE_LEARNING], True
    spec = importlib.util.find_spec("nanopatch")
    assert spec is not None and spec.origin is not None, "nanopatch is not importable"
    path = Path(spec.origin).parent / "foundation" / "learning.py"
    loaded = importlib.util.spec_from_file_location(_STANDALONE_LEARNING, path)
    assert loaded is not None and loaded.loader is not None
    module = importlib.util.module_from_spec(loaded)
    sys.modules[_STANDALONE_LEARNING] = module  # dataclasses look their module up
    loaded.loader.exec_module(module)
    return module, True


class Learning:
    """The first ``steps`` optimizer steps of a training run, recorded by ``nanopatch.learning``'s
    Recorder (the loss backpropagated, the parameters that got a gradient and those updated),
    parameters named by ``models``. :meth:`start` before the first step; :meth:`after_step`
    after each (it stops recording once ``steps`` were taken); ``record``: the steps as dicts."""

    def __init__(self, steps: int, models: Sequence[Any] = ()) -> None:
        self.steps = steps
        self.models = list(models)
        self.record: list[dict[str, Any]] = []
        self._recorder: Any = None
        self._standalone = False

    def start(self) -> Learning:
        if self.steps > 0:
            definition, self._standalone = learning_definition()
            self._recorder = definition.Recorder(self.models).__enter__()
        return self

    def __enter__(self) -> Learning:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def after_step(self) -> None:
        if self._recorder is not None and len(self._recorder.steps) >= self.steps:
            self.stop()

    def stop(self) -> None:
        if self._recorder is None:
            return
        recorder, self._recorder = self._recorder, None
        recorder.__exit__(None, None, None)
        self.record = [step.as_dict() for step in recorder.steps[: self.steps]]
        if self._standalone and "nanopatch" in sys.modules:
            raise RuntimeError("nanopatch was imported while a variant that must not import it was recorded")


def judge(record: Sequence[dict[str, Any]], stock: Sequence[dict[str, Any]] | None, against: str) -> dict[str, Any]:
    """A variant's ``learning`` entry: its loss and gradient count per step beside stock's
    (``against``: the variant it is compared with) and ``nanopatch.learning.compare``'s verdict:
    ``learns`` True or False, or None when there is no stock record to compare with."""
    entry: dict[str, Any] = {
        "against": against,
        "steps": len(record),
        "loss": [s["loss"] for s in record],
        "grads": [len(s["grads"]) for s in record],
    }
    if stock is None:
        return {**entry, "learns": None, "verdict": f"not judged: no {against} run to compare with"}
    from nanopatch.learning import Step, compare

    verdict = compare([Step.from_dict(s) for s in stock], [Step.from_dict(s) for s in record])
    return {
        **entry,
        "stock_loss": [s["loss"] for s in stock],
        "stock_grads": [len(s["grads"]) for s in stock],
        "learns": verdict.learns,
        "verdict": verdict.summary(),
        "problems": verdict.problems,
        "final_difference": verdict.final_difference,
    }


def reference(record: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The ``learning`` entry of the stock row itself: the record the others are judged against."""
    return {
        "against": None,
        "steps": len(record),
        "loss": [s["loss"] for s in record],
        "grads": [len(s["grads"]) for s in record],
        "learns": True if record else None,
        "verdict": "the reference" if record else "not judged: no step recorded",
    }


def learning_entry(
    record: Sequence[dict[str, Any]], stock: Sequence[dict[str, Any]] | None, against: str
) -> dict[str, Any]:
    """:func:`reference` for stock's own record (``record is stock``), else :func:`judge`."""
    return reference(record) if record is stock else judge(record, stock, against)


def learns(r: dict[str, Any]) -> bool | None:
    """A row's verdict (``learning.learns``): None when it has none (not judged, or not training)."""
    return (r.get("learning") or {}).get("learns")


def withhold(r: dict[str, Any]) -> dict[str, Any]:
    """Make row ``r`` of a variant that does not learn as stock give no speed-up: its rate, per-round
    rates, spread, every ratio and target go; its note gives the verdict. Call it before the
    ratios are computed."""
    for key in [k for k in r if k.startswith("ratio") or k in ("rates", "spread", "targets")]:
        del r[key]
    r.update(rate=None, ratio_to_stock=None, rates=[], spread=[], note=one_line(r["learning"]["verdict"], 400))
    return r


#: the timing of a run of fresh processes (:func:`run_ranks`), its ranks' and its row's details:
#: what a variant that does not learn as stock does not keep
RUN_TIMING = ("rate", "seconds", "cpu_s", "wall_s", "step_s", "warmup_s", "setup_s", "cpu_use", "step_s_per_rank")


def learning_row(
    r: dict[str, Any], record: list[dict[str, Any]] | None, stock: list[dict[str, Any]] | None, against: str
) -> dict[str, Any]:
    """Give row ``r`` its ``learning`` entry: ``record`` judged against ``stock``'s (the record of
    the variant named ``against``; ``r`` is that variant's own row when ``record is stock``). A row
    that does not learn as stock keeps no timing (:func:`withhold`, and its details lose
    :data:`RUN_TIMING`). Nothing changes without a record."""
    if record is None:
        return r
    r["learning"] = learning_entry(record, stock, against)
    if r["learning"]["learns"] is False:
        withhold(r)
        if "details" in r:
            r["details"] = {k: v for k, v in r["details"].items() if k not in RUN_TIMING}
    return r


def runs_kept(r: dict[str, Any], results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A variant's run results as its report keeps them: without their timing (:data:`RUN_TIMING`,
    the ranks' too) when its row ``r`` does not learn as stock."""
    if learns(r) is not False:
        return results
    kept = []
    for result in results:
        out = {k: v for k, v in result.items() if k not in RUN_TIMING}
        if "ranks" in out:
            out["ranks"] = [{k: v for k, v in rank.items() if k not in RUN_TIMING} for rank in out["ranks"]]
        kept.append(out)
    return kept


def first_steps(n: int) -> str:
    return "the first step" if n == 1 else f"the first {n} steps"


def learning_line(r: dict[str, Any]) -> str:
    """A row's learning record for a report: its verdict and its loss and gradient count per step
    beside stock's."""
    entry = r["learning"]

    def losses(values: Sequence[float | None]) -> str:
        return " ".join("-" if v is None else f"{v:.4g}" for v in values)

    text = f"`{r['variant']}`: {entry['verdict']}"
    if entry.get("loss"):
        text += f"; loss {losses(entry['loss'])}, grads {'/'.join(map(str, entry['grads']))}"
    if entry.get("stock_loss") is not None:
        grads = "/".join(map(str, entry["stock_grads"]))
        text += f" ({entry['against']}: loss {losses(entry['stock_loss'])}, grads {grads})"
    return text
