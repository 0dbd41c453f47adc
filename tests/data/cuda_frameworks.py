"""GPU-style framework scripts, as their authors write them for a CUDA machine.

    python cuda_frameworks.py (lightning|hf) OUT

``lightning``: a Lightning Trainer with its automatic accelerator and ``precision="16-mixed"``
where CUDA is available. ``hf``: a Hugging Face Trainer with ``fp16=True`` on a tiny BERT built
from its config. Each writes OUT (JSON): the device the framework chose, the losses it logged,
and the dtype the model's first linear layer computed in.
"""

import json
import sys

import torch

FRAMEWORK, OUT = sys.argv[1], sys.argv[2]
seen = []


def probe(module):
    first = next(m for m in module.modules() if isinstance(m, torch.nn.Linear))
    first.register_forward_hook(lambda m, i, o: seen.append(str(o.dtype)) if m.training else None)


torch.manual_seed(0)
if FRAMEWORK == "lightning":
    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2))
            self.losses = []

        def training_step(self, batch, _):
            x, y = batch
            loss = torch.nn.functional.cross_entropy(self.net(x), y)
            self.losses.append(loss.item())
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    x = torch.randn(256, 16)
    y = (x.sum(1) > 0).long()
    module = Module()
    probe(module)
    trainer = L.Trainer(
        max_epochs=2,
        precision="16-mixed" if torch.cuda.is_available() else "32-true",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, DataLoader(TensorDataset(x, y), batch_size=32, pin_memory=True))
    report = {"device": str(trainer.strategy.root_device), "losses": module.losses}
else:
    from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

    config = BertConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64
    )
    model = BertForSequenceClassification(config)
    probe(model)

    class Data(torch.utils.data.Dataset):
        def __len__(self):
            return 64

        def __getitem__(self, i):
            ids = torch.randint(0, 100, (16,), generator=torch.Generator().manual_seed(i))
            return {"input_ids": ids, "labels": int(ids[0] > 50)}

    args = TrainingArguments(
        output_dir=OUT + ".hf",
        learning_rate=1e-3,
        per_device_train_batch_size=8,
        num_train_epochs=2,
        fp16=True,
        report_to=[],
        logging_steps=1,
        save_strategy="no",
        dataloader_pin_memory=True,
    )
    trainer = Trainer(model=model, args=args, train_dataset=Data())
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    report = {"device": str(args.device), "losses": losses}
report["computed"] = sorted(set(seen))
with open(OUT, "w") as f:
    json.dump(report, f)
