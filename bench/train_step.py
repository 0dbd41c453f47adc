"""Training-step throughput, stock PyTorch against nanopatch's training patch, side by side.

Times a full training step (``zero_grad``, forward, loss, ``backward``, ``optimizer.step``) as
an unmodified script writes it, on synthetic data with fixed seeds, for:

* ``resnet18`` / ``resnet50``: torchvision's, batch 32 at 224 px, SGD(momentum 0.9),
  cross-entropy over 1000 classes: images/s.
* ``transformer``: a 6-layer ``nn.TransformerEncoder`` language model (embedding + learned
  positions, d_model 512, 8 heads, feed-forward 2048, batch_first, causal mask, vocabulary
  8192), batch 8 x 256 tokens, AdamW, next-token cross-entropy: tokens/s.

in these variants, each in its own persistent worker process:

* ``stock``: nanopatch is never imported (checked).
* ``by-hand``: nanopatch is never imported; the step is edited the way PyTorch's CPU
  performance advice has a user edit it: model and input in channels-last memory (image
  models), forward and loss under ``torch.autocast("cpu", dtype=torch.bfloat16)``. The ceiling
  nanopatch aims at without edits: ``patched`` over ``by-hand`` is what the patch costs or adds.
* ``patched``: ``nanopatch.patch_torch()`` (defaults) before the model and optimizer are built.
* ``compile``: ``nanopatch.patch_torch(compile="default")``; compile time is reported apart.
* ``ipex``: ``nanopatch.patch_torch()`` in an interpreter whose environment has
  intel-extension-for-pytorch built for its torch: this one if it has, or ``--ipex-python``;
  skipped with a note otherwise.
* ``ipex-stock`` (not run by default): nothing patched, in the IPEX interpreter, to tell the
  torch version's share of the ``ipex`` ratio from IPEX's own.

For one model at a time, every variant's worker builds its model and optimizer once and warms
up (``compile`` gets extra warm-up steps); then in every round the parent asks each worker in
turn, the order rotated each round, to run ``--steps`` steps and report the time, so only one
worker computes at a time and machine drift hits every variant alike. Workers use torch's
default threads (all cores the process may use). A model's workers are shut down before the
next model's start. A worker that fails is reported as failed, with its error, and the rest go
on. Prints a Markdown table: the median rate, its spread, the ratio to ``stock`` and, for
``patched``, the target (printed, never asserted). See bench/README.md.

    PYTHONPATH=. python bench/train_step.py [--quick] [--models resnet18,resnet50,transformer]
        [--variants stock,patched,compile,ipex] [--rounds 5] [--steps 3] [--warmup 2]
        [--ipex-python PATH] [--json PATH]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import resource
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/_harness.py, when imported from elsewhere

import _harness as h

STOCK, BY_HAND, PATCHED, COMPILE = "stock", "by-hand", "patched", "compile"
IPEX, IPEX_STOCK = "ipex", "ipex-stock"
VARIANTS = (STOCK, BY_HAND, PATCHED, COMPILE, IPEX, IPEX_STOCK)
DEFAULT_VARIANTS = (STOCK, BY_HAND, PATCHED, COMPILE, IPEX)
#: variant -> patch_torch() keyword arguments; None: nanopatch is not imported at all
PATCH_OPTIONS: dict[str, dict[str, Any] | None] = {
    STOCK: None,
    BY_HAND: None,
    PATCHED: {},
    COMPILE: {"compile": "default"},
    IPEX: {},
    IPEX_STOCK: None,
}
IPEX_VARIANTS = (IPEX, IPEX_STOCK)
MODELS = ("resnet18", "resnet50", "transformer")
HIDDEN_MODELS = ("tiny",)  # a small CNN, for the test suite
#: model -> minimum patched/stock ratio, from the issue. Printed, never asserted.
TARGETS = {"resnet18": 2.5, "resnet50": 2.5, "transformer": 1.8}
CLASSES = 1000
VOCAB = 8192
SEED = 20250
COMPILE_EXTRA_WARMUP = 3  # torch.compile traces and compiles forward and backward in the first steps
SETTLE_S = 0.3  # pause before each request: the previous worker's OpenMP threads stop spinning
#: the sizes: full, and --quick
SHAPES = {
    False: {"image_size": 224, "image_batch": 32, "seq": 256, "text_batch": 8},
    True: {"image_size": 112, "image_batch": 8, "seq": 64, "text_batch": 8},
}
DEFAULTS = {False: {"rounds": 5, "steps": 3, "warmup": 2}, True: {"rounds": 3, "steps": 1, "warmup": 1}}


def tiny_model(classes: int = CLASSES):
    """A small CNN (conv-BN-ReLU twice, pooled, linear) for the benches' own end-to-end
    tests; bench/multi_instance.py uses it too."""
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1, bias=False),
        nn.BatchNorm2d(16),
        nn.ReLU(inplace=True),
        nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False),
        nn.BatchNorm2d(32),
        nn.ReLU(inplace=True),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, classes),
    )


def describe(model: str, shape: dict[str, int]) -> str:
    if model == "transformer":
        return (
            f"6-layer nn.TransformerEncoder LM (d_model 512, 8 heads, ff 2048, vocabulary {VOCAB}), batch "
            f"{shape['text_batch']} x {shape['seq']} tokens, AdamW, next-token cross-entropy"
        )
    name = "small CNN (2 convolutions)" if model == "tiny" else f"torchvision {model}"
    return (
        f"{name}, batch {shape['image_batch']} at {shape['image_size']} px, SGD(momentum 0.9), "
        f"cross-entropy over {CLASSES} classes"
    )


def unit(model: str) -> str:
    return "tokens/s" if model == "transformer" else "img/s"


# --- the worker: one variant's training loop -----------------------------------------------


class Job:
    """A model, its optimizer and one synthetic batch, and the training step a script runs;
    ``by_hand``: the script edited for bf16 autocast and channels-last (the ``by-hand`` variant)."""

    def __init__(self, model_name: str, shape: dict[str, int], by_hand: bool = False) -> None:
        import torch
        from torch import nn

        self.by_hand = by_hand
        torch.manual_seed(SEED)
        if model_name == "transformer":
            batch, seq = shape["text_batch"], shape["seq"]
            self.model = transformer_lm(seq)
            self.optimizer: Any = torch.optim.AdamW(self.model.parameters(), lr=1e-4, weight_decay=0.01)
            tokens = torch.randint(0, VOCAB, (batch, seq + 1))
            self.inputs, self.targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
            self.samples_per_step = batch * seq
        else:
            batch, size = shape["image_batch"], shape["image_size"]
            if model_name == "tiny":
                self.model = tiny_model()
            else:
                import torchvision

                self.model = getattr(torchvision.models, model_name)(weights=None, num_classes=CLASSES)
            self.inputs = torch.randn(batch, 3, size, size)
            if by_hand:
                self.model = self.model.to(memory_format=torch.channels_last)
                self.inputs = self.inputs.contiguous(memory_format=torch.channels_last)
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
            self.targets = torch.randint(0, CLASSES, (batch,))
            self.samples_per_step = batch
        self.criterion = nn.CrossEntropyLoss()
        self.model.train()  # as a script's epoch loop does, after building the optimizer

    def step(self):
        import torch

        self.optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.by_hand):
            output = self.model(self.inputs)
            loss = self.criterion(output.reshape(-1, output.shape[-1]), self.targets.reshape(-1))
        loss.backward()
        self.optimizer.step()
        return output, loss


def transformer_lm(seq: int):
    import torch
    from torch import nn

    class TransformerLM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(VOCAB, 512)
            self.position = nn.Embedding(seq, 512)
            layer = nn.TransformerEncoderLayer(512, 8, 2048, batch_first=True)
            self.encoder = nn.TransformerEncoder(layer, 6, enable_nested_tensor=False)
            self.norm = nn.LayerNorm(512)
            self.head = nn.Linear(512, VOCAB)
            self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq), persistent=False)

        def forward(self, tokens):
            positions = torch.arange(tokens.shape[1], device=tokens.device)
            x = self.embed(tokens) + self.position(positions)
            x = self.encoder(x, mask=self.mask, is_causal=True)
            return self.head(self.norm(x))

    return TransformerLM()


def compute_dtype(model, inputs, autocast: bool = False) -> str | None:
    """The dtype the first convolution or linear layer computes in (bfloat16 under autocast),
    from one extra forward pass without gradients on the eager model (a compiled model's
    ``_orig_mod``), with forward hooks that are removed at once: hooks on the compiled model
    would make torch.compile recompile. Layers are found by class name, so IPEX's replacements
    (``_IPEXConv2d``, ``_IPEXLinear``) count too. ``autocast``: under bf16 autocast, as the
    ``by-hand`` step runs its forward."""
    import torch

    model = getattr(model, "_orig_mod", model)
    seen: list[Any] = []

    def hook(module, args, output):
        if not seen and isinstance(output, torch.Tensor):
            seen.append(output.dtype)

    layers = [m for m in model.modules() if leaf_layer(m)]
    handles = [m.register_forward_hook(hook) for m in layers]
    try:
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            model(inputs)
    finally:
        for handle in handles:
            handle.remove()
    return str(seen[0]).replace("torch.", "") if seen else None


def observed(job: Job, compute_dtype: str | None, output, loss) -> dict[str, Any]:
    """What the step really ran, seen from outside the patch."""
    import torch

    conv = next((m for m in job.model.modules() if isinstance(m, torch.nn.Conv2d)), None)
    channels_last = None
    if conv is not None:
        weight = conv.weight
        channels_last = weight.is_contiguous(memory_format=torch.channels_last) and not weight.is_contiguous()
    graphs = None
    if "torch._dynamo" in sys.modules:
        try:
            from torch._dynamo.utils import counters

            graphs = int(counters["stats"]["unique_graphs"])
        except Exception:  # private API: only informative
            graphs = None
    return {
        "model_class": f"{type(job.model).__module__}.{type(job.model).__qualname__}",
        "optimizer_class": f"{type(job.optimizer).__module__}.{type(job.optimizer).__qualname__}",
        "compute_dtype": compute_dtype,
        "output_dtype": str(output.dtype).replace("torch.", ""),
        "loss_dtype": str(loss.dtype).replace("torch.", ""),
        "conv_weight_channels_last": channels_last,
        "ipex_imported": "intel_extension_for_pytorch" in sys.modules,
        "dynamo_graphs": graphs,
    }


def probed_step(job: Job) -> dict[str, Any] | None:
    """One untimed training step with a forward hook on the model's first convolution or linear
    layer (by class name, so IPEX's replacements count): the dtype it computed in and whether its
    input was channels-last, seen from inside the model. None when the step ran a compiled graph
    and the hook saw nothing: a hook added to the eager modules does not run inside it."""
    probe = h.Probe()
    probe.attach(getattr(job.model, "_orig_mod", job.model), leaf_layer)
    probe.active = True
    try:
        job.step()[1].item()
    finally:
        probe.detach()
    if probe.calls == 0 and "torch._dynamo" in sys.modules:
        return None
    return probe.as_dict()


def leaf_layer(module) -> bool:
    name = type(module).__name__
    return ("Conv" in name or "Linear" in name) and next(module.children(), None) is None


def rss_mib() -> tuple[float, float]:
    """(current, peak) resident memory of this process in MiB."""
    with open("/proc/self/statm") as f:
        current = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    return current, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class Trainer:
    """The worker's state: built and warmed up by ``setup``, timed by ``run``."""

    def __init__(self) -> None:
        self.job: Job | None = None

    def setup(self, request: dict[str, Any]) -> dict[str, Any]:
        started = time.perf_counter()
        import torch

        options = request["patch"]
        if options is None:
            assert "nanopatch" not in sys.modules, "stock variant: nanopatch got imported"
        else:
            import nanopatch

            nanopatch.patch_torch(**options)  # before the model and optimizer are built
        imported = time.perf_counter()
        job = self.job = Job(request["model"], request["shape"], by_hand=request.get("by_hand", False))
        built = time.perf_counter()
        warmup_s = []
        for _ in range(request["warmup"]):
            start = time.perf_counter()
            output, loss = job.step()
            loss.item()
            warmup_s.append(time.perf_counter() - start)
        facts = observed(job, compute_dtype(job.model, job.inputs, autocast=job.by_hand), output, loss)
        facts["probe"] = probed_step(job)
        if options is None:
            assert "nanopatch" not in sys.modules, "stock variant: nanopatch got imported"
        reply: dict[str, Any] = {
            "python": sys.executable,
            "python_version": platform.python_version(),
            "torch": torch.__version__,
            "torchvision": h.installed("torchvision"),
            "ipex": h.installed("intel-extension-for-pytorch"),
            "threads": torch.get_num_threads(),
            "interop_threads": torch.get_num_interop_threads(),
            "affinity": sorted(os.sched_getaffinity(0)),
            "omp_num_threads_env": os.environ.get("OMP_NUM_THREADS"),
            "nanopatch_imported": "nanopatch" in sys.modules,
            "samples_per_step": job.samples_per_step,
            "import_s": imported - started,
            "build_s": built - imported,
            "warmup_step_s": warmup_s,
            "observed": facts,
            "peak_rss_mib": rss_mib()[1],
        }
        if options is not None:
            import nanopatch

            status = nanopatch.status()
            reply["nanopatch"] = {
                "patch_torch": options,
                "options": {
                    name: {"value": entry["value"], "reason": entry["reason"]}
                    for name, entry in status["options"].items()
                    if name in ("training", "bf16", "channels_last", "ipex", "compile")
                },
                "targets": {name: target["state"] for name, target in status["targets"].items()},
            }
        return reply

    def run(self, steps: int) -> dict[str, Any]:
        assert self.job is not None, "run before setup"
        request_cpu = time.process_time()
        gc.collect()
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        cpu_start = time.process_time()
        start = time.perf_counter()
        for _ in range(steps):
            _, loss = self.job.step()
        value = loss.item()
        elapsed = time.perf_counter() - start
        cpu = time.process_time() - cpu_start
        current, peak = rss_mib()
        return {
            "elapsed_s": elapsed,
            "cpu_s": cpu,
            "loss": value,
            "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults,
            "rss_mib": current,
            "peak_rss_mib": peak,
            "request_cpu_s": time.process_time() - request_cpu,
        }


def worker_main() -> int:
    """Answer the parent's requests, one JSON line each, until it says exit. Only the answers
    go to the real stdout; anything else printed (by torch, IPEX, ...) goes to stderr."""
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    trainer = Trainer()
    for line in sys.stdin:
        request = json.loads(line)
        try:
            if request["cmd"] == "exit":
                return 0
            reply = trainer.setup(request) if request["cmd"] == "setup" else trainer.run(request["steps"])
        except BaseException as exc:
            text = traceback.format_exc()
            print(text, file=sys.stderr, flush=True)
            answers.write(json.dumps({"error": f"{type(exc).__name__}: {exc}", "traceback": text}) + "\n")
            return 1
        answers.write(json.dumps(reply) + "\n")
    return 0


# --- the parent: workers, rounds, report ---------------------------------------------------


class WorkerFailed(Exception):
    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.detail = detail


class Worker:
    """One variant's persistent process, spoken to in JSON lines over its stdin/stdout."""

    def __init__(self, variant: str, python: str, env: dict[str, str], timeout: float) -> None:
        self.variant, self.timeout = variant, timeout
        self.stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [python, os.path.abspath(__file__), "--worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            env=env,
            text=True,
        )

    def request(self, payload: dict[str, Any]) -> dict[str, Any]:
        try:
            assert self.proc.stdin is not None and self.proc.stdout is not None
            self.proc.stdin.write(json.dumps(payload) + "\n")
            self.proc.stdin.flush()
            ready, _, _ = select.select([self.proc.stdout], [], [], self.timeout)
            if not ready:
                self.proc.kill()
                raise WorkerFailed(f"no answer within {self.timeout:.0f} s (killed)", self.stderr_tail())
            line = self.proc.stdout.readline()
        except (BrokenPipeError, OSError):
            line = ""
        if not line:
            raise WorkerFailed(self.exit_reason(), self.stderr_tail())
        try:
            reply = json.loads(line)
        except ValueError:
            raise WorkerFailed(f"answered something else than JSON: {line[:200]!r}", self.stderr_tail()) from None
        if "error" in reply:
            raise WorkerFailed(reply["error"], reply.get("traceback", ""))
        return reply

    def exit_reason(self) -> str:
        try:
            code = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            return "stopped answering"
        if code < 0:
            name = signal.Signals(-code).name
            hint = " (out of memory? the kernel's OOM killer sends SIGKILL)" if -code == signal.SIGKILL else ""
            reason = f"killed by {name}{hint}"
        else:
            reason = f"exited with status {code}"
        last = [line for line in self.stderr_tail().splitlines() if line.strip()]
        return f"{reason}: {last[-1].strip()}" if last else reason

    def stderr_tail(self, lines: int = 25) -> str:
        self.stderr.seek(0)
        text = self.stderr.read().decode(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(json.dumps({"cmd": "exit"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass
        self.stderr.close()


def ipex_interpreter(given: str | None, env: dict[str, str]) -> tuple[str | None, str]:
    """(python, why) for the ipex variants: ``given`` or else this interpreter, if its IPEX
    matches its torch (nanopatch's own check, from package metadata: importing a mismatched
    IPEX ends the interpreter); (None, why not) otherwise."""
    python = given or sys.executable
    code = "import json; from nanopatch.config import ipex_compatibility as c; print(json.dumps(c()))"
    try:
        done = subprocess.run([python, "-c", code], capture_output=True, text=True, env=env, timeout=120)
        ok, why = json.loads(done.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as exc:
        return None, f"could not ask {python} about IPEX: {exc}"
    if ok:
        return python, why
    hint = "" if given else "; give an interpreter that has it with --ipex-python PATH"
    return None, f"{python}: {why}{hint}"


def failed(error: str, detail: str = "") -> dict[str, Any]:
    return {"status": "failed", "error": error, "detail": detail, "samples": []}


def run_model(model: str, variants: list[str], pythons: dict[str, str], skipped: dict[str, str], args, env, log):
    """Start every variant's worker for ``model`` (one after another), then run the rounds.
    ``pythons``: variant -> interpreter; ``skipped``: variant -> why it does not run."""
    shape = SHAPES[args.quick]
    started = time.perf_counter()
    results: dict[str, dict[str, Any]] = {}
    workers: dict[str, Worker] = {}
    rounds: list[dict[str, Any]] = []
    try:
        for variant in variants:
            if variant in skipped:
                results[variant] = {"status": "skipped", "error": skipped[variant], "samples": []}
                continue
            python = pythons[variant]
            warmup = args.warmup + (COMPILE_EXTRA_WARMUP if variant == COMPILE else 0)
            log(f"{model}: starting {variant} ({python}), {warmup} warm-up step(s)")
            worker = Worker(variant, python, env, args.timeout)
            request = {"cmd": "setup", "model": model, "shape": shape, "warmup": warmup, "by_hand": variant == BY_HAND}
            try:
                setup = worker.request({**request, "patch": PATCH_OPTIONS[variant]})
            except WorkerFailed as exc:
                log(f"{model}: {variant} failed: {exc}")
                results[variant] = failed(str(exc), exc.detail)
                worker.close()
                continue
            workers[variant] = worker
            results[variant] = {"status": "ok", "setup": setup, "samples": []}
        for index in range(args.rounds):
            live = [v for v in variants if v in workers]
            if not live:
                break
            order = h.rotated(live, index)
            rounds.append({"order": order, "loadavg": h.load_average()})
            log(f"{model}: round {index + 1}/{args.rounds}: {', '.join(order)}")
            for variant in order:
                time.sleep(SETTLE_S)
                try:
                    meter = h.LoadMeter()
                    sample = workers[variant].request({"cmd": "run", "steps": args.steps})
                    sample["other_load"] = meter.other_load(sample["request_cpu_s"])
                except WorkerFailed as exc:
                    log(f"{model}: {variant} failed: {exc}")
                    done = results[variant]["samples"]
                    results[variant] = {**failed(str(exc), exc.detail), "setup": results[variant]["setup"]}
                    results[variant]["samples_before_failure"] = done
                    workers.pop(variant).close()
                    continue
                sample["round"] = index
                results[variant]["samples"].append(sample)
    finally:
        for worker in workers.values():
            worker.close()
    return {
        "description": describe(model, shape),
        "unit": unit(model),
        "shape": shape,
        "rounds": rounds,
        "seconds": time.perf_counter() - started,
    }, summarise(model, results, args.steps)


def summarise(model: str, results: dict[str, dict[str, Any]], steps: int) -> list[dict[str, Any]]:
    """One row per variant: the median rate over the rounds, its spread, the ratio to stock, and
    the worker's setup and samples."""
    rows = []
    for variant, result in results.items():
        common = ("train_step", model, variant)
        if result["status"] != "ok":
            note = h.one_line(result.get("error") or result["status"])
            rows.append(h.row(*common, None, unit(model), None, stock=variant == STOCK, note=note, **result))
            continue
        samples, setup = result["samples"], result["setup"]
        rates = [steps * setup["samples_per_step"] / s["elapsed_s"] for s in samples]
        stats = h.spread(rates)
        step_s = statistics.median(s["elapsed_s"] / steps for s in samples)
        warmup = setup["warmup_step_s"]
        extra_s = sum(warmup) - len(warmup) * step_s  # warm-up time beyond as many steady steps
        r = h.row(
            *common,
            stats["median"],
            unit(model),
            None,
            stock=variant == STOCK,
            rates=rates,
            rounds=[s["round"] for s in samples],
            cpu_share=statistics.median(s["cpu_s"] / s["elapsed_s"] / setup["threads"] for s in samples),
            other_load=max((s["other_load"] for s in samples if s["other_load"] is not None), default=None),
            iqr_pct=stats["iqr_pct"],
            step_s=step_s,
            first_step_s=warmup[0] if warmup else None,
            warmup_extra_s=extra_s,
            peak_rss_mib=max(s["peak_rss_mib"] for s in samples),
            target_x_stock=TARGETS.get(model) if variant == PATCHED else None,
            **result,
        )
        if variant == COMPILE:
            r["compile_s"] = extra_s
        rows.append(r)
    stock = next((r for r in rows if r["stock"] and r["rate"] is not None), None)
    h.ratios_to(rows, stock)
    for r in rows:
        if r.get("target_x_stock") is not None and r["ratio_to_stock"] is not None:
            r["met"] = r["ratio_to_stock"] >= r["target_x_stock"]
    return rows


def ran_as(setup: dict[str, Any]) -> str:
    """A short account of what a variant's step really ran."""
    seen = setup["observed"]
    parts = [f"torch {setup['torch'].split('+')[0]}", f"{seen['compute_dtype'] or '?'} compute"]
    parts.append(f"inside {h.inside(seen['probe'])}" if seen["probe"] else "inside not probed (compiled)")
    if seen["conv_weight_channels_last"] is not None:
        parts.append("channels-last" if seen["conv_weight_channels_last"] else "NCHW")
    if seen["ipex_imported"]:
        parts.append(f"IPEX {setup['ipex']}")
    if seen["dynamo_graphs"]:
        parts.append(f"compiled ({seen['dynamo_graphs']} graphs)")
    parts.append(f"{seen['loss_dtype']} loss")
    return ", ".join(parts)


def notes_for(rows: list[dict[str, Any]]) -> list[str]:
    ok = {r["variant"]: r for r in rows if r["status"] == "ok"}
    notes = []
    for variant, result in ok.items():
        state = result["setup"]["nanopatch"]["targets"].get("training") if "nanopatch" in result["setup"] else None
        if "nanopatch" in result["setup"] and state != "patched":
            notes.append(f"`{variant}`: nanopatch's training target is {state}")
        if result["setup"]["observed"]["loss_dtype"] != "float32":
            notes.append(f"`{variant}`: the loss was computed in {result['setup']['observed']['loss_dtype']}")
    suspects = {v: r for v, r in ok.items() if h.suspect(r)}
    busy = [f"`{v}` CPU {r['cpu_share']:.0%}, other {r.get('other_load') or 0:.0%}" for v, r in suspects.items()]
    if busy:
        notes.append(
            f"CPU below {h.BUSY_CPU_SHARE:.0%} or other load above {h.OTHER_LOAD_WARNING:.0%} ({'; '.join(busy)}): "
            "other processes were taking the cores, so these rates are suspect"
        )
    return notes


def print_markdown(report: dict[str, Any]) -> None:
    machine = report["machine"]
    print("## Training step: stock against nanopatch\n")
    print(h.cpu_line(machine) + f"; memory {machine['mem_total_gib'] or 0:.0f} GiB")
    for python, info in report["interpreters"].items():
        print(
            f"- `{python}` ({', '.join(info['variants'])}): Python {info['python_version']}, torch {info['torch']}, "
            f"torchvision {info['torchvision']}, IPEX {info['ipex'] or '-'}; threads: {info['threads']} intra-op "
            f"(torch's default), {info['interop_threads']} inter-op, affinity CPUs "
            f"{','.join(map(str, info['affinity']))}, OMP_NUM_THREADS {info['omp_num_threads_env'] or 'unset'}"
        )
    print(
        f"- {report['rounds']} rounds x {report['steps']} steps per variant, order rotated each round, one worker "
        f"computing at a time; warm-up {report['warmup']} steps (+{COMPILE_EXTRA_WARMUP} for compile)"
        f"{'; --quick sizes' if report['quick'] else ''}; 1-min load average at start {machine['loadavg_start']}"
    )
    for model, result in report["models"].items():
        print(f"\n### {model}: {result['description']} ({result['unit']})\n")
        print(
            f"| variant | {result['unit']} | min-max | IQR | CPU | x stock | per round | target | met "
            "| first step s | warm-up extra s | peak RSS MiB | ran as |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---|")
        rows = [r for r in report["rows"] if r["group"] == model]
        for row in rows:
            variant = row["variant"]
            if row["status"] != "ok":
                error = h.cell(row["error"])
                print(f"| {variant} | {row['status']} |  |  |  |  |  |  |  |  |  |  | {error} |")
                continue
            target = row["target_x_stock"]
            per_round = row.get("ratio_per_round") or []
            spread = f"{min(per_round):.2f}-{max(per_round):.2f}" if per_round and variant != STOCK else ""
            cells = [
                variant,
                h.fmt(row["rate"]),
                "-".join(h.fmt(x) for x in row["spread"]),
                f"{row['iqr_pct']:.0f}%",
                f"{row['cpu_share'] * 100:.0f}%",
                f"{row['ratio_to_stock']:.2f}x" if row["ratio_to_stock"] is not None else "",
                spread,
                f">={target:g}x" if target is not None else "",
                ("yes" if row["met"] else "no") if "met" in row else "",
                f"{row['first_step_s']:.1f}" if row["first_step_s"] is not None else "",
                f"{max(0.0, row['warmup_extra_s']):.1f}",
                f"{row['peak_rss_mib']:.0f}",
                ran_as(row["setup"]),
            ]
            print("| " + " | ".join(cells) + " |")
        notes = notes_for(rows)
        if notes:
            print()
            for note in notes:
                print(f"- {note}")
    print(
        "\nRates: median over the rounds of (steps x samples per step / wall time of the steps). min-max and IQR "
        "(interquartile range / median): the spread of those samples. CPU: the worker's CPU time / (wall time x "
        "its threads); well below 100%, other processes shared the cores. Other load (in the notes): the CPU time "
        "the rest of the machine took during a sample, as a share of all CPUs. x stock: ratio of the medians; per "
        "round: the range of the ratio to stock's sample of the same round. Warm-up extra: warm-up time beyond "
        "as many steady steps (for compile: the compile time). Targets are printed, never asserted."
    )
    for note in report["notes"]:
        print(f"\nNote: {note}")
    print(f"\nRun took {report['seconds']:.0f} s.")


def interpreters(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per interpreter, what its workers reported about themselves (first report wins)."""
    out: dict[str, dict[str, Any]] = {}
    keys = ("python_version", "torch", "torchvision", "ipex", "threads", "interop_threads", "affinity")
    for row in rows:
        if "setup" not in row:
            continue
        setup = row["setup"]
        entry = out.setdefault(setup["python"], {"variants": [], **{k: setup[k] for k in keys}})
        entry["omp_num_threads_env"] = setup["omp_num_threads_env"]
        if row["variant"] not in entry["variants"]:
            entry["variants"].append(row["variant"])
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated (default: %(default)s)")
    parser.add_argument(
        "--variants",
        default=",".join(DEFAULT_VARIANTS),
        help=f"comma-separated, of {', '.join(VARIANTS)} (default: %(default)s)",
    )
    parser.add_argument("--rounds", type=int, help="timed rounds (default 5; 3 with --quick)")
    parser.add_argument("--steps", type=int, help="training steps per variant and round (default 3; 1 with --quick)")
    parser.add_argument(
        "--warmup",
        type=int,
        help=f"untimed steps after building (default 2; 1 with --quick); compile gets {COMPILE_EXTRA_WARMUP} more",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="small sizes to check that it works: 112 px, image batch 8, 64 tokens; 3 rounds of 1 step",
    )
    parser.add_argument(
        "--ipex-python",
        help="interpreter for the ipex variants, whose environment has intel-extension-for-pytorch matching its "
        "torch (default: this one, if it has)",
    )
    parser.add_argument(
        "--timeout", type=float, default=3600, help="seconds a worker may take to answer (default %(default)s)"
    )
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)  # internal: one variant's process
    args = parser.parse_args(argv)
    if args.worker:
        return worker_main()
    models = h.parse_names(args.models, MODELS + HIDDEN_MODELS, "--models", parser, shown=MODELS)
    variants = h.parse_names(args.variants, VARIANTS, "--variants", parser)
    for name, value in DEFAULTS[args.quick].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if min(args.rounds, args.steps, args.warmup) < 1:
        parser.error("--rounds, --steps and --warmup must be >= 1")

    log = h.log
    started = time.perf_counter()
    env = h.clean_env()
    machine = h.machine_facts("intel-extension-for-pytorch")
    pythons = {v: sys.executable for v in variants if v not in IPEX_VARIANTS}
    skipped: dict[str, str] = {}
    notes = []
    if any(v in IPEX_VARIANTS for v in variants):
        ipex_python, why = ipex_interpreter(args.ipex_python, env)
        if ipex_python is None:
            skipped = {v: f"skipped: {why}" for v in variants if v in IPEX_VARIANTS}
            notes.append(f"the ipex variants are skipped: {why}.")
            log(f"ipex variants skipped: {why}")
        else:
            pythons.update({v: ipex_python for v in variants if v in IPEX_VARIANTS})
            if ipex_python == sys.executable:
                if IPEX in variants and PATCHED in variants:
                    notes.append("`ipex` ran in the same interpreter as `patched`: both are patch_torch() defaults.")
            elif IPEX in variants:
                share = "`ipex-stock` shows that share" if IPEX_STOCK in variants else "add `ipex-stock` to see it"
                notes.append(
                    f"`ipex` runs in {ipex_python} ({why}): its ratio to stock includes the difference between "
                    f"the two interpreters' torch ({share})."
                )
    results, rows = {}, []
    for model in models:
        results[model], model_rows = run_model(model, variants, pythons, skipped, args, env, log)
        rows += model_rows
    report = {
        "benchmark": "train_step",
        "argv": sys.argv[1:] if argv is None else list(argv),
        "quick": args.quick,
        "rounds": args.rounds,
        "steps": args.steps,
        "warmup": args.warmup,
        "compile_extra_warmup": COMPILE_EXTRA_WARMUP,
        "seed": SEED,
        "machine": machine,
        "interpreters": interpreters(rows),
        "variant_options": {v: PATCH_OPTIONS[v] for v in variants},
        "models": results,
        "rows": rows,
        "notes": notes,
        "seconds": time.perf_counter() - started,
    }
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    print_markdown(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
