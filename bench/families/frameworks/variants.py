"""frameworks' variants (Lightning, DDP, nanopatch's trainer, Hugging Face, timm; stock and patched),
their groups, baselines and targets, and the sizes of a full and a --tiny run.
"""

from __future__ import annotations

import dataclasses
import time

SEED = 20251
CLASSES = 10
TEXT_LABELS = 2
DISTINCT_IMAGES = 64  # generated images the data set cycles through (its length is what the steps need)
MAX_WORLD = 2  # the data set holds enough batches for every rank of the largest world
#: --tiny (the test suite): sizes that make every script a few seconds
#: the steps nanopatch's measurement of a model takes where its modes are not clear-cut (bf16
#: against fp32 and, for a CNN, channels-last against stock's layout: 3 in its choice, each other
#: mode's set-up step, 4 of each of the four modes): the least warm-up of a full run, so that its
#: timed steps run what nanopatch decided. Noisy steps can make it measure longer (up to 8 of
#: each): a run whose timed steps began while it still measured fails its checks (the worker
#: asks nanopatch's status at the first timed step)
TRIAL_SPAN = 22
TINY = {
    "image_size": 32,
    "batch": 4,
    "text_batch": 4,
    "seq_len": 16,
    "bert_layers": 1,
    "bert_hidden": 32,
    "vocab": 1000,
}
FULL = {
    "image_size": 224,
    "batch": 32,
    "text_batch": 16,
    "seq_len": 128,
    "bert_layers": 4,
    "bert_hidden": 256,
    "vocab": 30522,
}
GPT2_VOCAB = 50257  # --hf-model gpt2 outside --tiny
#: --hf-size base: BERT-base and GPT-2 small (124M parameters) as published, built from their configs
HF_BASE = {
    "bert": {"bert_layers": 12, "bert_hidden": 768, "seq_len": 128, "text_batch": 8},
    "gpt2": {"bert_layers": 12, "bert_hidden": 768, "seq_len": 256, "text_batch": 8},
}
#: --lora: peft's LoRA on each model's attention projections (rank, alpha, dropout)
LORA = {"r": 8, "lora_alpha": 16, "lora_dropout": 0.05}
LORA_TARGETS = {"bert": ["query", "value"], "gpt2": ["c_attn"]}
STARTED = time.perf_counter()  # the script's start (for setup_s: imports, data and model building)


@dataclasses.dataclass(frozen=True)
class Variant:
    name: str
    group: str  # lightning, lightning-ddp, hf, timm
    script: str  # the worker's --script
    launcher: tuple[str, ...] = ()  # interpreter options before the script
    precision: str | None = None  # Lightning's Trainer(precision=...); "bf16" for HF's, "autocast" for timm's loop
    processes: int = 1
    patched: bool = False
    nano_processes: int = 0  # nanopatch.lightning.Trainer(num_processes=..., precision="bf16", channels_last=True)
    init: tuple[str, ...] = ()  # the environment of `eval "$(python -m nanopatch --init ...)"` (bigdl-nano-init's)


NANOPATCH = ("-m", "nanopatch")
VARIANTS = {
    v.name: v
    for v in (
        Variant("stock", "lightning", "lightning"),
        Variant("bf16-mixed", "lightning", "lightning", precision="bf16-mixed"),
        Variant("nanopatch", "lightning", "lightning", NANOPATCH, patched=True),
        Variant("nanopatch+bf16-mixed", "lightning", "lightning", NANOPATCH, "bf16-mixed", patched=True),
        Variant("nproc2", "lightning", "lightning", (*NANOPATCH, "--nproc", "2"), processes=2, patched=True),
        Variant("nano-trainer", "lightning", "lightning-nano", patched=True, nano_processes=1, init=("--init",)),
        Variant(
            "nano-trainer-2",
            "lightning",
            "lightning-nano",
            processes=2,
            patched=True,
            nano_processes=2,
            init=("--init", "--no-pin-threads"),
        ),
        Variant("ddp-stock", "lightning-ddp", "lightning-ddp", processes=2),
        Variant("ddp-nanopatch", "lightning-ddp", "lightning-ddp", NANOPATCH, processes=2, patched=True),
        Variant("hf-stock", "hf", "hf"),
        Variant("hf-nanopatch", "hf", "hf", NANOPATCH, patched=True),
        Variant("hf-bf16", "hf", "hf", precision="bf16"),
        Variant("hf-bf16-nanopatch", "hf", "hf", NANOPATCH, "bf16", patched=True),
        Variant("hf-nanopatch-compile", "hf", "hf", (*NANOPATCH, "--compile=default"), patched=True),
        Variant("timm-stock", "timm", "timm"),
        Variant("timm-nanopatch", "timm", "timm", NANOPATCH, patched=True),
        Variant("timm-autocast", "timm", "timm", precision="autocast"),
        Variant("timm-autocast-nanopatch", "timm", "timm", NANOPATCH, "autocast", patched=True),
    )
}
#: --variants shorthands
GROUP_ALIASES = {
    **{
        alias: [n for n, v in VARIANTS.items() if v.group == group]
        for alias, group in (("lightning", "lightning"), ("ddp", "lightning-ddp"), ("hf", "hf"), ("timm", "timm"))
    },
    "all": list(VARIANTS),
}
BASELINE = {"lightning": "stock", "lightning-ddp": "ddp-stock", "hf": "hf-stock", "timm": "timm-stock"}
#: processes -> the stock run a variant's learning record is judged against, before its group's own
#: stock: two data-parallel processes see other batches than one, so a 2-process run is compared
#: with stock Lightning's 2-process DDP run (``ddp-stock``) when it ran
LEARNING_BASELINE = {2: "ddp-stock"}
#: the framework's (or the user's) own bf16 autocast: the "x bf16-mixed" / "x hf-bf16" / "x timm-autocast" column
SECOND_BASELINE = {"lightning": "bf16-mixed", "hf": "hf-bf16", "timm": "timm-autocast"}
#: Variant.precision in words
PRECISION_OF = {
    "bf16-mixed": "Lightning's bf16-mixed",
    "bf16": "the Trainer's bf16=True",
    "autocast": "the loop's autocast",
}
UNIT = {"lightning": "img/s", "lightning-ddp": "img/s", "hf": "samples/s", "timm": "img/s"}
#: (variant, against, at least): printed beside the ratios, never asserted
TARGETS = (
    ("nanopatch", "stock", 1.8),
    ("nanopatch", "bf16-mixed", 1.1),
    ("nano-trainer", "stock", 1.8),
    ("nano-trainer", "bf16-mixed", 1.15),
    ("nano-trainer-2", "nano-trainer", 1.0),
    ("ddp-nanopatch", "ddp-stock", 1.0),
    ("hf-nanopatch", "hf-stock", 1.3),
    ("timm-nanopatch", "timm-stock", 1.3),
    # nanopatch with the framework's own precision: at least as fast as either alone
    ("nanopatch+bf16-mixed", "bf16-mixed", 1.0),
    ("nanopatch+bf16-mixed", "nanopatch", 1.0),
    ("hf-bf16-nanopatch", "hf-bf16", 1.0),
    ("hf-bf16-nanopatch", "hf-nanopatch", 1.0),
    ("timm-autocast-nanopatch", "timm-autocast", 1.0),
    ("timm-autocast-nanopatch", "timm-nanopatch", 1.0),
)
