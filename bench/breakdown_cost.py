"""What nanopatch's ``breakdown`` option (the run's time split by a clock per batch and per
optimizer step, on under ``--compare`` and ``-v``) costs a training step.

Two loops, each over a DataLoader of generated tensors with SGD: a tiny MLP (a step of a few
hundred microseconds, where a fixed cost per step weighs most) and a small CNN. Each round
times the same steps with the option off and on, in the same process (the order rotated each
round, nothing else of nanopatch applied), and the medians give the cost per step in
microseconds and as a share of the step; the step-to-step noise of a 2-core machine is larger
than the cost, so the hooks' own time is also measured directly: nanopatch's ``__next__``
wrapper and optimizer-step hooks called many times on a ready batch and a parameterless
optimizer, against the bare calls. The target (issue 26): under 1% of a step.

    python bench/breakdown_cost.py [--rounds 7] [--steps 200] [--json]
"""

from __future__ import annotations

import sys

from families.breakdown_cost.main import (
    main as breakdown_cost_main,  # bench/ is this script's folder, first on sys.path
)


def main(argv: list[str] | None = None) -> int:
    return breakdown_cost_main(argv, description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
