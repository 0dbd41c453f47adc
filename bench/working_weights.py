"""bf16 working weights against bf16 autocast's per-forward weight casts, side by side.

The question this answers: does keeping a bf16 copy of each weight between optimizer steps
(the forward and backward use the copy; gradients reach the fp32 weight in fp32; the copy is
re-cast once after each step, as IPEX's split-bf16 optimizer and apex's O2 master weights do)
make a training step faster than autocast, which casts every fp32 weight in every forward?

Both variants run the step of bench/train_step.py's ``by-hand`` variant (bf16 autocast,
channels-last for image models) in one process, on the same model built from the same seed,
with nanopatch's fast dropout masks and with glibc keeping freed memory (both as
``patch_torch()`` has them), so the only difference is the weights:

* ``autocast``: fp32 weights, cast by autocast in every forward;
* ``working-weights``: the weights of every layer autocast would cast (all parameters of two or
  more dimensions but embeddings') are bf16 leaf tensors put in the modules' parameters for the
  forward, their gradients added to the fp32 weights' ``.grad`` in fp32 by a post-accumulate
  hook; after ``optimizer.step()`` one ``torch._foreach_copy_`` writes the new bf16 copies.

A prototype for measurement: it is not in nanopatch. Before its rounds, each variant records its
first ``--learning-steps`` steps from the seed (``nanopatch.learning.Recorder``), judged against
``autocast``'s with ``nanopatch.learning.compare``: one that does not learn as autocast does gets
no rate. Rounds alternate the variants, the order rotated each round. Prints a Markdown table
(``--json PATH`` for rows in bench/'s schema).

    PYTHONPATH=. python bench/working_weights.py [--models transformer,resnet18] [--quick]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # harness/, families/: when imported from elsewhere

from families.working_weights.main import (
    main as working_weights_main,  # bench/ is this script's folder, first on sys.path
)


def main(argv: list[str] | None = None) -> int:
    return working_weights_main(argv, description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
