"""The roof a train_step rate is read against: this machine's matrix-product rate, bf16 and fp32,
and the FLOPs of one sample's step.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from families.train_step.models import Job

#: the roof: torch's ROOF_N x ROOF_N matrix product, timed ROOF_REPS times per dtype (median)
ROOF_N, ROOF_REPS = 2048, 12
#: a dtype whose PROBE_N-square product runs below SLOW_RATE FLOP/s (bf16 emulated on a CPU
#: without native bf16: under 1 GFLOP/s, a 2048-square product taking a minute) is timed at PROBE_N
PROBE_N, SLOW_RATE = 512, 5e9


def matmul_rates() -> dict[str, float]:
    """This machine's matrix-product rate in FLOP/s, bf16 and fp32: the median of
    :data:`ROOF_REPS` timed ``torch.mm`` of two :data:`ROOF_N`-square matrices, after a warm-up,
    with the worker's threads. The roof a training step's model FLOP/s are read against. A
    dtype that a :data:`PROBE_N`-square product shows to be far slower (emulated) is timed at
    that size, 3 times."""
    import torch

    def timed(n: int, dtype: torch.dtype, warmup: int, reps: int) -> float:
        a, b = (torch.randn(n, n).to(dtype) for _ in range(2))
        out = torch.empty(n, n, dtype=dtype)
        for _ in range(warmup):
            torch.mm(a, b, out=out)
        took = []
        for _ in range(reps):
            start = time.perf_counter()
            torch.mm(a, b, out=out)
            took.append(time.perf_counter() - start)
        return 2 * n**3 / statistics.median(took)

    rates = {}
    for name, dtype in (("bfloat16", torch.bfloat16), ("float32", torch.float32)):
        probe = timed(PROBE_N, dtype, 1, 1)
        rates[name] = timed(PROBE_N, dtype, 0, 3) if probe < SLOW_RATE else timed(ROOF_N, dtype, 3, ROOF_REPS)
    return rates


def flops_per_sample(job: Job) -> float | None:
    """The model work of one training step per sample: the FLOPs
    ``torch.utils.flop_counter.FlopCounterMode`` counts (matrix products, convolutions,
    attention; forward and backward) over one step, divided by the samples in it."""
    try:
        from torch.utils.flop_counter import FlopCounterMode
    except ImportError:
        return None
    counter = FlopCounterMode(display=False)
    with counter:
        job.step()[1].item()
    return counter.get_total_flops() / job.samples_per_step


def with_roof(rows: list[dict[str, Any]], roof: dict[str, float] | None, flops: float | None) -> list[dict[str, Any]]:
    """Each row with a rate gets its model FLOP/s (``rate`` x the model's FLOPs per sample) and
    their fraction of the roof measured in the same run (``roof_fraction``): see :func:`roof_rate`."""
    top = roof_rate(roof)
    for r in rows:
        r["model_flops"] = r["rate"] * flops if r.get("rate") is not None and flops else None
        r["roof_fraction"] = r["model_flops"] / top[1] if r["model_flops"] is not None and top else None
    return rows


def roof_rate(roof: dict[str, float] | None) -> tuple[str, float] | None:
    """The roof: the faster of the machine's bf16 and fp32 matmul rates, with its dtype's name.
    bf16 on a CPU with native bf16 (avx512_bf16, AMX); on one without, bf16 products are
    emulated, far slower than fp32's, and fp32's rate is the most a step can reach."""
    rates = [(name, rate) for name, rate in (roof or {}).items() if rate]
    return max(rates, key=lambda item: item[1]) if rates else None


def roof_line(roof: dict[str, Any], unit_name: str) -> str:
    """The model's work per sample and the machine's matmul rates it is read against."""
    rates, flops = roof.get("matmul_flops"), roof.get("flops_per_sample")
    work = (
        f"model work {flops / 1e6:,.0f} MFLOP per {unit_name.split('/')[0].rstrip('s')}"
        if flops
        else "model work not counted"
    )
    if not rates:
        return f"Roof not measured; {work}."
    top = roof_rate(rates)
    faster = "bf16" if top and top[0] == "bfloat16" else "fp32 (this CPU's bf16 products are slower)"
    return (
        f"Roof: this machine's {roof['n']}x{roof['n']} matrix product, bf16 {_gflops(rates['bfloat16'])} GFLOP/s, "
        f"fp32 {_gflops(rates['float32'])} GFLOP/s (torch.mm in `{roof['measured_in']}`'s worker, after the rounds); "
        f"{work} (FlopCounterMode over one training step, forward and backward). Model GFLOP/s: rate x model work; "
        f"of roof: their fraction of the faster rate, {faster}."
    )


def _gflops(rate: float) -> str:
    return f"{rate / 1e9:,.0f}" if rate >= 1e10 else f"{rate / 1e9:.2g}"
