"""The ``vision`` patch target: what in torchvision nanopatch replaces, applied when torchvision
is imported (or at once if it already is) and undone exactly by the engine's journal."""

from __future__ import annotations

from nanopatch import engine
from nanopatch.engine import versions
from nanopatch.foundation.log import log_once

from ._originals import bind, original


class Vision(engine.Target):
    """torchvision's decoding, datasets and transforms on nanopatch's kernels."""

    #: torchvision versions this target is written against (its loader, dataset and transform internals)
    supported = versions.supported("torchvision")

    def patch(self, ctx: engine.Context) -> None:
        bind(ctx)
        _patch(ctx)


def _patch(ctx: engine.Context) -> None:
    import torchvision.datasets as tv_datasets
    import torchvision.datasets.folder as folder
    import torchvision.transforms  # noqa: F401 - loads the modules whose names are replaced

    # Imported before any v1 name is replaced: each v2 class binds the v1 class it scripts as
    # (``_v1_transform_cls``, what ``torch.jit.script`` compiles for a v2 transform and what v2
    # checks itself against) from ``torchvision.transforms`` when v2 is first imported. Imported
    # after, every stock v2 class would point at nanopatch's v1 class, for good (no undo covers
    # it), and scripting a v2 transform would compile nanopatch's ``forward(*args)``.
    import torchvision.transforms.v2 as v2

    from . import datasets, transforms

    # default_loader and every loader-taking dataset call folder.pil_loader at call time.
    ctx.replace_everywhere(original(folder, "pil_loader"), datasets.pil_loader, "torchvision")
    ctx.replace(folder.DatasetFolder, "__getitem__", datasets.dataset_folder_getitem)

    for name in datasets.IN_MEMORY:
        cls = getattr(tv_datasets, name, None)
        if cls is None or "__getitem__" not in cls.__dict__:
            continue  # not in this torchvision version: stays stock
        ctx.replace(cls, "__getitem__", datasets.in_memory_getitem(name))

    # Transform classes: where torchvision defines them and every namespace re-exporting them.
    # Each nanopatch class subclasses the stock class it stands in for (``_nanopatch_stock``).
    for name in transforms.__all__:
        ours = getattr(transforms, name)
        ctx.replace_everywhere(ours._nanopatch_stock, ours, "torchvision")

    if not hasattr(v2.Transform, "make_params"):  # torchvision < 0.21 names it _get_params
        log_once("transforms-v2", "torchvision %s: transforms.v2 left stock", torchvision_version())
        return
    from . import transforms_v2

    for name in transforms_v2.__all__:
        ours = getattr(transforms_v2, name)
        ctx.replace_everywhere(ours._nanopatch_stock, ours, "torchvision")


def torchvision_version() -> str:
    import torchvision

    return torchvision.__version__
