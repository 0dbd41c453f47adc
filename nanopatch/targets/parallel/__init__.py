"""Data-parallel training: the ``distributed`` patch target (:mod:`.patch`: the process group,
DDP around the model the training target pairs, sharded loaders, the learning-rate warm-up)
and its Lightning counterparts (:mod:`.lightning`: a Trainer in a ``--nproc`` process runs
Lightning's own DDP). Both build on :mod:`nanopatch.targets.training` and are imported by it never:
the data-parallel engine registers itself with the training target when it is imported."""
