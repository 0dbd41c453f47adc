"""A BigDL-Nano script written as its guides write them: the training runs at the script's top
level, with no ``if __name__ == "__main__":`` guard, a lambda collate function, a model class
and a closure defined in the script.

    python nano_unguarded.py OUT (torchnano|decorated|trainer) [--no-fabric] [--fail|--hang]

Every process that runs the top-level code appends its pid to OUT/top-level.txt. Each
training process writes OUT/pid<N> as it starts training, and OUT/rank<N>.json (its affinity,
threads, the learning rate of each step, its pid) and OUT/rank<N>.pt (its final weights) at
the end; the script's process writes OUT/main.json with what came back. ``--fail`` raises in
rank 1's first step; ``--hang`` waits there, in every rank, for a signal.
"""

import json
import os
import sys
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

import nanopatch
import nanopatch.compat.torch_nano

OUT, API = sys.argv[1], sys.argv[2]
FAIL, HANG = "--fail" in sys.argv, "--hang" in sys.argv
if "--no-fabric" in sys.argv:  # as if Lightning were not installed
    nanopatch.compat.torch_nano.fabric_available = lambda: False
with open(os.path.join(OUT, "top-level.txt"), "a") as f:
    f.write(f"{os.getpid()}\n")
print("preparing the data", flush=True)


class Net(torch.nn.Module):
    """Defined in the script: a spawned process could not find it without importing the script."""

    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256))
        self.head = torch.nn.Linear(256, 2)  # ~330 KB of weights: more than a pipe holds

    def forward(self, x):
        return self.head(torch.relu(self.body(x)))


torch.manual_seed(0)
X = torch.randn(64, 32)
Y = (X.sum(dim=1) > 0).long()
LOADER = DataLoader(
    TensorDataset(X, Y),
    batch_size=8,
    shuffle=True,
    collate_fn=lambda batch: tuple(map(torch.stack, zip(*batch, strict=True))),
)


def rank_now():
    return torch.distributed.get_rank() if torch.distributed.is_initialized() else 0


def first_step(rank):
    path = os.path.join(OUT, f"pid{rank}")
    if os.path.exists(path):
        return
    with open(path + ".part", "w") as f:  # whole or absent: the launcher may end this rank any time
        f.write(str(os.getpid()))
    os.replace(path + ".part", path)
    if FAIL and rank == 1:
        raise ValueError("rank 1 found a bad batch")
    if HANG:
        time.sleep(600)


def train_epochs(model, optimizer, loader, backward, epochs=2):
    seen = {"lrs": [], "losses": []}
    for _ in range(epochs):
        for x, y in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            backward(loss)

            def closure(loss=loss):  # runs inside the step: the learning rate the step uses
                seen["lrs"].append(optimizer.param_groups[0]["lr"])
                return loss

            optimizer.step(closure)
            seen["losses"].append(loss.item())
            first_step(rank_now())
    plain = model.module if hasattr(model, "module") else model
    rank = rank_now()
    torch.save(plain.state_dict(), os.path.join(OUT, f"rank{rank}.pt"))
    report = dict(seen, rank=rank, pid=os.getpid(), affinity=sorted(os.sched_getaffinity(0)))
    report["threads"] = torch.get_num_threads()
    if torch.distributed.is_initialized():  # what the job listens on, the group up: the caller's and the ranks'
        from helpers.listening import children, listening

        report["listening"] = listening({os.getppid(), *children(os.getppid())})
    with open(os.path.join(OUT, f"rank{rank}.json"), "w") as f:
        json.dump(report, f)
    return {"rank": rank, "steps": len(seen["losses"]), "weights": plain.state_dict()}


if API == "trainer":
    import lightning as L

    from nanopatch.lightning import Trainer

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = Net()
            self.seen = {"lrs": [], "losses": []}

        def training_step(self, batch, _):
            x, y = batch
            loss = torch.nn.functional.cross_entropy(self.net(x), y)
            self.seen["lrs"].append(self.trainer.optimizers[0].param_groups[0]["lr"])
            self.seen["losses"].append(loss.item())
            first_step(self.global_rank)
            return loss

        def on_train_end(self):
            rank = self.global_rank
            torch.save(self.net.state_dict(), os.path.join(OUT, f"rank{rank}.pt"))
            report = dict(self.seen, rank=rank, pid=os.getpid(), affinity=sorted(os.sched_getaffinity(0)))
            report["threads"] = torch.get_num_threads()
            with open(os.path.join(OUT, f"rank{rank}.json"), "w") as f:
                json.dump(report, f)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    module = Module()
    trainer = Trainer(
        num_processes=2, max_epochs=2, logger=False, enable_checkpointing=False, enable_progress_bar=False
    )
    trainer.fit(module, LOADER)
    rank0 = torch.load(os.path.join(OUT, "rank0.pt"))
    main = {"equals_rank0": all(torch.equal(v, rank0[k]) for k, v in module.net.state_dict().items())}
elif API == "decorated":

    @nanopatch.nano(num_processes=2)
    def fit(model, optimizer, loader):
        return train_epochs(model, optimizer, loader, lambda loss: loss.backward())

    model = Net()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    result = fit(model, torch.optim.SGD(model.parameters(), lr=0.05), LOADER)
    rank0 = torch.load(os.path.join(OUT, "rank0.pt"))
    main = {
        "rank": result["rank"],
        "steps": result["steps"],
        "changed": any(not torch.equal(before[k], v) for k, v in model.state_dict().items()),
        "equals_rank0": all(torch.equal(v, rank0[k]) for k, v in model.state_dict().items()),
    }
else:

    class MyNano(nanopatch.TorchNano):
        def train(self, lr):
            model = Net()
            optimizer = torch.optim.SGD(model.parameters(), lr=lr)
            model, optimizer, loader = self.setup(model, optimizer, LOADER)
            return train_epochs(model, optimizer, loader, self.backward)

    result = MyNano(num_processes=2).train(0.05)
    rank0 = torch.load(os.path.join(OUT, "rank0.pt"))
    main = {
        "rank": result["rank"],
        "steps": result["steps"],
        "equals_rank0": all(torch.equal(v, rank0[k]) for k, v in result["weights"].items()),
    }
with open(os.path.join(OUT, "main.json"), "w") as f:
    json.dump(main, f)
print("done", flush=True)
