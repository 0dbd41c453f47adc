"""A BigDL-Nano style script: a LightningModule wrapping a torchvision ResNet, ``self.model(x)`` in
``training_step``, trained with ``nanopatch.lightning.Trainer`` and BigDL-Nano's switches.

    python nano_trainer.py OUT [--num-processes N] [--precision bf16] [--channels-last] [--no-auto-lr] [--use-ipex]

Each rank writes OUT/rank<N>.json: what the first convolution saw (dtype, channels-last input),
its CPU affinity and threads during training, the learning rate each optimizer step used, the
validation loss after fit, and its final weights (OUT/rank<N>.pt). Rank 0 also saves a
checkpoint into OUT/ckpt. The script's own process writes OUT/main.json after fit and validate:
its CPUs and threads, the validation loss it got back, whether its model holds rank 0's weights."""

import argparse
import json
import os

import lightning as L
import torch
import torchvision
from torch.utils.data import DataLoader, TensorDataset

from nanopatch.lightning import Trainer


class Classifier(L.LightningModule):
    def __init__(self, probe_after_conv=False):
        super().__init__()
        self.model = torchvision.models.resnet18(num_classes=4)
        self.seen = {"dtypes": [], "channels_last": [], "lrs": [], "step_lrs": [], "affinity": None, "threads": None}
        # IPEX swaps the convolution for its own: probe what follows it then
        (self.model.bn1 if probe_after_conv else self.model.conv1).register_forward_hook(self._probe)

    def _probe(self, module, inputs, output):
        if self.training:
            self.seen["dtypes"].append(str(output.dtype))
            self.seen["channels_last"].append(inputs[0].is_contiguous(memory_format=torch.channels_last))

    def training_step(self, batch, _):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.model(x), y)
        # Lightning runs this inside optimizer.step(closure): the learning rate the step uses
        self.seen["step_lrs"].append(self.trainer.optimizers[0].param_groups[0]["lr"])
        self.seen["affinity"] = sorted(os.sched_getaffinity(0))
        self.seen["threads"] = torch.get_num_threads()
        return loss

    def validation_step(self, batch, _):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.model(x), y)
        self.log("val_loss", loss, sync_dist=True)
        return loss

    def on_train_end(self):
        # in the rank that trained (forked: the script's own process never trains)
        rank = self.global_rank
        torch.save(self.model.state_dict(), os.path.join(self.out, f"rank{rank}.pt"))
        first_conv = type(self.model.conv1)  # IPEX's own class once it optimized the model
        report = dict(self.seen, rank=rank, world=self.trainer.world_size, pid=os.getpid())
        report["first_conv"] = f"{first_conv.__module__}.{first_conv.__qualname__}"
        with open(os.path.join(self.out, f"rank{rank}.json"), "w") as f:
            json.dump(report, f)

    def on_validation_end(self):
        path = os.path.join(self.out, f"rank{self.global_rank}.json")
        with open(path) as f:
            report = json.load(f)
        report["val_loss"] = self.trainer.callback_metrics["val_loss"].item()
        with open(path, "w") as f:
            json.dump(report, f)

    def on_before_optimizer_step(self, optimizer):
        self.seen["lrs"].append(optimizer.param_groups[0]["lr"])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.9)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--num-processes", type=int, default=1)
    parser.add_argument("--precision", default="32-true")
    parser.add_argument("--channels-last", action="store_true")
    parser.add_argument("--no-auto-lr", action="store_true")
    parser.add_argument("--use-ipex", action="store_true")
    parser.add_argument("--batches", type=int, default=4)
    args = parser.parse_args()
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(8 * args.batches, 3, 32, 32), torch.randint(0, 4, (8 * args.batches,)))
    module = Classifier(probe_after_conv=args.use_ipex)
    module.out = args.out
    trainer = Trainer(
        num_processes=args.num_processes,
        precision=args.precision,
        channels_last=args.channels_last,
        auto_lr=not args.no_auto_lr,
        use_ipex=args.use_ipex,
        max_epochs=2,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=args.out,
        callbacks=[L.pytorch.callbacks.ModelCheckpoint(dirpath=os.path.join(args.out, "ckpt"))],
    )
    trainer.fit(module, DataLoader(data, batch_size=8, shuffle=True))
    validated = trainer.validate(module, DataLoader(data, batch_size=8), verbose=False)  # after fit, as users do
    # the script's own process, after fit: its CPUs and threads, and what validate returned to it
    main = {"affinity": sorted(os.sched_getaffinity(0)), "threads": torch.get_num_threads()}
    main["val_loss"] = validated[0]["val_loss"]
    main["weights_equal_rank0"] = all(
        torch.equal(v, w)
        for v, w in zip(
            module.model.state_dict().values(),
            torch.load(os.path.join(args.out, "rank0.pt")).values(),
            strict=True,
        )
    )
    with open(os.path.join(args.out, "main.json"), "w") as f:
        json.dump(main, f)


if __name__ == "__main__":
    main()
