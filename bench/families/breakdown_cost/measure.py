"""breakdown_cost's measurement: the same training loop with and without the breakdown option, and
the cost of its hooks, in interleaved rounds.
"""

from __future__ import annotations

import statistics
import time

import harness as h

TARGET_SHARE = 0.01
BATCH = 32
WARMUP_STEPS = 20


def loops() -> dict:
    """name -> (model, a DataLoader of batches for it)."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    cnn = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(16, 32, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(32, 10),
    )
    n = 4096
    labels = torch.randint(0, 10, (n,))
    return {
        "tiny MLP": (mlp, DataLoader(TensorDataset(torch.randn(n, 64), labels), batch_size=BATCH, shuffle=True)),
        "small CNN": (cnn, DataLoader(TensorDataset(torch.randn(n, 3, 32, 32), labels), batch_size=BATCH)),
    }


def run_steps(model, loader, steps: int) -> float:
    """Seconds per step over ``steps`` steps (the loader restarted as it runs out)."""
    import torch

    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    done, start = 0, time.perf_counter()
    while done < steps:
        for x, y in loader:
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
            done += 1
            if done == steps:
                break
    return (time.perf_counter() - start) / steps


def measure(rounds: int, steps: int) -> dict[str, dict[str, list[float]]]:
    import nanopatch

    times: dict[str, dict[str, list[float]]] = {}
    options = {"training": False, "vision": False, "data_parallel": False}
    for name, (model, loader) in loops().items():
        times[name] = {"off": [], "on": []}
        for mode in ("off", "on"):  # warm-up, untimed
            with nanopatch.patched(breakdown=mode == "on", **options):
                run_steps(model, loader, WARMUP_STEPS)
        for index in range(rounds):
            for mode in h.rotated(["off", "on"], index):
                with nanopatch.patched(breakdown=mode == "on", **options):
                    times[name][mode].append(run_steps(model, loader, steps))
    return times


def hook_cost() -> dict[str, float]:
    """Seconds nanopatch's breakdown adds per batch (its wrapt ``__next__`` wrapper around a call
    that returns a ready batch) and per optimizer step (its pre- and post-step hooks), timed
    directly over many calls against the bare call."""
    import torch
    import wrapt

    from nanopatch.targets.breakdown import patch as breakdown

    batch = (torch.zeros(32, 8), torch.zeros(32, dtype=torch.long))
    n = 20000

    class Iterator:
        def __next__(self):
            return batch

    bare, wrapped = (
        Iterator(),
        type("Wrapped", (), {"__next__": wrapt.FunctionWrapper(Iterator.__next__, breakdown._next)})(),
    )
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)

    def per_call(call) -> float:
        start = time.perf_counter()
        for _ in range(n):
            call()
        return (time.perf_counter() - start) / n

    def hooks() -> None:
        breakdown._step_pre(optimizer, (optimizer,), {})
        breakdown._step_post(optimizer, (optimizer,), {})

    breakdown._meter = breakdown._Meter()
    try:
        samples = {"batch": [], "step": []}
        for _ in range(5):
            samples["batch"].append(per_call(lambda: next(wrapped)) - per_call(lambda: next(bare)))
            samples["step"].append(per_call(hooks))
    finally:
        breakdown._meter = None
    return {key: statistics.median(values) for key, values in samples.items()}


def rows(times: dict[str, dict[str, list[float]]]) -> list[dict]:
    """Rate: microseconds per step; ratio: off's step time / on's (1.00x: no cost)."""
    out = []
    for name, modes in times.items():
        off = statistics.median(modes["off"])
        for mode, samples in modes.items():
            median = statistics.median(samples)
            cost = median - off
            note = None if mode == "off" else f"cost {cost * 1e6:+.1f} us a step ({cost / off:+.2%} of it)"
            out.append(
                h.row("breakdown_cost", name, f"breakdown {mode}", median * 1e6, "us/step", off / median,
                      stock=mode == "off", rates=[s * 1e6 for s in samples], note=note)
            )  # fmt: skip
    return out
