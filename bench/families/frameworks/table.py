"""frameworks' printed report: one table per group, with the machine and the variants' descriptions."""

from __future__ import annotations

import argparse
from typing import Any

import harness as h

from families.frameworks.summary import ran_with
from families.frameworks.variants import BASELINE, CLASSES, LORA, LORA_TARGETS, SECOND_BASELINE, UNIT
from families.train_step.roof import roof_line

GROUP_TITLES = {
    "lightning": "A. Lightning: LightningModule(ResNet-18) + Trainer",
    "lightning-ddp": "A. Lightning: Trainer(devices=2, strategy='ddp')",
    "hf": "B. Hugging Face Trainer: a transformers model built from its config (BERT, or GPT-2 with --hf-model gpt2)",
    "timm": "C. timm: create_model + create_optimizer_v2 + ModelEmaV2, hand-written loop",
}


def print_markdown(report: dict[str, Any]) -> None:
    m = report["machine"]
    print("## Training throughput of framework code: Lightning, Hugging Face Trainer, timm\n")
    print(h.cpu_line(m) + "; " + ", ".join(f"{k} {m[k]}" for k in VERSIONS if m.get(k)))
    print(
        f"- {h.plural(report['rounds'], 'round')} x {h.plural(report['steps'], 'timed step')} per run after "
        f"{report['warmup']} warm-up, each run a fresh process (group), order rotated each round; 1-min load "
        f"average at start {m['loadavg_start']}, at the end {report['loadavg_end']}"
    )
    git = report["git"]
    changes = git["nanopatch_changes"]
    digests = {r.get("nanopatch_digest") for runs in report.get("runs", {}).values() for r in runs}
    print(
        f"- nanopatch from git {(git['commit'] or '?')[:12]} at the start"
        + (f", with uncommitted changes under nanopatch/ ({', '.join(changes)})" if changes else "")
        + (f"; **its source changed during the run** ({len(digests)} versions)" if len(digests) > 1 else "")
    )
    for group, title in GROUP_TITLES.items():
        rows = [r for r in report["rows"] if r["group"] == group]
        if not rows:
            continue
        unit = UNIT[group]
        second = group in SECOND_BASELINE
        print(f"\n### {title}\n\n{report['descriptions'][group]}\n")
        roofed = group == "hf" and bool(report.get("roof"))
        head = ["variant", f"{unit} (median)", "min-max", f"x {BASELINE[group]}"]
        head += [f"x {SECOND_BASELINE[group]}"] if second else []
        head += ["model GFLOP/s", "of roof"] if roofed else []
        head += ["target", "bf16 inside / channels-last inside", "CPU", "other load", "ran with"]
        print("| " + " | ".join(head) + " |")
        print("|---|" + "---:|" * (3 + second + 2 * roofed) + "---|---|---:|---:|---|")
        for row in rows:
            print("| " + " | ".join(cells(row, second, roofed)) + " |")
        if roofed:
            print("\n" + roof_line(report["roof"], unit))
    print()
    for row in report["rows"]:
        if "problems" not in row.get("details", {}):  # no run of it went through
            continue
        d = row["details"]
        for problem in d["problems"]:
            print(f"- check failed: `{row['variant']}`: {problem}")
        for note in d["findings"]:
            print(f"- `{row['variant']}`: {note}")
        if d["load_warning"]:
            print(f"- warning: `{row['variant']}`: {d['load_warning']}")
    for row in report["rows"]:
        if row.get("failed_runs") and not h.not_run(row):
            print(f"- `{row['variant']}`: {row['failed_runs']} run(s) failed: {h.cell(row['error'])}")
    budget = h.left_out(report.get("round_orders", []))
    if budget:
        print(f"- {budget}")
    judged = [r for r in report["rows"] if r.get("learning")]
    if judged:
        print(
            f"\nLearning: {h.first_steps(report['learning_steps'])} of each variant's first run from the "
            "seed (rank 0's), judged against its group's stock (two processes: ddp-stock, when it ran) by "
            "nanopatch.learning (the test suite's definition); a variant that does not learn as stock gets no rate:\n"
        )
        for r in judged:
            print(f"- {h.learning_line(r)}")
    print(
        "\nRate: samples of all processes / the slowest process's time for the timed steps, median over the "
        "rounds. x ...: ratio of the medians (per round in brackets where there were several rounds). target: "
        "from the issue, printed, never asserted. bf16 inside / channels-last inside: what a forward hook on the "
        "model's first convolution (first Linear for BERT) saw in the timed steps: the dtype it computed in and "
        "whether its input was channels-last. CPU: CPU time of the timed steps of all processes / (wall time x "
        "cores). other load: the most CPU time other processes took during one of the variant's runs, as a share "
        "of all CPUs."
    )
    print(f"\nCommand: `{report['command']}`; run took {report['seconds']:.0f} s.")


def cells(row: dict[str, Any], second: bool, roofed: bool = False) -> list[str]:
    empty = [""] * (6 + second + 2 * roofed)
    if h.learns(row) is False:  # no rate: the verdict instead
        return [row["variant"], h.DOES_NOT_LEARN, *empty, h.cell(row["note"])]
    if row["rate"] is None:
        return [row["variant"], "not run" if h.not_run(row) else "failed", *empty, h.cell(row.get("error", "?"))]
    d = row["details"]
    low, high = row["spread"]

    def ratio(value: float | None, rounds: list[float] | None = None) -> str:
        if value is None:
            return ""
        text = f"{value:.2f}x"
        if rounds and len(rounds) > 1:
            text += f" ({min(rounds):.2f}-{max(rounds):.2f})"
        return text

    out = [
        row["variant"],
        h.fmt(row["rate"]),
        f"{h.fmt(low)}-{h.fmt(high)}",
        ratio(row["ratio_to_stock"], row.get("ratio_per_round")),
    ]
    if second:
        out.append(ratio(row.get("ratio_to_bf16_mixed")))
    if roofed:
        flops, fraction = row.get("model_flops"), row.get("roof_fraction")
        out += [f"{flops / 1e9:.0f}" if flops is not None else "", f"{fraction:.0%}" if fraction is not None else ""]
    targets = [f">= {t['at_least']:g}x {t['against']}: {'met' if t['met'] else 'not met'}" for t in row["targets"]]
    out += [
        "; ".join(targets),
        d["inside"] if len(set(d["inside_per_rank"])) == 1 else " | ".join(d["inside_per_rank"]),
        f"{d['cpu_use'] * 100:.0f}%",
        f"{max(d['other_load']) * 100:.0f}%" if d["other_load"] else "?",
        ran_with(d),
    ]
    return out


VERSIONS = ("torch", "torchvision", "lightning", "transformers", "timm", "accelerate")


def descriptions(args: argparse.Namespace) -> dict[str, str]:
    images = f"batch {args.batch} at {args.image_size} px, generated images, {CLASSES} classes"
    model = (
        "GPT-2 from a GPT2Config (causal-LM loss)"
        if getattr(args, "hf_model", "bert") == "gpt2"
        else "BERT from a BertConfig"
    )
    if getattr(args, "lora", False):
        targets = ", ".join(LORA_TARGETS[getattr(args, "hf_model", "bert")])
        model += f", fine-tuned with peft's LoRA (rank {LORA['r']} on {targets}; the base weights frozen)"
    bert = (
        f"{model}: {args.bert_layers} layers, hidden {args.bert_hidden}, vocabulary {args.vocab}, "
        f"sequence {args.seq_len}, batch {args.text_batch}, generated token ids"
    )
    return {
        "lightning": f"torchvision ResNet-18 in a LightningModule, SGD(momentum 0.9), {images}.",
        "lightning-ddp": f"The same module, Trainer(devices=2, strategy='ddp'), {images} per process.",
        "hf": f"{bert}; Trainer with TrainingArguments(use_cpu=True).",
        "timm": f"timm {getattr(args, 'timm_model', 'resnet18')}, create_optimizer_v2('sgd'), ModelEmaV2 updated "
        f"every step, {images}.",
    }
