"""``--compare``'s closing lines, the result at a glance: the speed-up, whether both runs reached
the same accuracy (judged against the noise the runs carry), what was accelerated and what was
not and why, and where to look next. Built here from runs' output and accounts, no script run;
tests/runner/test_example_imagefolder.py reads them off the demo script's real comparison."""

from __future__ import annotations

import multiprocessing
import os
import types

import pytest

from nanopatch.foundation import usage
from nanopatch.runner import _summary, output

AVX2 = types.SimpleNamespace(
    model_name="AMD EPYC 7B13", usable_cores=2, amx=False, native_bf16=False, avx512=False, avx2=True
)
AMX = types.SimpleNamespace(
    model_name="Intel(R) Xeon(R) Platinum 8481C", usable_cores=16, amx=True, native_bf16=True, avx512=True, avx2=True
)

OPTIONS_NO_BF16 = {
    "bf16": {
        "value": False,
        "source": "auto",
        "reason": "CPU has no native bf16 instructions (needs avx512_bf16 or amx_bf16); bf16 would be emulated",
    },
    "ipex": {"value": False, "source": "auto", "reason": "intel-extension-for-pytorch is not installed"},
    "compile": {"value": False, "source": "default", "reason": "default"},
}
RESNET = {
    "model": "ResNet",
    "optimizers": ["SGD"],
    "stock": None,
    "training_calls": 60,
    "computed_in": "float32",
    "channels_last": "channels_last",
    "ipex": False,
    "compile": None,
    "fast_dropout": False,
    "data_parallel": False,
    "notes": ["SGD: fused step"],
    "bf16_measured": None,
}
REPORT = {
    "models": [RESNET],
    "options": OPTIONS_NO_BF16,
    "vision": {"state": "patched", "detail": "41 attribute(s) replaced"},
    "runtime": {"OMP_NUM_THREADS": "2", "GOMP_CPU_AFFINITY": "0 1", "LD_PRELOAD": "/usr/lib/libtcmalloc_minimal.so.4"},
}


def run(name: str, lines: list[str], report: dict | None = None, used=(), code: int = 0) -> output.Run:
    return output.Run(name, [], exit_code=code, seconds=100.0, output=lines, report=report, used=set(used))


def epochs(rate: float, val: list[str], loss: list[float]) -> list[str]:
    return [
        f"epoch {i + 1}/{len(val)}: train loss {value:.4f}, val accuracy {accuracy}, {rate} images/s"
        for i, (accuracy, value) in enumerate(zip(val, loss, strict=True))
    ]


def block(text: str) -> dict[str, list[str]]:
    """The summary's items by their heading (``speed``, ``accelerated``, ...), each wrapped item
    joined back into one line."""
    found: dict[str, list[str]] = {}
    key = None
    for line in text.splitlines()[2:]:
        indent = len(line) - len(line.lstrip())
        if indent == 2:
            key, _, rest = line.strip().partition("  ")
            key = key.rstrip(":")
            found[key] = [rest.strip()] if rest.strip() else []
        elif indent in (6, 12):  # a wrapped item's next line
            found[key][-1] += " " + line.strip()
        else:
            found[key].append(line.strip())
    return found


def test_the_demo_case_reads_at_a_glance(monkeypatch):
    monkeypatch.delenv("TOX_ENV_NAME", raising=False)  # run by tox, the commands name its env's python
    monkeypatch.delenv("TOX_ENV_DIR", raising=False)
    stock = run("stock", epochs(6.7, ["70.00% (56/80)", "80.00% (64/80)"], [0.61, 0.47]))
    used = {"decode-turbojpeg", "transforms"}
    patched = run("nanopatch", epochs(7.7, ["72.50% (58/80)", "78.75% (63/80)"], [0.60, 0.45]), REPORT, used)
    text = _summary.summary(stock, patched, ["examples/train_imagefolder.py", "--epochs", "1"], AVX2)
    assert (
        text.splitlines()[1]
        == "In short: examples/train_imagefolder.py on this CPU (AMD EPYC 7B13, 2 cores, AVX2, no native bf16)"
    )
    parts = block(text)
    assert parts["speed"] == ["1.15x as fast as stock: 7.7 images/s against stock's 6.7 (the script's own meter)"]
    accuracy = " ".join(parts["accuracy"])
    assert accuracy.startswith("the same: validation accuracy 78.75% against stock's 80.00% (1.2 points apart")
    assert "that 80 samples leave" in accuracy
    assert parts["accelerated"] == [
        "- ResNet: computed in fp32, channels-last, SGD's fused step",
        "- images: JPEG decoding by libjpeg-turbo through PyTurboJPEG, torchvision's transforms on OpenCV and numpy",
        "- the CPU runtime: 2 OpenMP threads pinned one per core, tcmalloc",
    ]
    not_accelerated = " ".join(parts["not accelerated"])
    assert "bf16 autocast: this CPU has no native bf16 (avx512_bf16 or amx_bf16)" in not_accelerated
    assert "so training kept fp32" in not_accelerated
    assert "IPEX: intel-extension-for-pytorch is not installed" in not_accelerated
    assert "torch.compile: off by default (--compare --try-compile" in not_accelerated
    assert parts["next"][0] == "python -m nanopatch --verify examples/train_imagefolder.py --epochs 1"
    assert (
        parts["next"][2]
        == "python -m nanopatch --compare --plot breakdown.png examples/train_imagefolder.py --epochs 1"
    )
    assert all(len(line) <= _summary.WIDTH for line in text.splitlines())


def test_bf16_measured_slower_says_so():
    """On a CPU with native bf16 whose bf16 measured slower for the model: it says bf16 was
    measured slower on this CPU and fp32 kept, not that the CPU lacks bf16."""
    measured = dict(
        RESNET, bf16_measured="off: measured slower than fp32 for this model on this CPU (bf16 1.31x fp32's step)"
    )
    options = dict(OPTIONS_NO_BF16, bf16={"value": True, "source": "auto", "reason": "CPU has native bf16 (amx_bf16)"})
    parts = _summary.not_accelerated_parts({"models": [measured], "options": options}, AMX)
    assert parts[0] == (
        "bf16 autocast for ResNet: measured slower than fp32 on this CPU (bf16 1.31x fp32's step), so it kept fp32"
    )
    assert not any(p.startswith("bf16 autocast: this CPU") for p in parts)
    kept = dict(RESNET, computed_in="bfloat16", bf16_measured="kept: measured bf16 0.61x fp32's step")
    assert _summary.accelerated_parts({"models": [kept]})[0].startswith("ResNet: computed in bf16")


def test_what_a_models_own_code_kept_from_bf16_is_said():
    """Weights the script gave their own dtypes keep them (not "fp32"); a custom autograd
    Function whose backward ops run in fp32 is among what was not accelerated."""
    note = (
        "custom autograd Function Clip: its backward mixes the bf16 it was given with fp32 tensors "
        "(RuntimeError: ...) and has no torch.amp.custom_bwd; the ops that fail run in fp32"
    )
    own = dict(
        RESNET,
        bf16_measured="off: the script chose its weights' dtypes (6 in bfloat16 of its 6 floating parameters)",
        notes=["SGD: fused step", note],
    )
    parts = _summary.not_accelerated_parts({"models": [own], "options": OPTIONS_NO_BF16}, AMX)
    assert parts[:2] == [
        "bf16 autocast for ResNet: the script chose its weights' dtypes (6 in bfloat16 of its 6 floating "
        "parameters), so it kept them",
        f"ResNet: {note}",
    ]


def test_channels_last_measured_slower_says_so():
    """Channels-last measured slower than stock's layout for the model: the summary says so and
    that it kept stock's layout; kept, it is among what was accelerated."""
    off = dict(
        RESNET,
        channels_last=False,
        channels_last_measured="off: measured slower than stock's layout for this model on this CPU "
        "(channels-last 5.0 ms, stock's layout 2.4 ms per step (fastest of 2/3 steps))",
    )
    parts = _summary.not_accelerated_parts({"models": [off], "options": OPTIONS_NO_BF16}, AMX)
    assert (
        "channels-last for ResNet: measured slower than stock's layout on this CPU (channels-last 5.0 ms, "
        "stock's layout 2.4 ms per step (fastest of 2/3 steps)), so it kept stock's layout"
    ) in parts
    assert "channels-last" not in _summary.accelerated_parts({"models": [off]})[0]
    kept = dict(RESNET, channels_last_measured="kept: measured channels-last 2.0 ms, stock's layout 2.4 ms per step")
    assert "channels-last" in _summary.accelerated_parts({"models": [kept]})[0]
    assert not any("channels-last for" in p for p in _summary.not_accelerated_parts({"models": [kept]}, AMX))


@pytest.mark.parametrize(
    ("choice", "said"),
    [
        (
            "eager: measured slower: compiled 3300 ms, eager 2900 ms per step (fastest of 3 each), 55 s to compile",
            "torch.compile (compile=auto) for ResNet: measured slower: compiled 3300 ms, eager 2900 ms per step",
        ),
        ("waiting", "torch.compile (compile=auto) for ResNet: not tried; the run ended before"),
        ("measuring", "torch.compile (compile=auto) for ResNet: undecided; the run ended while compiled and eager"),
        ("compiled: measured faster: compiled 70 ms, eager 100 ms per step", None),
    ],
)
def test_compile_auto_says_what_it_chose_and_why(choice, said):
    options = dict(OPTIONS_NO_BF16, compile={"value": "auto", "source": "argument", "reason": "set by patch_torch"})
    model = dict(RESNET, compile_choice=choice, compile="default" if choice.startswith("compiled") else False)
    parts = _summary.not_accelerated_parts({"models": [model], "options": options}, AMX)
    assert not any("off by default" in p for p in parts)
    if said is None:
        assert not any("compile" in p for p in parts)
        assert "torch.compile (default)" in _summary.accelerated_parts({"models": [model]})[0]
    else:
        assert any(p.startswith(said) for p in parts), parts


def test_bf16_turned_off_by_the_user_is_named_as_such():
    options = dict(OPTIONS_NO_BF16, bf16={"value": False, "source": "environment", "reason": "set by NANOPATCH_BF16=0"})
    assert "bf16 autocast: off (set by NANOPATCH_BF16=0)" in _summary.not_accelerated_parts({"options": options}, AMX)


def test_a_model_left_stock_and_an_optimizer_without_a_model_are_named():
    report = {
        "models": [
            dict(RESNET, stock="its parameters are on cuda", training_calls=0),
            {"model": None, "optimizers": ["AdamW"], "stock": "no module holding its parameters was called"},
        ]
    }
    parts = _summary.not_accelerated_parts(report, AVX2)
    assert "ResNet ran stock (its parameters are on cuda)" in parts
    assert "AdamW: no model (no module holding its parameters was called)" in parts
    assert _summary.accelerated_parts(report) == []


def test_patched_images_that_no_image_went_through_are_not_called_accelerated():
    report = dict(REPORT, runtime={})
    assert not any(p.startswith("images") for p in _summary.accelerated_parts(report, set()))
    assert "images: torchvision is patched, but no image went through its loading or transforms" in (
        _summary.not_accelerated_parts(report, AVX2, set())
    )
    assert _summary.accelerated_parts(report, {"decode-opencv"})[1] == "images: JPEG decoding by OpenCV's libjpeg-turbo"
    everything = {"decode-turbojpeg", "decode-region", "transforms", "resize-kernel", "jitter-kernel"}
    assert _summary.accelerated_parts(report, everything)[1] == (
        "images: JPEG decoding by libjpeg-turbo through PyTurboJPEG, only the crop's box of each JPEG decoded,"
        " torchvision's transforms on OpenCV and numpy, bilinear resizes on nanopatch's compiled copies of"
        " Pillow's loops, ColorJitter's saturation and hue in one compiled pass each"
    )


@pytest.mark.parametrize(
    ("stock_rate", "patched_rate", "expected"),
    [
        (10.0, 25.0, "2.50x as fast as stock: 25 images/s against stock's 10"),
        (10.0, 10.2, "about as fast as stock (1.02x): 10.2 images/s against stock's 10"),
        (10.0, 8.0, "slower than stock (0.80x): 8 images/s against stock's 10"),
    ],
)
def test_speed_says_faster_slower_or_the_same_plainly(stock_rate, patched_rate, expected):
    stock = run("stock", [f"x {stock_rate} images/s"])
    patched = run("nanopatch", [f"x {patched_rate} images/s"])
    assert _summary.speed(stock, patched).startswith(expected)


def test_speed_without_a_meter_uses_the_breakdown_then_the_wall_time():
    stock = run("stock", ["done"], {"breakdown": {"samples_per_s": 20.0}})
    patched = run("nanopatch", ["done"], {"breakdown": {"samples_per_s": 50.0}})
    assert _summary.speed(stock, patched) == (
        "2.50x as fast as stock: 50.0 samples/s against stock's 20.0 while training (nanopatch's clock)"
    )
    stock, patched = run("stock", ["done"]), run("nanopatch", ["done"])
    stock.seconds, patched.seconds = 30.0, 20.0
    assert _summary.speed(stock, patched).startswith(
        "1.50x as fast as stock by wall time: 20.0 s against stock's 30.0 s"
    )


def test_speed_of_a_loop_without_a_dataloader_is_its_training_steps():
    """A loop that indexes its tensors itself: no samples counted, but its optimizer steps were
    timed, and that beats the wall time (the same start-up in both runs dilutes the ratio)."""
    timed = {"samples_per_s": None, "steps": 21}
    stock = run("stock", ["done"], {"breakdown": {**timed, "step_s": 0.330}})
    patched = run("nanopatch", ["done"], {"breakdown": {**timed, "step_s": 0.220}})
    stock.seconds, patched.seconds = 12.6, 10.3
    assert _summary.speed(stock, patched) == (
        "1.50x as fast as stock: 220 ms a training step against stock's 330 ms over 20 steps (nanopatch's "
        "clock; no DataLoader gave its batches, so no samples were counted)"
    )
    # a run that stopped early (another number of steps) is no like-for-like comparison: wall time
    patched.report["breakdown"]["steps"] = 15
    assert _summary.speed(stock, patched).startswith("1.22x as fast as stock by wall time")


def test_a_failed_run_gets_no_speed_up_and_no_accuracy_verdict():
    stock = run("stock", ["x 10 images/s, val accuracy 50%"])
    patched = run("nanopatch", ["Traceback ..."], code=1)
    assert _summary.speed(stock, patched) == "the nanopatch run failed (exit code 1): no speed-up is given"
    assert _summary.accuracy(stock, patched) == "not compared: a run failed"


def test_accuracy_beyond_the_sampling_noise_is_called_different():
    stock = run("stock", ["val accuracy 90.00% (900/1000)"])
    patched = run("nanopatch", ["val accuracy 80.00% (800/1000)"])
    verdict = _summary.accuracy(stock, patched)
    assert verdict.startswith("different: validation accuracy 80.00% against stock's 90.00% (10.0 points apart")
    assert "more than the 3.2 points that 1000 samples leave; check learning with --verify" in verdict


def test_accuracy_without_a_count_is_judged_against_the_runs_own_moves():
    stock = run("stock", ["val accuracy 60.0%", "val accuracy 75.0%", "val accuracy 70.0%"])
    patched = run("nanopatch", ["val accuracy 58.0%", "val accuracy 70.0%", "val accuracy 66.0%"])
    verdict = _summary.accuracy(stock, patched)
    assert verdict.startswith(
        "the same: validation accuracy 66.0% against stock's 70.0% (4.0 points apart, within the 15.0"
    )
    assert "the runs' own figures move from one print to the next" in verdict


def test_an_accuracy_printed_once_without_a_count_gets_no_verdict():
    verdict = _summary.accuracy(run("stock", ["acc: 50.0%"]), run("nanopatch", ["acc: 52.0%"]))
    assert verdict == (
        "training accuracy 52.0% against stock's 50.0% (2.0 points apart; printed once, so its noise is unknown: "
        "--verify compares learning step by step)"
    )


def test_without_an_accuracy_the_loss_is_compared():
    stock = run("stock", ["loss 1.00", "loss 0.80", "loss 0.70"])
    patched = run("nanopatch", ["loss 1.00", "loss 0.81", "loss 0.72"])
    assert _summary.accuracy(stock, patched).startswith("the same: training loss 0.72 against stock's 0.70 (0.02 apart")
    assert _summary.accuracy(run("stock", ["done"]), run("nanopatch", ["done"])).startswith("not compared")


def test_the_count_an_accuracy_is_of_is_read():
    found = run("x", ["epoch 3: val accuracy 80.00% (64/80), 7 images/s", "Accuracy: 9912/10000 (99%)"]).readings(
        "accuracy", validation=True
    )
    assert found[0] == output.Reading(80.0, "80.00%", 80)
    assert run("x", ["Test set: Accuracy: 9912/10000 (99%)"]).readings("accuracy", validation=True)[0].total == 10000


def test_in_a_tox_env_the_next_commands_use_its_python(monkeypatch):
    monkeypatch.setenv("TOX_ENV_NAME", "demo")
    assert _summary.runner_command().endswith(" -m nanopatch")
    assert _summary.runner_command() != "python -m nanopatch"
    monkeypatch.delenv("TOX_ENV_NAME")
    monkeypatch.delenv("TOX_ENV_DIR", raising=False)
    assert _summary.runner_command() == "python -m nanopatch"


def _record_in_child(part: str) -> None:
    usage.record(part)


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_usage_marks_reach_the_parent_from_any_process(tmp_path, monkeypatch, method):
    """A DataLoader worker's decode is marked where ``--compare`` reads it, whether the worker
    was forked or spawned; a process without the variable marks nothing anywhere."""
    # (a forked child inherits the marks this process made: none, as in a fresh run's parent)
    monkeypatch.setattr(usage, "_marked", set())
    monkeypatch.setenv(usage.VARIABLE, str(tmp_path))
    child = multiprocessing.get_context(method).Process(target=_record_in_child, args=("transforms",))
    child.start()
    child.join(60)
    assert child.exitcode == 0
    assert usage.used(str(tmp_path)) == {"transforms"}
    monkeypatch.delenv(usage.VARIABLE)
    usage.record("decode-opencv")
    assert usage.used(str(tmp_path)) == {"transforms"}
    assert usage.used(str(tmp_path / "missing")) == set()
    assert not os.environ.get(usage.VARIABLE)


def test_the_allocator_is_named_and_a_missing_tcmalloc_says_how_to_get_it():
    runtime = {"OMP_NUM_THREADS": "2", "GOMP_CPU_AFFINITY": "0 1"}
    report = {"runtime": runtime, "malloc_reuse": "glibc malloc keeps freed memory for reuse (M_MMAP_MAX=0, ...)"}
    assert _summary.accelerated_parts(report) == [
        "the CPU runtime: 2 OpenMP threads pinned one per core, glibc's malloc keeping freed memory for reuse"
    ]
    hint = "tcmalloc: not installed, so the runner preloaded no allocator (apt-get install libtcmalloc-minimal4)"
    assert hint in _summary.not_accelerated_parts(report, AVX2, tcmalloc=False)
    assert hint not in _summary.not_accelerated_parts(report, AVX2, tcmalloc=True)
    preloaded = {"runtime": dict(runtime, LD_PRELOAD="/usr/lib/libtcmalloc_minimal.so.4")}
    assert hint not in _summary.not_accelerated_parts(preloaded, AVX2, tcmalloc=False)
    # patch_torch() in the script itself: no runtime tuning, glibc's malloc told to keep memory
    assert _summary.accelerated_parts({"malloc_reuse": "..."}) == [
        "memory: glibc's malloc keeping freed memory for reuse"
    ]


def test_frozen_weights_cast_once_or_not_are_said():
    kept = dict(
        RESNET,
        frozen_weights="17 frozen weights cast to bf16 once (237.0 MiB of copies; the casts 80.00 ms a forward, "
        "the mode 3.00 ms (600 calls))",
    )
    assert "17 frozen weights cast to bf16 once" in _summary.accelerated_parts({"models": [kept]})[0]
    assert not any("frozen" in part for part in _summary.not_accelerated_parts({"models": [kept]}, AMX))
    off = dict(
        RESNET,
        frozen_weights="cast in every forward, as autocast does: copies made once would not pay (the casts "
        "0.01 ms a forward, the mode 0.20 ms (40 calls))",
    )
    assert "frozen" not in _summary.accelerated_parts({"models": [off]})[0]
    assert (
        "the frozen weights of ResNet: cast in every forward, as autocast does: copies made once would not pay"
        in " ".join(_summary.not_accelerated_parts({"models": [off], "options": OPTIONS_NO_BF16}, AMX))
    )
