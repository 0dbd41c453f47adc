"""BigDL-Nano custom loops: a TorchNano subclass, and a function decorated with @nano.

    python nano_loop.py OUT (torchnano|decorated) [--num-processes N] [--precision bf16] [--channels-last]
        [--use-ipex] [--no-fabric] [--spawn]

Each process that trains writes OUT/rank<N>.json: what the first convolution saw (dtype,
channels-last input), its affinity and threads, the learning rates the steps used and its
final weights (OUT/rank<N>.pt). The script's own process writes OUT/main.json: what train()
or the decorated function returned, and (for @nano) the weights of the caller's model after it."""

import argparse
import json
import os

import torch
from torch.utils.data import DataLoader, TensorDataset

import nanopatch
import nanopatch.compat.torch_nano
import nanopatch.runtime.processes


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3),
        torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(8, 2),
    )


def make_loader():
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(64, 3, 16, 16, generator=generator)
    y = (x.mean(dim=(1, 2, 3)) > 0).long()
    return DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)


def probe(model, seen):
    def hook(module, inputs, output):
        if module.training:
            seen["dtypes"].append(str(output.dtype))
            seen["channels_last"].append(inputs[0].is_contiguous(memory_format=torch.channels_last))

    model[1 if ARGS.use_ipex else 0].register_forward_hook(hook)  # IPEX swaps the convolution for its own


def training_loop(model, optimizer, loader, backward, seen, epochs=2):
    losses = []
    for _ in range(epochs):
        for x, y in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            backward(loss)

            def closure(loss=loss):  # runs inside the step: the learning rate the step uses
                seen["lrs"].append(optimizer.param_groups[0]["lr"])
                return loss

            optimizer.step(closure)
            losses.append(loss.item())
    seen["affinity"] = sorted(os.sched_getaffinity(0))
    seen["threads"] = torch.get_num_threads()
    return losses


def report(out, rank, model, seen):
    first = type(model[0])  # IPEX's own class once it optimized the model
    seen = dict(seen, first_conv=f"{first.__module__}.{first.__qualname__}")
    # a tensor in shared memory is every process's: each one's steps would land in all of them
    seen["shared"] = [name for name, t in (*model.named_parameters(), *model.named_buffers()) if t.is_shared()]
    torch.save({k: v.contiguous() for k, v in model.state_dict().items()}, os.path.join(out, f"rank{rank}.pt"))
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(dict(seen, rank=rank, pid=os.getpid()), f)


def new_seen():
    return {"dtypes": [], "channels_last": [], "lrs": []}


class MyNano(nanopatch.TorchNano):
    def train(self, out):
        model = make_model()
        seen = new_seen()
        probe(model, seen)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        model, optimizer, loader = self.setup(model, optimizer, make_loader())
        losses = training_loop(model, optimizer, loader, self.backward, seen)
        report(out, self.global_rank, model.module if hasattr(model, "module") else model, seen)
        return {"rank": self.global_rank, "world": self.world_size, "last_loss": losses[-1], "steps": len(losses)}


def parse(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("api", choices=["torchnano", "decorated"])
    parser.add_argument("--num-processes", type=int, default=1)
    parser.add_argument("--precision", default="32")
    parser.add_argument("--channels-last", action="store_true")
    parser.add_argument("--use-ipex", action="store_true")
    parser.add_argument("--no-fabric", action="store_true", help="as if Lightning were not installed")
    parser.add_argument("--spawn", action="store_true", help="as if this process could not fork")
    return parser.parse_args(argv)


ARGS = parse()  # at import: spawned processes import this file again, with the same sys.argv
if ARGS.no_fabric:
    nanopatch.compat.torch_nano.fabric_available = lambda: False
if ARGS.spawn:
    nanopatch.runtime.processes.why_not_fork = lambda: "as a test asks"
SWITCHES = {
    "num_processes": ARGS.num_processes,
    "precision": ARGS.precision,
    "channels_last": ARGS.channels_last,
    "use_ipex": ARGS.use_ipex,
}


@nanopatch.nano(**SWITCHES)
def decorated(model, optimizer, loader, out):
    seen = new_seen()
    probe(model.module if hasattr(model, "module") else model, seen)
    losses = training_loop(model, optimizer, loader, lambda loss: loss.backward(), seen)
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    report(out, rank, model.module if hasattr(model, "module") else model, seen)
    return {"last_loss": losses[-1], "steps": len(losses), "rank": rank}


def main():
    if ARGS.api == "torchnano":
        main_report = {"returned": MyNano(**SWITCHES).train(ARGS.out)}
    else:
        model = make_model()
        before = {k: v.clone() for k, v in model.state_dict().items()}
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        result = decorated(model, optimizer, make_loader(), ARGS.out)
        after = model.state_dict()
        rank0 = torch.load(os.path.join(ARGS.out, "rank0.pt"))
        main_report = {
            "returned": result,
            "changed": any(not torch.equal(before[k], after[k]) for k in before),
            "equals_rank0": all(torch.equal(after[k].contiguous(), rank0[k]) for k in after),
        }
    with open(os.path.join(ARGS.out, "main.json"), "w") as f:
        json.dump(main_report, f)


if __name__ == "__main__":
    main()
