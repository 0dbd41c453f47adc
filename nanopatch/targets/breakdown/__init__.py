"""Where a training run's time goes, and what the user could change that nanopatch cannot.

The ``breakdown`` target (:mod:`.patch`) times a run from hooks on what every training loop
calls: a DataLoader iterator's ``__next__`` and the optimizer's step (its closure, when it is
given one). :mod:`.advice` turns the figures into suggestions, each with the figure that
triggered it. ``--compare`` and ``-v`` switch it on; ``status()["breakdown"]`` carries it.
"""
