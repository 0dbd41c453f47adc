"""frameworks' Hugging Face training script: BERT or GPT-2 trained by the transformers Trainer."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import harness as h

from families.frameworks.kit import Clock, param_checksum, process_facts, total_steps
from families.frameworks.variants import LORA, LORA_TARGETS, SEED, TEXT_LABELS


def hf_worker(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import transformers
    from torch import nn
    from torch.utils.data import Dataset
    from transformers import (
        BertConfig,
        BertForSequenceClassification,
        GPT2Config,
        GPT2LMHeadModel,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    causal = args.hf_model == "gpt2"

    class GeneratedText(Dataset):
        def __init__(self, samples: int, vocab: int) -> None:
            g = torch.Generator().manual_seed(SEED)
            self.ids = torch.randint(1, vocab, (samples, args.seq_len), generator=g)
            self.labels = torch.randint(0, TEXT_LABELS, (samples,), generator=g)

        def __len__(self) -> int:
            return len(self.labels)

        def __getitem__(self, i: int):
            ids = self.ids[i]
            label = ids if causal else self.labels[i]  # a causal LM shifts its labels itself
            return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": label}

    facts: dict[str, Any] = {}

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args_, state, control, **kwargs):
            clock.begin()

        def on_step_end(self, args_, state, control, **kwargs):
            clock.end()

    torch.manual_seed(SEED)
    hidden = args.bert_hidden
    if causal:
        config = GPT2Config(
            n_layer=args.bert_layers,
            n_embd=hidden,
            n_head=max(1, hidden // 64),
            vocab_size=args.vocab,
            n_positions=max(1024, args.seq_len),
        )
        model = GPT2LMHeadModel(config)
    else:
        config = BertConfig(
            num_hidden_layers=args.bert_layers,
            hidden_size=hidden,
            num_attention_heads=max(1, hidden // 64),
            intermediate_size=4 * hidden,
            vocab_size=args.vocab,
            max_position_embeddings=max(512, args.seq_len),
            num_labels=TEXT_LABELS,
        )
        model = BertForSequenceClassification(config)
    if args.lora:
        from peft import LoraConfig, get_peft_model

        lora = LoraConfig(
            **LORA,
            target_modules=LORA_TARGETS[args.hf_model],
            task_type="CAUSAL_LM" if causal else "SEQ_CLS",
            fan_in_fan_out=causal,  # GPT-2's projections are Conv1D, (in, out) weights
        )
        model = get_peft_model(model, lora)
    probe = h.Probe()
    probe.attach(model, nn.Linear)
    learning = h.Learning(args.learn, [model])
    clock = Clock(args, probe, learning)
    data = GeneratedText(args.text_batch * total_steps(args), config.vocab_size)
    training_args = TrainingArguments(
        output_dir=os.path.join(args.worker, "hf-output"),
        per_device_train_batch_size=args.text_batch,
        max_steps=total_steps(args),
        learning_rate=5e-5,
        use_cpu=True,
        report_to="none",
        logging_strategy="no",
        save_strategy="no",
        eval_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=SEED,
        bf16=args.precision == "bf16",
    )
    if args.roof:
        return hf_roof(args, model, data)
    trainer = Trainer(model=model, args=training_args, train_dataset=data, callbacks=[StepTimer()])
    clock.on_done = lambda: facts.update(process_facts(model))
    with learning.start():
        output = trainer.train()
    return {
        "rank": int(os.environ.get("RANK", "0")),
        "samples": clock.steps * args.text_batch,
        **facts,
        "loss": float(output.training_loss),
        "framework": f"transformers {transformers.__version__}",
        "precision": "bf16" if training_args.bf16 else None,
        "model_size": f"{'GPT-2' if causal else 'BERT'} {args.bert_layers} layers, hidden {hidden}, "
        f"sequence {args.seq_len}" + (", LoRA" if args.lora else ""),
        "parameters": sum(p.numel() for p in model.parameters()),
        "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "param_checksum": param_checksum(model),
        "probe": probe.as_dict(),
        **clock.as_dict(),
    }


def hf_roof(args: argparse.Namespace, model, data) -> None:
    """``--roof``: no training. The model work of one training step per sample (the FLOPs
    ``FlopCounterMode`` counts over a forward and backward of one batch of the model the Trainer
    trains, LoRA's frozen weights included as they run), and this machine's matrix-product rates
    (:func:`families.train_step.roof.matmul_rates`), written to ``roof.json`` in the worker's
    directory."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from families.train_step.roof import matmul_rates

    batch = {key: torch.stack([data[i][key] for i in range(args.text_batch)]) for key in data[0]}
    model.train()
    counter = FlopCounterMode(display=False)
    with counter:
        model(**batch).loss.backward()
    result = {
        "flops_per_sample": counter.get_total_flops() / args.text_batch,
        "matmul_flops": matmul_rates(),
        "threads": torch.get_num_threads(),
    }
    Path(args.worker, "roof.json").write_text(json.dumps(result))
