"""A Hugging Face ``Trainer`` script for tests/runner/test_verify.py: a 2-layer BERT built from a
config (dropout 0.1) fine-tuned for sequence classification on random token sequences whose
first token gives the label; more steps than ``--verify`` asks for. The output folder is the
first argument."""

from __future__ import annotations

import sys

import transformers
from fw_models import Sentences, sentences_bert  # beside this script


def main() -> None:
    transformers.set_seed(0)
    model = sentences_bert(transformers)
    args = transformers.TrainingArguments(
        output_dir=sys.argv[1],
        max_steps=100,
        per_device_train_batch_size=8,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        disable_tqdm=True,
        learning_rate=1e-3,
        logging_steps=1,
    )
    transformers.Trainer(model=model, args=args, train_dataset=Sentences(48)).train()


if __name__ == "__main__":
    main()
