"""Training throughput of one machine: one process, one process tuned, or several pinned processes.

Times the training loop a user writes for torchvision's ResNet-18 (batch 32 per process at
224 px, SGD(lr 0.01, momentum 0.9, weight decay 1e-4), cross-entropy over 1000 classes; the data
is a synthetic data set of 8 batches, generated with a fixed seed and read through a shuffling
``DataLoader``) in these variants, all on the same cores:

* ``stock``: ``python worker.py``; nanopatch is never imported (checked), torch's default threads.
* ``patched, untuned``: ``python -m nanopatch --no-tune worker.py``: the patches, no runtime tuning.
* ``patched, tuned``: ``python -m nanopatch worker.py``: one process on all the cores, with the
  runtime tuning (``OMP_NUM_THREADS``, OpenMP affinity, an allocator preloaded).
* ``patched, tuned, threads not pinned`` and ``patched, tuned, glibc malloc``: the tuning less its
  pinning (``--no-pin-threads``) or less its allocator (``--allocator default``): what each
  setting does on its own.
* ``patched, tuned, no DataLoader``: the same, its timed steps taking batches the DataLoader
  collated before them (one epoch of them, over again): against ``patched, tuned``, what the
  loader costs a step (issue 40's target: at most 10%).
* ``patched, one process on 1/N of the cores``: ``taskset -c <CPUs> python -m nanopatch
  worker.py``, on the CPUs ``--nproc N`` gives its first process (so with its threads): N times
  its rate is what N processes would train if nothing were shared, the base of weak scaling.
* ``patched, N processes at once, no DDP``: N such processes started together, each on its
  rank's CPUs, no process group, their timed steps side by side (they wait for each other before
  them and train on after them until all are done): what the machine loses running N at once
  (memory bandwidth, caches, clocks), without any all-reduce.
* ``patched, --nproc N``: ``python -m nanopatch --nproc N worker.py``: N processes, each pinned
  to its share of the cores, the model in DistributedDataParallel (gloo), the loader sharded.
  Each process trains batch 32, so a step is 32 N images; the rate is the images of all ranks
  over the slowest rank's time (DDP keeps the ranks in lock-step). Weak scaling is its rate over
  N times the one process on 1/N; it splits into the machine's part (the processes at once
  against N alone) and DDP's (``--nproc N`` against the processes at once).
* ``stock, torchrun --nproc N``: the script doing DDP itself under ``torchrun --standalone``, as
  torch's DDP tutorial writes it (its memory is the base of ``--nproc N``'s).

``--nproc 2,4,8`` runs the counted variants (the last four) once per count.

The worker is this file run with ``--worker`` (the same file and arguments for every variant) and
behaves as a plain training script: it builds its data, model and optimizer, runs ``--warmup``
untimed steps (and, under nanopatch, as many more as nanopatch still spends measuring bf16
against fp32 and channels-last against stock's layout, at most 38, every rank as many: timed,
those steps would mix fp32 steps into the rate of what nanopatch chose), times ``--steps``
steps (``loss.item()`` after each, as a script that logs its loss does), and writes its images,
seconds and what it ran with to ``rank<RANK>.json`` in the folder its command line names
(``RANK`` from the environment, 0 when unset). It never calls nanopatch or sets anything up for
torch.distributed; after the timed steps it only *asks* what it ran with:
torch's intra- and inter-op threads, its CPU affinity when it started and each thread's after
the run, whether jemalloc or tcmalloc is mapped (``/proc/self/maps``), whether a process group
is initialised and its world size and backend, whether a DistributedDataParallel object exists,
the loader's batches per epoch, a checksum of the data it saw first and of the parameters after
the run. The parent checks from those, and reports, that the ranks of ``--nproc`` had disjoint
CPUs, saw different data (the loader was sharded) and still ended with equal parameters (their
gradients were averaged), and that ``stock`` never imported nanopatch.

Each variant must learn as stock before it gets a rate: its first run (the first that ran, if
that failed) records its first ``--learning-steps`` optimizer steps from the seed before the
warm-up with ``nanopatch.learning.Recorder`` (stock loads that file without importing nanopatch)
and writes them to its result; the parent judges rank 0's against stock's with
``nanopatch.learning.compare``. A variant that does not learn as stock is printed "does not learn"
with the verdict and keeps no rate, ratio or timing.

How it is made fair:

* Every variant runs once per round as a fresh process (or process group), one at a time, the
  order rotated each round, so drift of the machine hits every variant alike; the rate is the
  median over the rounds, ``min-max`` the spread.
* The same worker file, data, seed, model and step for every variant; only the launch differs.
  ``OMP_NUM_THREADS``, OpenMP affinity, ``LD_PRELOAD``/``MALLOC_CONF``, torchrun's and
  ``NANOPATCH_*`` variables are removed from the environment of all of them, so each runs what
  its command line says and no setting of the caller's leaks in.
* Nothing else is timed: start-up, data generation, model building and warm-up are outside.
* ``CPU`` is the CPU time of all processes over (wall time x the cores allowed): well below 100%
  means the processes idled (waiting on each other) or other processes took the cores.
  ``other load`` tells which: the CPU time the rest of the machine took during a run (the busy
  time in ``/proc/stat``, steal included, less the run's own processes), as a share of all CPUs,
  the most of any round. Above 5%, the report warns that the variant's rates are suspect.

    PYTHONPATH=. python bench/multi_instance.py [--quick] [--rounds 3] [--steps 5] [--warmup 2]
        [--learning-steps 6] [--variants stock,stock-nproc,untuned,tuned,unpinned,glibc,no-loader,share,apart,nproc]
        [--nproc 2[,4,8]] [--json PATH]

``--quick``: 2 rounds of 2 steps after 1 warm-up step, 3 learning steps. See bench/README.md.
"""

from __future__ import annotations

import sys

from families.multi_instance.main import (
    main as multi_instance_main,  # bench/ is this script's folder, first on sys.path
)


def main(argv: list[str] | None = None) -> int:
    return multi_instance_main(argv, description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
