"""Lightning DDP on the CPU, 2 processes (rank 0 is this process); each rank reports its threads and affinity."""

import json
import os
import sys

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset


class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(8, 2)

    def training_step(self, batch, _):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.layer(x), y)

    def on_train_start(self):
        report = {
            "name": f"rank{self.global_rank}",
            "pid": os.getpid(),
            "threads": torch.get_num_threads(),
            "affinity": sorted(os.sched_getaffinity(0)),
            "env": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "GOMP_CPU_AFFINITY", "KMP_AFFINITY")},
        }
        with open(os.path.join(sys.argv[1], f"rank{self.global_rank}.json"), "w") as f:
            json.dump(report, f)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


if __name__ == "__main__":
    out = sys.argv[1]
    data = TensorDataset(torch.randn(32, 8), torch.randint(0, 2, (32,)))
    trainer = L.Trainer(
        devices=2,
        strategy="ddp",
        accelerator="cpu",
        max_steps=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Tiny(), DataLoader(data, batch_size=8))
    torch.distributed.destroy_process_group()
    if trainer.global_rank == 0:
        print("RESULT " + json.dumps({"name": "script", "pid": os.getpid()}))
        for name in sorted(os.listdir(out)):
            with open(os.path.join(out, name)) as f:
                print("RESULT " + f.read())
    # Skip interpreter finalization: a gloo thread that takes the GIL during it is ended by
    # pthread_exit, which sometimes aborts the process ("terminate called without an active
    # exception"), with or without nanopatch. What is tested here ran before this point.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
