"""frameworks' command line: a worker's script, or the rounds of every variant and the report."""

from __future__ import annotations

import argparse
import importlib.util
import os
import shlex
import sys
import tempfile
import time

import harness as h

from families.frameworks.hf_script import hf_worker
from families.frameworks.kit import _AFFINITY_AT_START, write_rank
from families.frameworks.launch import SCRIPT, measure_roof, run_once
from families.frameworks.lightning_script import lightning_worker
from families.frameworks.summary import summarise
from families.frameworks.table import VERSIONS, descriptions, print_markdown
from families.frameworks.timm_script import timm_worker
from families.frameworks.variants import FULL, GPT2_VOCAB, GROUP_ALIASES, HF_BASE, TINY, TRIAL_SPAN, VARIANTS
from families.multi_instance.launch import SETTLE_S, run_env
from families.train_step.roof import with_roof


def worker_main(args: argparse.Namespace) -> int:
    _AFFINITY_AT_START[:] = sorted(os.sched_getaffinity(0))
    run = {
        "lightning": lightning_worker,
        "lightning-ddp": lightning_worker,
        "lightning-nano": lightning_worker,
        "hf": hf_worker,
        "timm": timm_worker,
    }
    result = run[args.script](args)
    if result is not None:
        write_rank(args, result)
    return 0


def main(argv: list[str] | None = None, description: str | None = None) -> int:
    """bench/frameworks.py's command line; ``description`` is its --help text (the script's docstring)."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    h.add_round_options(parser)
    parser.add_argument(
        "--variants",
        default="all",
        help=f"comma-separated, of {', '.join(VARIANTS)}, or the groups {', '.join(GROUP_ALIASES)} "
        "(default: %(default)s)",
    )
    parser.add_argument("--image-size", type=int, help="image side in px for Lightning and timm (default 224)")
    parser.add_argument(
        "--hf-model",
        choices=("bert", "gpt2"),
        default="bert",
        help="the Hugging Face Trainer's model: BERT for sequence classification, or GPT-2 with its "
        "causal-LM loss and 50257-word vocabulary (default: %(default)s)",
    )
    parser.add_argument(
        "--hf-size",
        choices=("small", "base"),
        default="small",
        help="small: the suite's BERT (4 layers, hidden 256, sequence 128); base: the published sizes, "
        "BERT-base (12 layers, hidden 768, sequence 128) or GPT-2 small (124M parameters: 12 layers, "
        "hidden 768, sequence 256), built from their configs (default: %(default)s)",
    )
    parser.add_argument(
        "--lora",
        action="store_true",
        help="fine-tune the Hugging Face model with LoRA through peft (rank 8 on the attention "
        "projections, the base weights frozen) instead of all its weights",
    )
    parser.add_argument(
        "--timm-model",
        default="resnet18",
        help="the timm rows' model, any name timm.create_model takes (vit_small_patch16_224: a ViT, "
        "whose attention is scaled_dot_product_attention without dropout) (default: %(default)s)",
    )
    parser.add_argument("--timeout", type=float, default=1800, help="seconds one run may take (default %(default)s)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    # sizes, for the test suite (--tiny) and the workers
    parser.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--text-batch", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--seq-len", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--bert-layers", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--bert-hidden", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--vocab", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--worker", metavar="DIR", help=argparse.SUPPRESS)  # internal: run as the training script
    parser.add_argument(
        "--script", choices=("lightning", "lightning-ddp", "lightning-nano", "hf", "timm"), help=argparse.SUPPRESS
    )
    parser.add_argument("--precision", help=argparse.SUPPRESS)
    parser.add_argument("--roof", action="store_true", help=argparse.SUPPRESS)  # the hf worker: model work and roof
    parser.add_argument("--nano-processes", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--learn", type=int, default=0, help=argparse.SUPPRESS)  # steps recorded first
    args = parser.parse_args(argv)
    h.round_defaults(args)
    if args.hf_model == "gpt2" and args.vocab is None and not args.tiny:
        args.vocab = GPT2_VOCAB
    if args.hf_size == "base" and not args.tiny:
        for name, value in HF_BASE[args.hf_model].items():
            if getattr(args, name) is None:
                setattr(args, name, value)
    if args.lora and not args.worker and importlib.util.find_spec("peft") is None:
        parser.error("--lora needs peft (pip install peft)")
    for name, value in (TINY if args.tiny else FULL).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.worker:
        return worker_main(args)
    names = h.parse_names(args.variants, VARIANTS, "--variants", parser, GROUP_ALIASES)
    if min(args.rounds, args.steps, args.warmup, args.learning_steps, *(getattr(args, n) for n in TINY)) < 1:
        parser.error("--rounds, --steps, --warmup, --learning-steps and the sizes must be >= 1")

    log = h.log
    started = time.perf_counter()
    machine = h.machine_facts(*VERSIONS)
    git = machine["git"]
    env = run_env()
    if args.tiny:
        # tiny models measure faster in fp32 and stock's layout, and nanopatch would choose them: the
        # suite's run pins bf16 and channels-last so that what it checks (bf16 / channels-last
        # inside, the same in every launch) does not depend on timing
        env["NANOPATCH_BF16"] = "1"
        env["NANOPATCH_CHANNELS_LAST"] = "1"
    elif not args.quick and args.warmup < TRIAL_SPAN:
        log(f"--warmup {args.warmup} -> {TRIAL_SPAN}: the timed steps start after nanopatch's bf16 measurement")
        args.warmup = TRIAL_SPAN
    cores = len(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory(prefix="nanopatch-frameworks-") as workdir:
        run = h.recording_first(lambda n, learn: run_once(VARIANTS[n], args, env, workdir, learn), args.learning_steps)
        runs, orders = h.interleave(names, args.rounds, run, log, SETTLE_S, args.until)
    rows = summarise(names, runs, args, cores)
    roof = None
    if any(VARIANTS[n].group == "hf" for n in names) and not h.fits(args.until, 0):
        log("hf: the roof is not measured: the time budget (--until) has ended")
    elif any(VARIANTS[n].group == "hf" for n in names):
        log("hf: the model's work per sample and this machine's matmul rates (--roof)")
        roof = measure_roof(args, env)
        with_roof(
            [r for r in rows if r["group"] == "hf"], roof and roof["matmul_flops"], roof and roof["flops_per_sample"]
        )
    runs = {row["variant"]: h.runs_kept(row, runs[row["variant"]]) for row in rows}
    report = {
        "benchmark": "frameworks",
        "machine": machine,
        "command": shlex.join(["python", h.shown_path(SCRIPT), *(sys.argv[1:] if argv is None else argv)]),
        "descriptions": descriptions(args),
        "git": git,
        "sizes": {n: getattr(args, n) for n in TINY},
        "rounds": args.rounds,
        "steps": args.steps,
        "warmup": args.warmup,
        "learning_steps": args.learning_steps,
        "quick": args.quick,
        "until": args.until,
        "round_orders": orders,
        "rows": rows,
        "roof": roof,
        "runs": runs,
        "loadavg_end": h.load_average(),
        "seconds": time.perf_counter() - started,
    }
    return h.finish(report, args.json, print_markdown)
