"""Every benchmark in one command: runs them, then writes a JSON record, a Markdown summary and charts.

Runs the benches in bench/ one after another, each as its own subprocess that times stock against
nanopatch side by side exactly as it does when run alone (this script times nothing itself), with
a progress bar over the benches. Each bench's output goes to a log file beside the results; a
bench that fails is recorded as failed, with the tail of its log, and the others go on (the exit
code is then 1). Every bench writes its results as rows of one schema (bench/harness/rows.py: bench,
group = pipeline and size or model, variant, rate, unit, ratio to stock, spread); they are written,
with the machine, the versions, the git commit and the command, to
``<out>/<YYYY-MM-DD>-<hostname>.json``; beside it a Markdown summary (``.md``, one table per bench)
and one PNG chart per bench (the speed-up over stock per pipeline or model).

    PYTHONPATH=. python bench/run.py [--quick] [--server] [--minutes M]
                                     [--only decode,transforms,train_step,import_cost,multi_instance,frameworks]
                                     [--ipex-python PATH] [--out bench/results] [--timeout SECONDS] [--readme]
    PYTHONPATH=. python bench/run.py --render bench/results/<file>.json [--readme]

``--server`` runs what a many-core server is measured with (train_step's ResNet-18 and transformer
stock, by hand and patched with profiles; multi_instance's one process, with and without its
DataLoader, against ``--nproc 2``, ``4`` and ``8`` with their weak scaling and memory; the
Hugging Face Trainer fine-tuning GPT-2 small through LoRA, stock, with its own bf16 and patched:
``suite/benches.py``'s ``SERVER``), estimated at 14 minutes on 16 cores if run whole (not yet timed
on one), so it runs inside a time budget, 8 minutes unless ``--minutes`` says otherwise: each of
those families gets its share (``BUDGET_SHARES``; what one leaves unused passes to the next) as
``--until``, and starts no run, set-up, profile or roof measurement that its runs so far say would
end after it; what it left out is named in its report (a variant never run reads "not run"). The
files are named ``<date>-<hostname>-server``. ``--quick`` runs every bench's quick mode (and 5 rounds of
import_cost): a few minutes on 2 cores, to check that everything works, not to quote.
``--render`` rewrites the Markdown and the charts from
an existing JSON without running anything; ``--readme`` prints a compact Markdown table for the
project README (one row per bench and pipeline or model: stock's rate and nanopatch's speed-ups).
Ratios are always speed-ups: above 1.00x is faster than stock (for import_cost, stock's start-up
time over the variant's). The training benches judge each variant's first steps from the seed
against stock's (``nanopatch.learning``): a variant that does not learn as stock is shown as
"does not learn" in the rows, the Markdown, the charts and the README table, never as a speed-up.
Needs matplotlib for the charts (left out, with a note, without it) and uses tqdm for the
progress bar when it is installed.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import harness as h  # bench/ is this script's folder, first on sys.path
from report.readme import readme_table
from report.render import render
from suite.benches import BENCH_DIR, BENCHES, BUDGET_SHARES, SERVER, SERVER_MINUTES, Bench
from suite.runner import display_path, run


def main(argv: Sequence[str] | None = None, benches: dict[str, Bench] | None = None) -> int:
    benches = BENCHES if benches is None else benches
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="every bench's quick mode: a few minutes in all")
    parser.add_argument(
        "--server",
        action="store_true",
        help=f"a many-core server's run: {', '.join(SERVER)} at server sizes, inside --minutes "
        f"(default {SERVER_MINUTES:g}) (with --quick: their quick modes)",
    )
    parser.add_argument("--only", help=f"comma-separated, of {', '.join(benches)} (default: all that exist)")
    parser.add_argument(
        "--ipex-python", help="interpreter with intel-extension-for-pytorch, for train_step's ipex variant"
    )
    parser.add_argument(
        "--out", default=str(BENCH_DIR / "results"), help="directory for the results and logs (default: bench/results)"
    )
    parser.add_argument("--timeout", type=float, help="stop a bench that runs longer than this many seconds (failed)")
    parser.add_argument(
        "--minutes",
        type=float,
        help=f"a time budget: {', '.join(BUDGET_SHARES)} start no run expected to end after their share of it "
        f"and report what they left out (default {SERVER_MINUTES:g} with --server, else none)",
    )
    parser.add_argument(
        "--render", metavar="JSON", help="re-render the Markdown and charts of this results file; runs nothing"
    )
    parser.add_argument("--readme", action="store_true", help="print a compact Markdown table for the project README")
    args = parser.parse_args(argv)
    if args.only is not None:
        args.only = h.parse_names(args.only, benches, "--only", parser)
    elif args.server:
        args.only = [name for name in SERVER if name in benches]
    if args.minutes is None and args.server:
        args.minutes = SERVER_MINUTES
    if args.minutes is not None and args.minutes <= 0:
        parser.error("--minutes must be > 0")
    if args.render:
        path = Path(args.render)
        try:
            results = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            parser.error(f"--render: cannot read {path}: {exc}")
        written = render(results, path, benches)
        for p in written:
            print(f"wrote {display_path(p)}", file=sys.stderr)
        if args.readme:
            print(readme_table(results, benches))
        return 0
    return run(args, argv, benches)


if __name__ == "__main__":
    sys.exit(main())
