"""Lightning Fabric's DDP for :mod:`nanopatch.compat.torch_nano`: imported only when several processes are
asked for (it imports Lightning). At module level so that Fabric can pickle it into the
processes it spawns, where it cannot fork."""

from __future__ import annotations

from collections.abc import Sequence

from lightning.fabric.strategies import DDPStrategy

from nanopatch.runtime.processes import end_with_parent

from .lightning import _Pinning


class PinnedFabricDDP(DDPStrategy):
    """Fabric's DDP over gloo in forked (or spawned) processes, each pinned to its CPU set."""

    def __init__(self, groups: Sequence[Sequence[int]], start_method: str = "fork") -> None:
        super().__init__(process_group_backend="gloo", start_method=start_method)
        self._groups = [tuple(g) for g in groups]

    def setup_environment(self) -> None:
        end_with_parent()
        _Pinning(self._groups[self.local_rank % len(self._groups)]).apply()
        super().setup_environment()
