"""A training loop written for a CUDA GPU, as such scripts are written: ``.cuda()``, tensors made
with ``device="cuda"``, ``torch.cuda.amp.autocast()`` with a ``GradScaler``, ``pin_memory`` and
``non_blocking`` copies, ``cudnn.benchmark``, ``synchronize`` and ``max_memory_allocated``.

``CUDA_SCRIPT_DEVICE=cpu`` runs the same script as a user would edit it by hand for the CPU
(``"cpu"`` everywhere, ``torch.autocast("cpu", dtype=torch.bfloat16)`` while
``CUDA_SCRIPT_BF16`` is 1, no scaler): the reference ``--cuda-to-cpu`` must learn as.
``--report FILE`` writes the losses and the dtype the first convolution computed in (a forward
hook) as JSON."""

import argparse
import json
import os

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

DEVICE = os.environ.get("CUDA_SCRIPT_DEVICE", "cuda")


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1, bias=False)  # a BatchNorm follows
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1, stride=2)
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.relu(self.conv2(x))
        return self.head(x.mean((2, 3)))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--report")
    args = parser.parse_args()

    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = True
    if DEVICE == "cuda":
        torch.cuda.manual_seed_all(0)
        device = torch.device("cuda")
    else:
        device = torch.device("cpu")

    g = torch.Generator().manual_seed(1)
    x = torch.randn(96, 3, 16, 16, generator=g)
    y = (x[:, 0].mean((1, 2)) > 0).long() + 2 * (x[:, 1].mean((1, 2)) > 0).long()
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True, pin_memory=True)

    model = Net()
    model = model.cuda() if DEVICE == "cuda" else model.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    weights = torch.ones(4, device=device) if DEVICE == "cuda" else torch.ones(4)
    amp_on = DEVICE == "cuda" or os.environ.get("CUDA_SCRIPT_BF16", "1") == "1"
    scaler = torch.cuda.amp.GradScaler() if DEVICE == "cuda" else None

    computed = {}

    def probe(module, inputs, output):
        computed.setdefault("conv1", [str(inputs[0].dtype), str(output.dtype), str(output.device)])

    model.conv1.register_forward_hook(probe)

    losses = []
    for epoch in range(args.epochs):
        for xb, yb in loader:
            if DEVICE == "cuda":
                xb, yb = xb.cuda(non_blocking=True), yb.to("cuda:0", non_blocking=True)
                with torch.cuda.amp.autocast():
                    loss = F.cross_entropy(model(xb), yb, weight=weights)
            else:
                xb, yb = xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp_on):
                    loss = F.cross_entropy(model(xb), yb, weight=weights)
            optimizer.zero_grad(set_to_none=True)
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
            else:
                loss.backward()
                optimizer.step()
            losses.append(loss.item())
        print(f"epoch {epoch} loss {losses[-1]:.4f}")

    if DEVICE == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
        print(f"peak memory {peak / 2**20:.1f} MiB on {torch.cuda.get_device_name()}")
        torch.cuda.empty_cache()
    if args.report:
        with open(args.report, "w") as f:
            json.dump({"losses": losses, "computed": computed}, f)


if __name__ == "__main__":
    main()
