"""What "learns as stock" means, as code: a record of each optimizer step of a training run,
and the comparison of a patched run's records with the stock run's.

A patched run learns as stock when

* at every optimizer step, exactly the parameters that got a gradient in the stock run got one
  (the autograd graph reached them: ``grad`` is set), none of them inf or nan where stock's is
  finite;
* every parameter whose gradient is non-zero at some stock step has a non-zero gradient at some
  patched step (a cut graph under ``zero_grad(set_to_none=False)`` leaves zeros, not None; a
  single zero can be bf16 rounding, a 2-class head's bias summing to exactly 0 say);
* every parameter stock updates is updated, and no other but those stock gives a non-zero
  gradient (an update is a move larger than fp32's rounding: some element changes by more than
  4 units in its last place; a gradient that is zero but for rounding, a convolution's bias
  before a batch norm, moves its parameter by less than that in fp32 and by more in bf16);
* the loss follows stock's: within ``Tolerance.final`` over the last steps and within
  ``Tolerance.step`` over any few steps, or within stock's own step-to-step noise where that is
  larger, and finite wherever stock's is.

Parameters are named by the model that holds them. The tolerances are bf16's noise, with
dropout masks drawn from another random stream: see :class:`Tolerance`. The test suite's
learning oracle, the bench and ``python -m nanopatch --verify`` all use this module, so the
three say the same thing.

:class:`Recorder` records a run without knowing its training loop: torch's global optimizer
step hooks (and an instance-level ``step`` such as IPEX's fused one, wrapped when it appears)
mark the steps; ``torch.autograd.backward`` is watched for the loss (the mean of the scalar
losses backpropagated since the previous step). It works the same around a plain loop, a
closure step (Lightning), a framework's wrapped optimizer (Hugging Face) and several
optimizers (a GAN: their steps are recorded in the order they run).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import threading
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import nn


@dataclasses.dataclass(frozen=True)
class Step:
    """One optimizer step: the loss backpropagated for it, the parameters that had a
    gradient when it ran (``grads``; ``zero``: those whose gradient was all zeros;
    ``nonfinite``: inf or nan in it) and those it changed by more than rounding (``updated``)."""

    optimizer: str
    loss: float | None
    grads: frozenset[str]
    updated: frozenset[str]
    zero: frozenset[str] = frozenset()
    nonfinite: frozenset[str] = frozenset()

    @property
    def nonzero(self) -> frozenset[str]:
        return self.grads - self.zero

    def as_dict(self) -> dict[str, Any]:
        return {
            "optimizer": self.optimizer,
            "loss": self.loss,
            "grads": sorted(self.grads),
            "updated": sorted(self.updated),
            "zero": sorted(self.zero),
            "nonfinite": sorted(self.nonfinite),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Step:
        return cls(
            data["optimizer"],
            data["loss"],
            frozenset(data["grads"]),
            frozenset(data["updated"]),
            frozenset(data.get("zero", ())),
            frozenset(data.get("nonfinite", ())),
        )


@dataclasses.dataclass(frozen=True)
class Tolerance:
    """How far a patched run's loss may be from stock's and still learn as stock.

    A difference is taken relative to stock's loss, or to ``floor`` times stock's first loss
    once stock's falls below that (near zero, a relative difference says nothing).
    ``final``: the mean loss over the last ``window`` steps. ``step``: the mean over any
    ``window`` consecutive steps, looser because a few small batches are noisier.

    Both widen to ``noise`` times stock's own step-to-step noise (the median relative change of
    its loss from one step of an optimizer to its next) where that is larger: bf16 rounding
    and dropout masks from another stream move a run by about what its batches move it, and a
    run whose loss leaps between steps (a ResNet trained from scratch on small batches) moves
    apart from stock as far under bf16 autocast written by hand. A gradient path cut, a NaN, a
    log(0) or a run learning at another pace stays far outside."""

    final: float = 0.05
    step: float = 0.25
    window: int = 3
    floor: float = 0.1
    noise: float = 1.0

    def bounds(self, stock_noise: float) -> tuple[float, float]:
        """(final, step) for a stock run with this step-to-step noise."""
        return max(self.final, self.noise * stock_noise), max(self.step, 2 * self.noise * stock_noise)


@dataclasses.dataclass
class Verdict:
    """The comparison: ``learns`` and, when it does not, ``problems`` in plain words; ``rows``
    has one entry per step (losses, their relative difference, parameters whose gradient or
    update is in one run only)."""

    learns: bool
    problems: list[str]
    rows: list[dict[str, Any]]
    final_difference: float | None
    stock_noise: float = 0.0  # stock's median relative loss change between an optimizer's steps
    final_bound: float = 0.0  # the final-loss bound applied (Tolerance.bounds)

    def summary(self) -> str:
        if self.learns:
            final = ""
            if self.final_difference is not None:
                final = f", final loss within {self.final_difference:.1%}"
                if self.final_bound > Tolerance.final:
                    final += f" (stock's own loss moves {self.stock_noise:.0%} from step to step)"
            return f"learns as stock ({len(self.rows)} steps: the same parameters got gradients and updates{final})"
        return "does not learn as stock: " + "; ".join(self.problems)


def _relative(a: float, b: float, scale: float = 0.0) -> float:
    return abs(a - b) / max(abs(b), scale, 1e-8)


def _fmt(value: float | None) -> str:
    return "none" if value is None else f"{value:.4g}"


def _percent(value: float) -> str:
    return "infinitely far" if math.isinf(value) else f"{value:.1%}"


def _names(found: Iterable[str], limit: int = 6) -> str:
    found = sorted(found)
    shown = ", ".join(found[:limit])
    return shown + (f" and {len(found) - limit} more" if len(found) > limit else "")


def _scale(stock: Sequence[Step], floor: float) -> float:
    """The smallest loss a difference is taken relative to: ``floor`` times stock's first
    finite loss."""
    for step in stock:
        if step.loss is not None and math.isfinite(step.loss):
            return floor * abs(step.loss)
    return 0.0


def stock_noise(stock: Sequence[Step], scale: float = 0.0) -> float:
    """The median relative change of stock's loss from one step of an optimizer to its next."""
    last: dict[str, float] = {}
    changes = []
    for step in stock:
        if step.loss is None or not math.isfinite(step.loss):
            continue
        previous = last.get(step.optimizer)
        if previous is not None:
            changes.append(_relative(step.loss, previous, scale))
        last[step.optimizer] = step.loss
    if not changes:
        return 0.0
    changes.sort()
    middle = len(changes) // 2
    return changes[middle] if len(changes) % 2 else (changes[middle - 1] + changes[middle]) / 2


def _row(index: int, s: Step, p: Step, scale: float) -> dict[str, Any]:
    row: dict[str, Any] = {
        "step": index + 1,
        "optimizer": s.optimizer,
        "stock_loss": s.loss,
        "patched_loss": p.loss,
        "loss_difference": None,
        "stock_grads": len(s.grads),
        "patched_grads": len(p.grads),
        "grad_only_stock": sorted(s.grads - p.grads),
        "grad_only_patched": sorted(p.grads - s.grads),
        "nonfinite_patched": sorted(p.nonfinite - s.nonfinite),
        "update_only_stock": sorted(s.updated - p.updated),
        "update_only_patched": sorted(p.updated - s.updated),
    }
    if s.loss is not None and p.loss is not None and math.isfinite(s.loss):
        row["loss_difference"] = math.inf if not math.isfinite(p.loss) else _relative(p.loss, s.loss, scale)
    return row


def _update_problems(stock: Sequence[Step], patched: Sequence[Step]) -> list[str]:
    """Parameters stock updates that the patched run never updated, and the other way round."""
    problems = []
    updated_stock, updated_patched = _union(s.updated for s in stock), _union(p.updated for p in patched)
    if updated_stock - updated_patched:
        missing = updated_stock - updated_patched
        problems.append(f"{len(missing)} parameter(s) stock updates were never updated patched ({_names(missing)})")
    # a parameter stock gives a non-zero gradient it may move by less than rounding, where bf16's
    # noise moves it more: a convolution's bias before a batch norm (the norm takes the mean
    # away, so its gradient is zero but for rounding), a norm's scale where the next norm undoes it
    extra = updated_patched - updated_stock - _union(s.nonzero for s in stock)
    if extra:
        problems.append(
            f"{len(extra)} parameter(s) stock never updates (nor gives a non-zero gradient) were updated "
            f"patched ({_names(extra)})"
        )
    return problems


def compare(stock: Sequence[Step], patched: Sequence[Step], tolerance: Tolerance | None = None) -> Verdict:
    """Whether the patched steps learn as the stock ones (see the module's text)."""
    tolerance = tolerance or Tolerance()
    if not stock:
        return Verdict(False, ["the stock run took no optimizer step"], [], None)
    problems: list[str] = []
    if len(patched) < len(stock):
        problems.append(f"the patched run took {len(patched)} optimizer steps, stock {len(stock)}")
    scale = _scale(stock, tolerance.floor)
    noise = stock_noise(stock, scale)
    final_bound, step_bound = tolerance.bounds(noise)
    rows = [_row(i, s, p, scale) for i, (s, p) in enumerate(zip(stock, patched, strict=False))]
    for row in rows:
        parts = []
        if row["grad_only_stock"]:
            parts.append(
                f"{len(row['grad_only_stock'])} of {row['stock_grads']} parameters that got a gradient in stock got "
                f"none patched ({_names(row['grad_only_stock'])})"
            )
        if row["grad_only_patched"]:
            parts.append(f"{len(row['grad_only_patched'])} got one only patched ({_names(row['grad_only_patched'])})")
        if row["nonfinite_patched"]:
            parts.append(f"inf or nan in the gradient of {_names(row['nonfinite_patched'])}")
        if parts:
            problems.append(f"at step {row['step']}, " + " and ".join(parts))
            break
    n = len(rows)
    never = _union(s.nonzero for s in stock[:n]) - _union(p.nonzero for p in patched[:n])
    if never:
        problems.append(
            f"{len(never)} parameter(s) with a non-zero gradient in stock never got one patched ({_names(never)})"
        )
    problems.extend(_update_problems(stock[:n], patched[:n]))
    for end in range(1, n + 1):
        window = _window_difference(stock, patched, end, tolerance.window, scale)
        if window is not None and window > step_bound:
            row = rows[end - 1]
            problems.append(
                f"up to step {end} the loss is {_percent(window)} from stock's (over {min(tolerance.window, end)} "
                f"steps; more than {step_bound:.0%}; at that step {_fmt(row['patched_loss'])} patched against "
                f"{_fmt(row['stock_loss'])} stock)"
            )
            break
    final = _window_difference(stock, patched, n, tolerance.window, scale)
    if final is not None and final > final_bound:
        widened = f", stock's own step-to-step noise being {noise:.0%}" if final_bound > tolerance.final else ""
        problems.append(
            f"over the last {min(tolerance.window, n)} steps the mean loss is {_percent(final)} from stock's "
            f"(more than {final_bound:.0%}{widened})"
        )
    return Verdict(not problems, problems, rows, final, noise, final_bound)


def _union(sets: Iterable[frozenset[str]]) -> set[str]:
    found: set[str] = set()
    for names in sets:
        found |= names
    return found


def _window_difference(
    stock: Sequence[Step], patched: Sequence[Step], end: int, window: int, scale: float
) -> float | None:
    """The relative difference of the two runs' mean losses over the ``window`` steps that
    end at step ``end`` (1-based)."""
    start = max(0, end - window)
    pairs = [(s.loss, p.loss) for s, p in zip(stock[start:end], patched[start:end], strict=False)]
    pairs = [(s, p) for s, p in pairs if s is not None and p is not None and math.isfinite(s)]
    if not pairs:
        return None
    s_mean = sum(s for s, _ in pairs) / len(pairs)
    p_mean = sum(p for _, p in pairs) / len(pairs)
    return math.inf if not math.isfinite(p_mean) else _relative(p_mean, s_mean, scale)


# --- recording a run ------------------------------------------------------------------

_local = threading.local()


class internal:
    """While entered in a thread, that thread's optimizer steps and backward passes are not the
    run's: a :class:`Recorder` ignores them (nanopatch's own self-check probes run so)."""

    def __enter__(self) -> None:
        _local.internal = getattr(_local, "internal", 0) + 1

    def __exit__(self, *exc: Any) -> None:
        _local.internal -= 1


def internal_now() -> bool:
    """Whether this thread runs nanopatch's own steps (inside :class:`internal`)."""
    return getattr(_local, "internal", 0) > 0


def _gradient_state(grad: torch.Tensor | None) -> tuple[bool, bool, bool]:
    """(has a gradient, it is all zeros, it holds inf or nan)."""
    if grad is None:
        return False, False, False
    if grad.is_sparse:
        grad = grad.coalesce().values()
    finite = bool(torch.isfinite(grad).all())
    return True, finite and not bool(grad.ne(0).any()), not finite


class Recorder:
    """Records every optimizer step taken while it is entered (see the module's text).

    ``models``: the modules whose parameter names the records use; when none is given, the
    largest module (by parameter count) holding an optimizer's parameters is looked up when
    that optimizer first steps. ``on_step(recorder)`` runs after each recorded step (``--verify``
    stops a run there)."""

    def __init__(self, models: Iterable[nn.Module] = (), on_step: Callable[[Recorder], None] | None = None) -> None:
        self.steps: list[Step] = []
        self._models = list(models)
        self._on_step = on_step
        self._losses: list[float] = []
        self._before: dict[int, dict[str, torch.Tensor]] = {}
        self._roots: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # optimizer -> modules naming it
        self._labels: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # optimizer -> its label
        self._wrapped: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # optimizer -> our instance step
        self._known: weakref.WeakSet = weakref.WeakSet()
        self._handles: list[Any] = []
        self._backward: Any = None
        self._init: Any = None
        self._lock = threading.RLock()
        self._depth = 0

    # entering and leaving ---------------------------------------------------------------

    def __enter__(self) -> Recorder:
        from torch.optim import optimizer as optimizer_mod

        self._handles = [
            optimizer_mod.register_optimizer_step_pre_hook(self._global_pre),
            optimizer_mod.register_optimizer_step_post_hook(self._global_post),
        ]
        for obj in _live(torch.optim.Optimizer):
            self._known.add(obj)
        init = torch.optim.Optimizer.__dict__["__init__"]
        known = self._known

        def optimizer_init(optimizer: Any, *args: Any, **kwargs: Any) -> None:
            init.__get__(optimizer, type(optimizer))(*args, **kwargs)  # bound: a wrapper of it sees the instance
            if not internal_now():
                known.add(optimizer)

        optimizer_init.__wrapped__ = init  # type: ignore[attr-defined]
        self._init = init
        torch.optim.Optimizer.__init__ = optimizer_init  # type: ignore[method-assign]
        original = torch.autograd.backward
        recorder = self

        def backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
            if not internal_now():
                recorder._note_loss(tensors)
                recorder._wrap_instance_steps()
            return original(tensors, *args, **kwargs)

        backward.__wrapped__ = original  # type: ignore[attr-defined]
        self._backward = original
        torch.autograd.backward = backward
        return self

    def __exit__(self, *exc: Any) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        if self._init is not None:
            torch.optim.Optimizer.__init__ = self._init  # type: ignore[method-assign]
            self._init = None
        if self._backward is not None:
            torch.autograd.backward = self._backward
            self._backward = None
        for optimizer, (ours, theirs) in list(self._wrapped.items()):
            if optimizer.__dict__.get("step") is ours:
                optimizer.__dict__["step"] = theirs
        self._wrapped = weakref.WeakKeyDictionary()

    # the loss -----------------------------------------------------------------------------

    def _note_loss(self, tensors: Any) -> None:
        root = tensors[0] if isinstance(tensors, (tuple, list)) and tensors else tensors
        if isinstance(root, torch.Tensor) and root.numel() == 1:
            self._losses.append(float(root.detach().float().item()))

    # the steps ----------------------------------------------------------------------------

    def _wrap_instance_steps(self) -> None:
        """Optimizers whose ``step`` is an instance attribute (IPEX's fused step) bypass the
        global hooks: wrap it, once per new step function."""
        for optimizer in list(self._known):
            own = optimizer.__dict__.get("step")
            if own is None or (optimizer in self._wrapped and self._wrapped[optimizer][0] is own):
                continue
            self._wrapped[optimizer] = (self._instance_step(optimizer, own), own)
            optimizer.__dict__["step"] = self._wrapped[optimizer][0]

    def _instance_step(self, optimizer: Any, own: Callable[..., Any]) -> Callable[..., Any]:
        def step(*args: Any, **kwargs: Any) -> Any:
            self._pre(optimizer)
            try:
                return own(*args, **kwargs)
            finally:
                self._post(optimizer)

        # the wrapped step's marks go with it: an LR scheduler makes the instance step its own
        # wrapper, marked ``_wrapped_by_lr_sched``, and warns that "optimizer.step() has been
        # overridden after learning rate scheduler initialization" where the mark is gone
        functools.update_wrapper(step, own, assigned=("__doc__",), updated=("__dict__",))
        return step

    def _global_pre(self, optimizer: Any, args: tuple, kwargs: dict) -> None:
        if internal_now():
            return
        self._known.add(optimizer)
        if optimizer not in self._wrapped:
            self._pre(optimizer)

    def _global_post(self, optimizer: Any, args: tuple, kwargs: dict) -> None:
        if not internal_now() and optimizer not in self._wrapped:
            self._post(optimizer)

    def track(self, optimizer: Any) -> None:
        """Record this optimizer's steps also when it has only an instance-level step."""
        self._known.add(optimizer)
        self._wrap_instance_steps()

    def label(self, optimizer: Any) -> str:
        """The optimizer's name in the records: its class, ``Adam#2`` for the second optimizer
        of a class to step (a GAN's two Adams)."""
        found = self._labels.get(optimizer)
        if found is None:
            name = type(optimizer).__name__
            same = sum(1 for other in self._labels.values() if other.split("#")[0] == name)
            found = self._labels[optimizer] = name if not same else f"{name}#{same + 1}"
        return found

    def named_parameters(self) -> dict[str, torch.Tensor]:
        """Every parameter of the optimizers that have stepped, by the names the records use;
        a name two optimizers' models share is prefixed with the optimizer's label."""
        named: dict[str, torch.Tensor] = {}
        for optimizer in list(self._labels.keys()):
            for name, param in self._named(optimizer).values():
                if named.get(name, param) is not param:
                    name = f"[{self.label(optimizer)}] {name}"
                named.setdefault(name, param)
        return named

    def _named(self, optimizer: Any) -> dict[int, tuple[str, torch.Tensor]]:
        params = [p for group in optimizer.param_groups for p in group["params"]]
        roots = self._roots.get(optimizer)
        if roots is None:
            roots = self._models or _holders(params)
            self._roots[optimizer] = roots
        names: dict[int, tuple[str, torch.Tensor]] = {}
        for index, root in enumerate(roots):
            prefix = f"{type(root).__name__}." if len(roots) > 1 else ""
            if len(roots) > 1 and sum(type(r) is type(root) for r in roots) > 1:
                prefix = f"{type(root).__name__}[{index}]."
            for name, param in root.named_parameters(remove_duplicate=False):
                names.setdefault(id(param), (prefix + name, param))
        for i, param in enumerate(params):
            names.setdefault(id(param), (f"<param {i} of {type(optimizer).__name__}>", param))
        return {id(p): names[id(p)] for p in params}

    def _pre(self, optimizer: Any) -> None:
        with self._lock:
            self._depth += 1
            if self._depth > 1:
                return
            self._known.add(optimizer)
            named = self._named(optimizer)
            self._before[id(optimizer)] = {name: p.detach().clone() for name, p in named.values()}

    def _post(self, optimizer: Any) -> None:
        with self._lock:
            self._depth -= 1
            if self._depth > 0:
                return
            before = self._before.pop(id(optimizer), {})
            named = self._named(optimizer)
            grads, zero, updated, nonfinite = set(), set(), set(), set()
            for name, param in named.values():
                got, zeros, bad = _gradient_state(param.grad)
                if got:
                    grads.add(name)
                if zeros:
                    zero.add(name)
                if bad:
                    nonfinite.add(name)
                old = before.get(name)
                if old is not None and _moved(old, param.detach()):
                    updated.add(name)
            losses, self._losses = self._losses, []
            loss = sum(losses) / len(losses) if losses else None
            self.steps.append(
                Step(
                    self.label(optimizer),
                    loss,
                    frozenset(grads),
                    frozenset(updated),
                    frozenset(zero),
                    frozenset(nonfinite),
                )
            )
        if self._on_step is not None:
            self._on_step(self)


#: a step "updates" a parameter when some element moves by more than this much of its own
#: magnitude: 4 of fp32's units in the last place (an element at 0 counts for any move)
ROUNDING = 2.0**-21


def _moved(old: torch.Tensor, new: torch.Tensor) -> bool:
    """Whether a step moved the parameter by more than fp32's rounding. An update below it is
    rounding's to give or take (a weight of 1.0 whose gradient is 1e-6, behind a zero-initialised
    residual branch's norm, moves by one unit in the last place or by none): a bf16 run may see
    it where stock did not, or the other way round, with the same gradients."""
    if old.shape != new.shape:
        return True
    old, new = old.float(), new.float()
    return bool(((new - old).abs() > ROUNDING * old.abs()).any())


def _live(kind: type) -> list[Any]:
    """The live objects of ``kind`` (``type()``: no ``__class__`` lookup on proxies)."""
    import gc

    return [obj for obj in gc.get_objects() if issubclass(type(obj), kind)]


def _holders(params: list[torch.Tensor]) -> list[nn.Module]:
    """The largest modules (by parameter count) that together hold ``params``: the models an
    optimizer trains, found among the live modules. Of modules holding the same parameters (a
    DistributedDataParallel or a LightningModule around the model), the innermost: the names
    then do not depend on a wrapper one run has and the other has not."""
    wanted = {id(p) for p in params}
    by_holding: dict[tuple[frozenset[int], int], list[nn.Module]] = {}
    for module in _live(nn.Module):
        ids = {id(p) for p in module.parameters()}
        covered = ids & wanted
        if covered:
            by_holding.setdefault((frozenset(covered), len(ids)), []).append(module)
    candidates = []
    for (covered, total), modules in by_holding.items():
        innermost = next(
            (m for m in modules if all(any(sub is m for sub in other.modules()) for other in modules)), modules[0]
        )
        candidates.append((len(covered), -total, innermost, set(covered)))
    candidates.sort(key=lambda c: (c[0], c[1]), reverse=True)
    chosen, left = [], set(wanted)
    for _, _, module, covered in candidates:
        if covered & left:
            chosen.append(module)
            left -= covered
        if not left:
            break
    return chosen
