"""Command-line options every bench shares: lists of names, the round options and their defaults,
and writing the report at the end.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .learning import LEARNING_STEPS


def parse_names(text: str, known, option: str, parser, aliases: dict[str, list[str]] | None = None,
                shown=None) -> list[str]:  # fmt: skip
    """The comma-separated names of ``text``, each in ``known`` (or an alias for several), in order
    and once each; a parser error names the unknown ones and what ``shown`` (default: ``known``) offers."""
    aliases = aliases or {}
    names: list[str] = []
    unknown = []
    for word in (w.strip() for w in text.split(",")):
        if word in aliases:
            names += aliases[word]
        elif word in known:
            names.append(word)
        elif word:
            unknown.append(word)
    if unknown or not names:
        offered = ", ".join([*(shown or known), *aliases])
        parser.error(f"{option}: unknown {', '.join(unknown) or '(none given)'}; choose from {offered}")
    return list(dict.fromkeys(names))


#: rounds, timed steps, warm-up steps and learning steps by default and with --quick
ROUND_DEFAULTS = {
    False: {"rounds": 3, "steps": 5, "warmup": 2, "learning_steps": LEARNING_STEPS[False]},
    True: {"rounds": 2, "steps": 2, "warmup": 1, "learning_steps": LEARNING_STEPS[True]},
}


def add_round_options(parser) -> None:
    """--rounds, --steps, --warmup, --learning-steps and --quick (see :func:`round_defaults`)."""
    parser.add_argument("--rounds", type=int, help="rounds; every variant runs once per round (default 3; 2 --quick)")
    parser.add_argument("--steps", type=int, help="timed training steps per run (default 5; 2 with --quick)")
    parser.add_argument("--warmup", type=int, help="untimed steps before them (default 2; 1 with --quick)")
    parser.add_argument(
        "--learning-steps",
        type=int,
        help=f"steps a variant's first run records from the seed before its warm-up, judged against stock's for "
        f"the learning check (default {LEARNING_STEPS[False]}; {LEARNING_STEPS[True]} with --quick)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="2 rounds of 2 steps after 1 warm-up step and 3 learning steps"
    )
    add_until(parser)


def add_until(parser) -> None:
    """--until: the time budget bench/run.py --minutes hands each bench."""
    parser.add_argument(
        "--until",
        type=float,
        metavar="EPOCH_S",
        help="start no run that is expected to end after this time (seconds since the epoch; bench/run.py "
        "--minutes sets it); what is left out is named in the report",
    )


def round_defaults(args) -> None:
    """Fill in the round options not given, as ``--quick`` says."""
    for name, value in ROUND_DEFAULTS[args.quick].items():
        if getattr(args, name) is None:
            setattr(args, name, value)


def finish(report: dict[str, Any], json_path: str | None, print_table) -> int:
    """Write ``report`` as JSON to ``json_path`` (if given) and print its table. The exit code is 0
    when any row has a rate: a variant that failed is a row with its error, and bench/run.py reads
    the JSON only after exit code 0."""
    if json_path:
        Path(json_path).write_text(json.dumps(report, indent=2))
    print_table(report)
    return 0 if any(r["rate"] is not None for r in report["rows"]) else 1
