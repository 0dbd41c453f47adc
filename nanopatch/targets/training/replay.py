"""Activation checkpointing under the training patch: a checkpointed block's replay during
backward runs in the state nanopatch's forward ran in.

``torch.utils.checkpoint`` (and Hugging Face's ``gradient_checkpointing_enable()``, which calls
it) runs a block's forward without keeping its activations, then runs it again during backward
to get them back. It restores the RNG state and the autocast state for the replay, but the
replay runs outside nanopatch's forward wrapper: without help, its dropout masks would come
from the stock kernel while the forward drew them fast (the gradients would then belong to
neither run), and an output activation nanopatch computes in fp32 would run in bf16.

So each checkpointed call notes nanopatch's per-thread state when its forward runs (whether it
is in a mask region of :mod:`.dropout`, and inside nanopatch's autocast) and its replay runs
under that state again: a reentrant checkpoint (``CheckpointFunction``) through its ``ctx``, a
non-reentrant one through its ``_CheckpointFrame``'s ``recompute_fn``. Both hooks are entries
of the patch engine's journal.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

from nanopatch import engine

from . import amp, dropout, selfcheck
from .plan import local

#: what :func:`install` hooks, in ``torch.utils.checkpoint``: (owner name, attribute)
HOOK_POINTS = (("CheckpointFunction", "forward"), ("CheckpointFunction", "backward"), ("_CheckpointFrame", "__init__"))


def snapshot() -> tuple[int, int] | None:
    """nanopatch's per-thread state a replay needs: (mask region depth, nanopatch autocast
    depth), or None when both are zero."""
    masks, ours = getattr(local, "masks", 0), getattr(local, "ours", 0)
    return (masks, ours) if masks or ours else None


@contextlib.contextmanager
def restored(state: tuple[int, int] | None) -> Iterator[None]:
    """Run under the state :func:`snapshot` returned (nothing to do for None)."""
    if state is None:
        yield
        return
    saved = getattr(local, "masks", 0), getattr(local, "ours", 0)
    local.masks, local.ours = state
    try:
        yield
    finally:
        local.masks, local.ours = saved


def _checked(state: tuple[int, int] | None) -> tuple[int, int] | None:
    """The first checkpointed forward inside a mask region checks that replays agree with their
    forward on this torch (:func:`.selfcheck.replay_ok`); if not, masks are stock from now on,
    this forward's included, so its replay agrees with it."""
    if state is not None and state[0] and not getattr(local, "busy", 0) and not dropout.disabled[0]:
        dtype = amp.current_dtype() if amp.autocast_enabled() else None
        if not selfcheck.replay_ok(dtype):
            dropout.disabled[0] = True
    return state


def _reentrant_forward(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    if args:
        args[0]._nanopatch_replay = _checked(snapshot())  # ctx
    return wrapped(*args, **kwargs)


def _reentrant_backward(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    state = getattr(args[0], "_nanopatch_replay", None) if args else None
    with restored(state):
        return wrapped(*args, **kwargs)


def _replaying(state: tuple[int, int], recompute: Any, *args: Any) -> Any:
    with restored(state):
        return recompute(*args)


def _frame_init(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    result = wrapped(*args, **kwargs)
    state = _checked(snapshot())
    recompute = getattr(instance, "recompute_fn", None)
    if state is not None and recompute is not None:
        instance.recompute_fn = functools.partial(_replaying, state, recompute)
    return result


_WRAPPERS = {
    ("CheckpointFunction", "forward"): _reentrant_forward,
    ("CheckpointFunction", "backward"): _reentrant_backward,
    ("_CheckpointFrame", "__init__"): _frame_init,
}


def install(ctx: engine.Context) -> list[str]:
    """Hook checkpointing's forward and replay; returns the hook points this torch lacks (a
    replay through one of them could not be kept consistent)."""
    from torch.utils import checkpoint

    missing = []
    for owner_name, attribute in HOOK_POINTS:
        owner = getattr(checkpoint, owner_name, None)
        if owner is None or not callable(getattr(owner, attribute, None)):
            missing.append(f"torch.utils.checkpoint.{owner_name}.{attribute}")
    if missing:
        return missing
    for owner_name, attribute in HOOK_POINTS:
        ctx.wrap(getattr(checkpoint, owner_name), attribute, _WRAPPERS[(owner_name, attribute)])
    return []
