"""``python -m nanopatch --compare``: a script run stock, then patched, side by side."""

from __future__ import annotations

import json
import re

import pytest

from nanopatch import compare

from conftest import child_env, run_python

SCRIPT = """
import json, os, sys
patched = "nanopatch" in sys.modules and sys.modules["nanopatch"].is_patched()
info = {"argv": sys.argv[1:], "patched": patched, "hashseed": os.environ.get("PYTHONHASHSEED")}
if patched:
    import nanopatch
    info["bf16"] = nanopatch.status()["options"]["bf16"]["value"]
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


def table_rows(stdout):
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(" ") and "| stock" in line)
    rows = {}
    for line in lines[start + 2 :]:
        if "|" not in line:
            break
        cells = [c.strip() for c in line.split("|")]
        rows[cells[0]] = cells[1:]
    return rows


def test_both_runs_get_the_arguments_and_only_the_second_is_patched_with_the_options(tmp_path):
    proc = run_compare(tmp_path, "--no-bf16")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    seen = infos(proc.stdout)
    assert seen["stock"] == {"argv": ["--epochs", "2", "x y"], "patched": False, "hashseed": "0"}
    assert seen["nanopatch"] == {"argv": ["--epochs", "2", "x y"], "patched": True, "hashseed": "0", "bf16": False}
    rows = table_rows(proc.stdout)
    assert rows["exit code"] == ["0", "0", ""]
    assert rows["wall time"][0].endswith(" s") and rows["wall time"][2].endswith("x")
    assert rows["images/s"] == ["10.0", "20.0", "2.00x"]  # the last one printed
    assert rows["final loss"] == ["0.2500", "0.2500", ""]  # the final line comes after stderr's
    assert rows["final accuracy"] == ["62.50%", "62.50%", ""]
    assert rows["model accelerated"][1].startswith("no (the run reported nothing")  # it never imported torch
    assert "[stock] step 9 loss=0.75 acc: 0.5" in proc.stdout  # stderr shown too, with its run's name


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
        ("Test set: Average loss: 0.0004, Accuracy: 809/1000 (81%)", "accuracy", "809/1000 (80.9%)"),
        ("Test set: Average loss: 0.0004, Accuracy: 809/1000 (81%)", "loss", "0.0004"),
        ("throughput 412.5 img/s", "rate", "412.5"),
        ("1.2e3 samples/sec", "rate", "1.2e3"),
        ("val_loss 2.5", "loss", None),  # part of another word: not "loss"
    ],
)
def test_metrics_are_read_by_their_labels(line, key, value):
    run = compare.Run("x", [], output=[line])
    found = run.metric(key)
    assert (found[1] if found else None) == value


def test_the_stock_environment_has_nothing_of_nanopatch():
    from nanopatch._bootstrap import BOOTSTRAP_DIR

    env = compare.stock_environ({"NANOPATCH_BF16": "0", "PYTHONPATH": f"{BOOTSTRAP_DIR}:/x", "HOME": "/h"})
    assert env == {"PYTHONPATH": "/x", "HOME": "/h", "PYTHONHASHSEED": "0"}


TRAIN = """
import sys
import torch
import torch.nn.functional as F
from torch import nn

model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 2))
weight = nn.Parameter(torch.zeros(2))
optimizer = torch.optim.SGD(model.parameters() if "--bare" not in sys.argv else [weight], lr=0.1)
for _ in range(14 if "--long" in sys.argv else 2):
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
    """With bf16 left to nanopatch, the model's first steps measure it against fp32; the table
    and the end-of-run line say what was decided, with both medians."""
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    proc = run_python(
        ["-m", "nanopatch", "--compare", "--no-ipex", str(script), "--long"], cwd=tmp_path, env=child_env()
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cell = table_rows(proc.stdout)["model accelerated"][1]
    assert cell.startswith("yes (Sequential: ") and re.search(r"bf16 (kept|off): measured .*bf16 [\d.]+ ms, fp32", cell)
    proc = run_python(["-m", "nanopatch", "-v", "--no-ipex", str(script), "--long"], cwd=tmp_path, env=child_env())
    assert proc.returncode == 0, proc.stderr
    (line,) = [line for line in proc.stderr.splitlines() if "trained:" in line]
    assert re.search(r"bf16 (kept: measured|off: measured slower than fp32)", line), line


def test_the_runner_says_what_it_trained_at_the_end_with_v(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    proc = run_python(["-m", "nanopatch", "-v", "--no-ipex", "--bf16", str(script)], cwd=tmp_path, env=child_env())
    assert proc.returncode == 0, proc.stderr
    (line,) = [line for line in proc.stderr.splitlines() if "trained:" in line]
    assert "Sequential: computed in bfloat16, nanopatch autocast, channels-last" in line
    assert "(2 training calls)" in line
