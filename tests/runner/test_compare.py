"""``python -m nanopatch --compare``: a script run stock, then patched, side by side."""

from __future__ import annotations

import json
import re

import pytest

from nanopatch.foundation import cpu
from nanopatch.runner import output, report, runs

from conftest import child_env, run_python
from helpers.compare_output import table_rows

pytestmark = pytest.mark.py_only  # whole scripts under the runner: tox's py env runs them (tox.ini)

SCRIPT = """
import json, os, sys
np = sys.modules.get("nanopatch")
options = np.status()["options"] if np and np.is_patched() else {}
patched = bool(options) and options["training"]["value"]  # accelerated, not only timed
info = {"argv": sys.argv[1:], "patched": patched, "hashseed": os.environ.get("PYTHONHASHSEED")}
info["timed"] = bool(options) and options["breakdown"]["value"]
if patched:
    info["bf16"] = options["bf16"]["value"]
print("INFO " + json.dumps(info), flush=True)
print("epoch 1/2: train loss 1.5000, val accuracy 40.00%, 10.0 images/s")
print("step 9 loss=0.75 acc: 0.5", file=sys.stderr)
rate = 20.0 if patched else 10.0
print(f"final: train loss 0.2500, val accuracy 62.50%, {rate} images/s")
fail = os.environ.get("FAIL_WHEN")
if fail == ("patched" if patched else "stock"):
    sys.exit(4)
"""


def run_compare(tmp_path, *args, **env):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    return run_python(
        ["-m", "nanopatch", "--compare", *args, str(script), "--epochs", "2", "x y"], cwd=tmp_path, env=child_env(env)
    )


def infos(stdout):
    found = {}
    for line in stdout.splitlines():
        name, _, rest = line.partition("] INFO ")
        if rest:
            found[name.lstrip("[")] = json.loads(rest)
    return found


def test_both_runs_get_the_arguments_and_only_the_second_is_patched_with_the_options(tmp_path):
    proc = run_compare(tmp_path, "--no-bf16")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    seen = infos(proc.stdout)
    # both runs timed (the breakdown), only the second accelerated
    assert seen["stock"] == {"argv": ["--epochs", "2", "x y"], "patched": False, "hashseed": "0", "timed": True}
    assert seen["nanopatch"] == {
        "argv": ["--epochs", "2", "x y"],
        "patched": True,
        "hashseed": "0",
        "timed": True,
        "bf16": False,
    }
    rows = table_rows(proc.stdout)
    assert rows["exit code"] == ["0", "0", ""]
    assert rows["wall time"][0].endswith(" s") and rows["wall time"][2].endswith("x")
    assert rows["images/s"] == ["10.0", "20.0", "2.00x"]  # the last one printed
    assert rows["final loss"] == ["0.2500", "0.2500", ""]  # the final line comes after stderr's
    assert rows["final accuracy"] == ["0.5", "0.5", ""]  # the training accuracy
    assert rows["validation accuracy"] == ["62.50%", "62.50%", ""]
    assert "validation loss" not in rows  # neither run printed one
    assert rows["model accelerated"][1].startswith("no (the run reported nothing")  # it never imported torch
    assert "[stock] step 9 loss=0.75 acc: 0.5" in proc.stdout  # stderr shown too, with its run's name


def test_with_no_breakdown_the_stock_run_is_plain_python(tmp_path):
    proc = run_compare(tmp_path, "--no-breakdown")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    seen = infos(proc.stdout)
    assert seen["stock"] == {"argv": ["--epochs", "2", "x y"], "patched": False, "hashseed": "0", "timed": False}
    assert seen["nanopatch"]["patched"] and not seen["nanopatch"]["timed"]
    assert "== stock: " + str(tmp_path / "train.py") in proc.stdout
    assert "Where the time went" not in proc.stdout


@pytest.mark.parametrize("which", ["stock", "patched"])
def test_a_failing_run_gives_its_exit_code_and_no_speedup(tmp_path, which):
    proc = run_compare(tmp_path, FAIL_WHEN=which)
    assert proc.returncode == 4
    rows = table_rows(proc.stdout)
    assert rows["exit code"] == (["4", "0", ""] if which == "stock" else ["0", "4", ""])
    assert all(row[2] == "" for row in rows.values())
    name = "stock" if which == "stock" else "nanopatch"
    assert f"{name} run failed with exit code 4" in proc.stdout


def test_a_missing_script_is_a_usage_error(tmp_path):
    proc = run_python(["-m", "nanopatch", "--compare", "nope.py"], cwd=tmp_path)
    assert proc.returncode == 2 and "can't open file" in proc.stderr


@pytest.mark.parametrize(
    ("line", "key", "value"),
    [
        ("Epoch 3 | loss: 0.123 | acc@1: 71.2%", "loss", "0.123"),
        ("Epoch 3 | loss: 0.123 | acc@1: 71.2%", "accuracy", "71.2%"),
        ("accuracy=0.875", "accuracy", "0.875"),
        ("throughput 412.5 img/s", "rate", "412.5"),
        ("1.2e3 samples/sec", "rate", "1.2e3"),
        ("val_loss 2.5", "loss", None),  # an evaluation's: not the training loss
        ("train_loss=0.693", "loss", "0.693"),  # Lightning's progress bar
        ("closs 2.5", "loss", None),  # part of another word
    ],
)
def test_metrics_are_read_by_their_labels(line, key, value):
    run = output.Run("x", [], output=[line])
    found = run.metric(key)
    assert (found[1] if found else None) == value


@pytest.mark.parametrize(
    ("line", "key", "value"),
    [
        # pytorch/examples' mnist
        ("Test set: Average loss: 0.0004, Accuracy: 809/1000 (81%)", "accuracy", "809/1000 (80.9%)"),
        ("Test set: Average loss: 0.0004, Accuracy: 809/1000 (81%)", "loss", "0.0004"),
        ("val_loss 2.5", "loss", "2.5"),
        ("{'eval_loss': 2.61, 'eval_runtime': 0.5, 'epoch': 1.0}", "loss", "2.61"),
        ("epoch 2: train loss 1.2000, val loss 1.4000, val accuracy 55.0%", "loss", "1.4000"),
        ("epoch 2: train loss 1.2000, val loss 1.4000, val accuracy 55.0%", "accuracy", "55.0%"),
    ],
)
def test_an_evaluations_figures_are_read_apart(line, key, value):
    run = output.Run("x", [], output=[line])
    assert run.metric(key, validation=True)[1] == value
    assert run.metric(key) in (None, (1.2, "1.2000"))  # never the training figure


def test_torchvisions_reference_final_loss_is_trainings_not_the_validation_pass():
    run = output.Run("x", [], output=TORCHVISION_REFERENCE)
    assert run.metric("loss") == (6.8122, "6.8122")  # its validation pass prints after training
    assert run.metric("accuracy") == (3.125, "3.1250")  # acc1's
    # the validation pass prints its first batch's loss, never the set's: no validation loss
    assert run.metric("loss", validation=True) is None
    assert run.metric("accuracy", validation=True) == (12.5, "12.500")  # the set's Acc@1
    last = [*TORCHVISION_REFERENCE, "Test:   [7/8]  eta: 0:00:00  loss: 3.1000 (3.2000)  acc1: 10.0 (12.5)"]
    assert output.Run("x", [], output=last).metric("loss", validation=True) == (3.1, "3.1000")


def test_a_meter_printed_at_every_few_steps_gives_the_median_after_the_first():
    """torchvision's reference prints img/s of the latest batch: the last can be a small one."""
    lines = [f"Epoch: [0]  [{i}/7]  lr: 0.1  img/s: {v}  loss: 1.0 (1.0)" for i, v in enumerate((2.25, 8.9, 9.3, 0.70))]
    assert output.Run("x", [], output=lines).rate() == (8.9, "8.9 (median of 3)", "labelled")
    even = output.Run("x", [], output=[*lines, "[8/9] img/s: 9.1"]).rate()
    assert even[0] == pytest.approx(9.0) and even[1] == "9 (median of 4)"
    long = [f"img/s: {v}" for v in (21.663590477284966, 32.14056839624901, 32.79512643759047, 16.277970640457177)]
    assert output.Run("x", [], output=long).rate()[:2] == (32.14056839624901, "32.14 (median of 3)")


# what common training code prints, as it prints it
TORCHVISION_REFERENCE = [
    "Epoch: [0]  [ 0/32]  eta: 0:00:31  lr: 0.05  img/s: 74.1  loss: 6.9151 (6.9151)  acc1: 0.0000 (0.0000)",
    "Epoch: [0]  [30/32]  eta: 0:00:01  lr: 0.05  img/s: 135.2  loss: 6.8122 (6.8745)  acc1: 3.1250 (0.4032)",
    "Test:   [0/8]  eta: 0:00:03  loss: 3.4619 (3.4619)  acc1: 12.5000 (12.5000)  time: 0.40",
    "Test:  Acc@1 12.500 Acc@5 50.000",
]
TIMM = [
    "Train: 0 [   0/20 (  0%)]  Loss: 6.930 (6.93)  Time: 2.080s,   15.38/s  (2.080s,   15.38/s)  LR: 1.000e-05",
    "Train: 0 [  19/20 (100%)]  Loss: 6.812 (6.87)  Time: 0.610s,   52.46/s  (0.700s,   45.71/s)  LR: 1.000e-05",
]
HF = [
    "{'loss': 2.4912, 'grad_norm': 3.1, 'learning_rate': 4e-05, 'epoch': 0.5}",
    " 50%|█████     | 4/8 [00:02<00:02,  1.98it/s]",
    "{'train_runtime': 4.21, 'train_samples_per_second': 30.41, 'train_steps_per_second': 1.9, 'train_loss': 2.45}",
    "100%|██████████| 2/2 [00:00<00:00, 40.10it/s]",  # an evaluation afterwards
]
# transformers >= 5 prints the Trainer's logged values as strings (5.24, as printed)
HF5 = [
    "{'loss': '4.312', 'grad_norm': '1.247', 'learning_rate': '5e-05', 'epoch': '0.25'}",
    "{'loss': '4.329', 'grad_norm': '1.215', 'learning_rate': '3.75e-05', 'epoch': '0.5'}",
    "{'eval_loss': '4.316', 'eval_runtime': '0.1552', 'eval_samples_per_second': '103.1',"
    " 'eval_steps_per_second': '12.88', 'epoch': '0.5'}",
    "{'train_runtime': '1.259', 'train_samples_per_second': '12.71', 'train_steps_per_second': '3.177', 'train_loss':"
    " '4.32', 'epoch': '1'}",
]
LIGHTNING = [
    "Epoch 0:  50%|█████     | 16/32 [00:04<00:04,  3.91it/s, v_num=0]\rEpoch 0: 100%|██████████| 32/32 [00:07<00:00,"
    "  4.37it/s, v_num=0]",
    "Validation DataLoader 0: 100%|██████████| 8/8 [00:00<00:00, 21.30it/s]",
]


@pytest.mark.parametrize(
    ("printed", "shown", "kind"),
    [
        (TORCHVISION_REFERENCE, "135.2", "labelled"),  # not lr's 0.05, printed just before the label
        (TIMM, "45.71/s", "per second"),
        (HF, "30.41", "labelled"),  # the Trainer's own figure, over its progress bars
        (HF5, "12.71", "labelled"),  # not the evaluation's samples/s
        (LIGHTNING, "4.37 it/s", "batches"),  # the training bar's last redraw, not validation's
        (["Epoch 1/3 2.10s/it"], "2.10 s/it", "batches"),
        (["throughput 412.5 img/s", "lr: 0.05  epoch 2"], "412.5", "labelled"),
        (["step 10 loss 0.3", "done in 4.2 s"], None, None),  # nothing to read: not found
    ],
    ids=[
        "torchvision-reference",
        "timm",
        "hf-trainer",
        "hf-trainer-5",
        "lightning-bar",
        "seconds-per-batch",
        "unit-after",
        "none",
    ],
)
def test_the_speed_is_read_from_common_meters(printed, shown, kind):
    found = output.Run("x", [], output=printed).rate()
    assert (found[1:] if found else (None, None)) == (shown, kind)
    if shown == "2.10 s/it":
        assert found[0] == pytest.approx(1 / 2.10)


@pytest.mark.parametrize(
    ("printed", "unit"),
    [
        (TORCHVISION_REFERENCE, "images/s"),
        (HF, "samples/s"),
        (HF5, "samples/s"),
        (["1.2e3 examples/sec"], "samples/s"),
        (LIGHTNING, "batches/s"),
        (TIMM, "/s"),
        ([], "images/s"),
    ],
)
def test_the_meter_s_unit_is_what_its_label_counts(printed, unit):
    assert output.Run("x", [], output=printed).rate_unit() == unit


def test_a_samples_meter_is_called_samples_in_the_table_and_the_summary():
    from nanopatch.runner import _summary

    stock = output.Run("stock", [], exit_code=0, output=HF5)
    faster = [line.replace("'12.71'", "'25.42'") for line in HF5]
    patched = output.Run("nanopatch", [], exit_code=0, output=faster)
    rows = table_rows(report.table(stock, patched))
    assert rows["samples/s"] == ["12.71", "25.42", "2.00x"] and "images/s" not in rows
    assert _summary.speed(stock, patched).endswith("25.4 samples/s against stock's 12.7 (the script's own meter)")


def test_speeds_of_different_kinds_get_no_ratio_and_a_missing_one_says_so():
    stock = output.Run("stock", [], exit_code=0, output=["12.0 img/s"])
    patched = output.Run("nanopatch", [], exit_code=0, output=["3.5it/s"])
    rows = table_rows(report.table(stock, patched))
    assert rows["images/s"] == ["12.0", "3.5 it/s", ""]
    rows = table_rows(report.table(stock, output.Run("nanopatch", [], exit_code=0, output=["24.0 img/s"])))
    assert rows["images/s"] == ["12.0", "24.0", "2.00x"]
    rows = table_rows(report.table(stock, output.Run("nanopatch", [], exit_code=0, output=[])))
    assert rows["images/s"] == ["12.0", "not found", ""]


def test_hugging_face_s_logged_loss_is_read():
    assert output.Run("x", [], output=HF).metric("loss") == (2.4912, "2.4912")  # not train_loss's
    run = output.Run("x", [], output=HF5)  # transformers >= 5: the values quoted
    assert run.metric("loss") == (4.329, "4.329")
    assert run.metric("loss", validation=True) == (4.316, "4.316")
    assert [reading.value for reading in run.readings("loss")] == [4.312, 4.329]


def test_the_stock_environment_has_nothing_of_nanopatch():
    from nanopatch.runner._bootstrap import BOOTSTRAP_DIR

    env = runs.stock_environ({"NANOPATCH_BF16": "0", "PYTHONPATH": f"{BOOTSTRAP_DIR}:/x", "HOME": "/h"})
    assert env == {"PYTHONPATH": "/x", "HOME": "/h", "PYTHONHASHSEED": "0"}


TRAIN = """
import sys
import torch
import torch.nn.functional as F
from torch import nn

model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 2))
weight = nn.Parameter(torch.zeros(2))
optimizer = torch.optim.SGD(model.parameters() if "--bare" not in sys.argv else [weight], lr=0.1)
for _ in range(40 if "--long" in sys.argv else 2):  # --long: the trial's most steps, 3 + 3 + 4 * 8
    optimizer.zero_grad()
    x = torch.randn(4, 3, 8, 8)
    out = model(x) if "--bare" not in sys.argv else x.mean((1, 2, 3))[:, None] * weight
    F.cross_entropy(out, torch.tensor([0, 1, 0, 1])).backward()
    optimizer.step()
print("done")
"""


@pytest.mark.parametrize(
    ("runner", "script_args", "expected"),
    [
        (["--bf16", "--channels-last"], [], "yes (Sequential: computed in bfloat16, channels-last)"),
        (["--no-training"], [], "no (the run reported nothing"),
        (["--bf16"], ["--bare"], "no (SGD: no module holding its parameters was called"),
    ],
)
def test_the_table_says_whether_a_model_was_accelerated_and_why_not(tmp_path, runner, script_args, expected):
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    proc = run_python(
        ["-m", "nanopatch", "--compare", "--no-ipex", *runner, str(script), *script_args],
        cwd=tmp_path,
        env=child_env(),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert table_rows(proc.stdout)["model accelerated"][1].startswith(expected), proc.stdout


def test_the_table_and_v_say_what_measuring_bf16_decided(tmp_path):
    """With bf16 and channels-last left to nanopatch, the model's first steps measure them
    against fp32 and stock's layout; the table and the end-of-run line say what was decided,
    with the timings."""
    from nanopatch.targets.training.plan import Trial

    assert Trial.warmup + 1 + 3 + 4 * Trial.max_rounds <= 40  # TRAIN's --long steps: always decided
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    proc = run_python(
        ["-m", "nanopatch", "--compare", "--no-ipex", str(script), "--long"], cwd=tmp_path, env=child_env()
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cell = table_rows(proc.stdout)["model accelerated"][1]
    proc = run_python(["-m", "nanopatch", "-v", "--no-ipex", str(script), "--long"], cwd=tmp_path, env=child_env())
    assert proc.returncode == 0, proc.stderr
    (line,) = [line for line in proc.stderr.splitlines() if "trained:" in line]
    layout = r"channels-last (kept: measured|off: measured slower than|off: not measured clearly faster than)"
    if cpu.host_facts().avx2:  # channels-last is nanopatch's choice there: measured
        assert re.search(layout + r" .*channels-last [\d.]+ ms, stock's layout [\d.]+ ms", cell), cell
        assert re.search(layout, line), line
    if not cpu.host_facts().native_bf16:  # bf16 is off without a measurement: its products are emulated
        assert cell.startswith("yes (Sequential: computed in float32") and "bf16" not in cell, cell
        assert "computed in float32" in line and "bf16 kept" not in line and "bf16 off" not in line, line
        return
    # decided within the run (kept, off as slower, or off as not clearing the steps' noise where
    # other work shares the cores), with both timings
    decided = r"bf16 (kept: measured|off: measured slower than fp32|off: not measured clearly faster than fp32)"
    assert cell.startswith("yes (Sequential: ") and re.search(decided + r" .*bf16 [\d.]+ ms, fp32", cell), cell
    assert re.search(decided, line), line


def test_the_runner_says_what_it_trained_at_the_end_with_v(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    proc = run_python(["-m", "nanopatch", "-v", "--no-ipex", "--bf16", str(script)], cwd=tmp_path, env=child_env())
    assert proc.returncode == 0, proc.stderr
    (line,) = [line for line in proc.stderr.splitlines() if "trained:" in line]
    assert "Sequential: computed in bfloat16, nanopatch autocast, channels-last" in line
    assert "(2 training calls)" in line
