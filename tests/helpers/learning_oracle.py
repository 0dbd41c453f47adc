"""The learning oracle: a training function run stock and patched from one seed, step by step,
and the patched run held to learning as stock (:mod:`nanopatch.learning`: the same parameters
get gradients and updates at every step, the loss within bf16's noise of stock's).

The oracle proves learning; it also checks that the patched run accelerated something, so a
run where nanopatch did nothing cannot pass as "learns as stock". A probe inside the model
(the other tests) proves speed.
"""

from __future__ import annotations

import dataclasses
import gc
import random
import re
import warnings
from collections.abc import Callable
from typing import Any

import torch

import nanopatch
from nanopatch import NanopatchWarning
from nanopatch.learning import Recorder, Step, Tolerance, Verdict, compare


@dataclasses.dataclass
class Outcome:
    stock: list[Step]
    patched: list[Step]
    verdict: Verdict
    models: list[dict[str, Any]]  # status()'s training details of the patched run
    result: Any = None  # what the patched train() returned
    warnings: list[str] = dataclasses.field(default_factory=list)  # NanopatchWarnings of the patched run

    def table(self) -> str:
        lines = ["step  optimizer   stock loss  patched loss  grads (stock/patched)  zero (stock/patched)"]
        for row, s, p in zip(self.verdict.rows, self.stock, self.patched, strict=False):
            lines.append(
                f"{row['step']:>4}  {row['optimizer']:<10} {_fmt(s.loss):>11} {_fmt(p.loss):>13}  "
                f"{len(s.grads):>10}/{len(p.grads):<10}  {len(s.zero)}/{len(p.zero)}"
                + (f"  only stock: {row['grad_only_stock'][:4]}" if row["grad_only_stock"] else "")
            )
        return "\n".join(lines)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def seed_everything(seed: int) -> None:
    torch.manual_seed(seed)
    random.seed(seed)
    try:
        import numpy as np

        np.random.seed(seed)
    except ImportError:  # pragma: no cover
        pass


#: what nanopatch may always say in a patched run: an IPEX bf16 model cannot be un-optimized
ALWAYS_ALLOWED = (r"optimized by IPEX in bf16, which cannot be undone",)


def record(
    train: Callable[[], Any], options: dict[str, Any] | None, seed: int = 0
) -> tuple[list[Step], Any, list, list[str]]:
    """``train()`` under a recorder: stock when ``options`` is None, else patched with them.
    Returns the steps, what ``train`` returned, status()'s training details and the
    NanopatchWarnings issued."""
    seed_everything(seed)
    scope = nanopatch.unpatched() if options is None else nanopatch.patched(**options)
    models: list[dict[str, Any]] = []
    earlier = plans_alive_now()

    def snapshot(_: Recorder) -> None:  # while the models are alive (their plans go with them)
        if options is not None:
            models[:] = [plan for plan in training_details() if plan not in earlier]

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", NanopatchWarning)
        with scope, Recorder(on_step=snapshot) as recorder:
            result = train()
    said = [str(w.message) for w in caught if issubclass(w.category, NanopatchWarning)]
    return recorder.steps, result, models, said


def training_details() -> list[dict[str, Any]]:
    """The plans of the models the training target lists in ``status()`` now."""
    return list(nanopatch.status()["targets"].get("training", {}).get("details", []))


def plans_alive_now() -> list[dict[str, Any]]:
    """The plans ``status()`` lists before a run starts, to leave out of the run's own: a model
    IPEX optimized in bf16 stays in ``status()`` while it lives, after unpatch too, and one an
    earlier test in this process left alive is not the run's."""
    gc.collect()
    return training_details()


def accelerated(models: list[dict[str, Any]]) -> bool:
    """Whether a model of the patched run trained with something nanopatch applied."""
    for model in models:
        if model.get("model") is None or model.get("stock") is not None or not model.get("training_calls"):
            continue
        notes = " ".join(model.get("notes", []))
        if (
            model.get("computed_in") == "bfloat16"
            or model.get("fast_dropout")
            or model.get("ipex")
            or model.get("channels_last")
            or " step" in notes
        ):
            return True
    return False


def learns_as_stock(
    train: Callable[[], Any],
    options: dict[str, Any] | None = None,
    *,
    seed: int = 0,
    tolerance: Tolerance | None = None,
    min_steps: int = 1,
    require_acceleration: bool = True,
    expect_warnings: tuple[str, ...] = (),
    final_within: float | None = 0.05,
) -> Outcome:
    """Run ``train`` stock, then patched with ``options`` (default: ``patch_torch()``'s
    defaults), from ``seed``; fail with the per-step table unless the patched run learns as
    stock and accelerated a model. A NanopatchWarning of either run fails it too, unless it
    matches one of ``expect_warnings`` (regular expressions), each of which must be issued.
    ``final_within``: the suite's models are held to a final loss within this of stock's even
    where stock's own noise would allow more (the models are chosen so that it holds)."""
    stock, _, _, stock_said = record(train, None, seed)
    assert not stock_said, f"the stock run issued NanopatchWarnings: {stock_said}"
    patched, result, models, said = record(train, dict(options or {}), seed)
    verdict = compare(stock, patched, tolerance)
    outcome = Outcome(stock, patched, verdict, models, result, said)
    allowed = (*expect_warnings, *ALWAYS_ALLOWED)
    unexpected = [text for text in said if not any(re.search(pattern, text) for pattern in allowed)]
    assert not unexpected, f"the patched run issued NanopatchWarnings: {unexpected}"
    for pattern in expect_warnings:
        assert any(re.search(pattern, text) for text in said), f"no NanopatchWarning matched {pattern!r}: {said}"
    assert len(stock) >= min_steps, f"the stock run took {len(stock)} optimizer steps (expected >= {min_steps})"
    assert verdict.learns, f"{verdict.summary()}\n{outcome.table()}"
    if final_within is not None and verdict.final_difference is not None:
        assert verdict.final_difference <= final_within, (
            f"the final loss is {verdict.final_difference:.1%} from stock's (more than {final_within:.0%})\n"
            f"{outcome.table()}"
        )
    if require_acceleration:
        assert accelerated(models), f"the patched run accelerated nothing: {models}"
    return outcome


def gradients_after(train_steps: Callable[[], list[torch.Tensor]]) -> torch.Tensor:
    """The concatenated gradients a training function returns (for the checkpointing
    identity: the same run with and without activation checkpointing)."""
    grads = train_steps()
    return torch.cat([g.detach().float().flatten() for g in grads])


def relative_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def framework(name: str) -> Any:
    """Import a framework (``lightning.pytorch``, ``transformers``, ...): skip the test when it is
    missing, but fail it when NANOPATCH_TEST_REQUIRE_FRAMEWORKS=1 says it must be there."""
    import importlib
    import os

    import pytest

    if os.environ.get("NANOPATCH_TEST_REQUIRE_FRAMEWORKS") != "1":
        return pytest.importorskip(name)
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        pytest.fail(f"{name} cannot be imported but NANOPATCH_TEST_REQUIRE_FRAMEWORKS=1: {exc}")
