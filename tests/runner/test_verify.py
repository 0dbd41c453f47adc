"""``python -m nanopatch --verify [N] script.py``: the user's own script run stock and patched for N
optimizer steps from one seed, compared step by step with nanopatch.learning's definition of
"learns as stock", on a plain loop, a Lightning script, a Hugging Face Trainer script and the demo,
and caught out on a deliberately broken fast path."""

from __future__ import annotations

import re

import pytest
import torch

from nanopatch.runner import verify
from nanopatch.runner.cli import build_parser, split_argv

from conftest import REPO_ROOT, TESTS_DIR, child_env, run_python
from helpers.learning_oracle import framework

pytestmark = pytest.mark.py_only  # whole scripts under the runner: tox's py env runs them (tox.ini)

DATA = TESTS_DIR / "data"
LOOP = str(DATA / "verify_loop.py")


def run_verify(*args: str, cwd=None, **env: str):
    """``python -m nanopatch ARGS`` with the stdout and stderr of a failure in the message."""
    proc = run_python(["-m", "nanopatch", *args], env=child_env(env), cwd=cwd, timeout=600)
    proc.output = f"exit {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
    return proc


def step_rows(stdout: str) -> list[list[str]]:
    """The table's step lines, split into cells (the drift's parameter name stays one cell)."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("step  optimizer"))
    return [line.split(None, 5) for line in lines[start + 1 :] if re.match(r"\s*\d+\s", line)]


def echoed(stdout: str, run: str, prefix: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith(f"[{run}] {prefix}")]


def verdict(stdout: str) -> str:
    return next(line for line in stdout.splitlines() if line.startswith("verdict: "))


# --- a plain loop ------------------------------------------------------------------------------


@pytest.mark.parametrize("workers", [0, 2], ids=["main-process-loading", "two-workers"])
def test_a_plain_loop_learns_as_stock_from_the_same_data_in_the_same_order(workers):
    # The script shuffles, adds fresh noise to each item, and (patched only) draws from the global
    # RNG after each forward as fast dropout does: the second epoch's order and noise, and the
    # workers' seeds, must still be the same in both runs.
    proc = run_verify("--verify", "6", "--bf16", LOOP, "--workers", str(workers))
    assert proc.returncode == verify.LEARNS, proc.output
    assert verdict(proc.stdout).startswith("verdict: learns as stock (6 steps"), proc.output
    rows = step_rows(proc.stdout)
    assert [r[0] for r in rows] == [str(i) for i in range(1, 7)] and {r[1] for r in rows} == {"AdamW"}
    assert all(float(r[2]) > 0 and float(r[3]) > 0 for r in rows), proc.output
    stock, patched = echoed(proc.stdout, "stock", "batch"), echoed(proc.stdout, "nanopatch", "batch")
    assert len(stock) == 6 and any(line.split(":")[0].endswith(" 1.5") for line in stock), proc.output
    assert [line.split("] ", 1)[1] for line in stock] == [line.split("] ", 1)[1] for line in patched]
    assert echoed(proc.stdout, "stock", "patched:") == ["[stock] patched: False"]
    assert echoed(proc.stdout, "nanopatch", "patched:") == ["[nanopatch] patched: True"]
    assert "accelerated: yes (Sequential: computed in bfloat16" in proc.stdout


def test_verify_catches_a_fast_path_that_cuts_the_gradient_path(tmp_path):
    # A sitecustomize detaches the first block's output while autocast is on: the loss stays near
    # stock's, but the block's parameters get no gradient in the patched run.
    (tmp_path / "sitecustomize.py").write_text("import data.verify_cut\n")
    env = child_env()
    proc = run_verify("--verify", "6", "--bf16", LOOP, PYTHONPATH=f"{tmp_path}:{env['PYTHONPATH']}")
    assert proc.returncode == verify.DOES_NOT_LEARN, proc.output
    lines = proc.stdout.splitlines()
    first = lines.index(next(line for line in lines if re.match(r"\s+1\s+AdamW", line)))
    assert lines[first + 1].strip() == "gradient in stock only (2): 0.linear.bias, 0.linear.weight", proc.output
    assert "gradient in stock only: the same 2 as at step 1" in lines[first + 3]
    assert verdict(proc.stdout).startswith(
        "verdict: does not learn as stock: at step 1, 2 of 6 parameters that got a gradient in stock got none patched "
        "(0.linear.bias, 0.linear.weight)"
    )
    assert len(step_rows(proc.stdout)) == 6


def test_a_run_that_fails_gives_its_own_exit_status_and_keeps_its_steps():
    proc = run_verify("--verify", "6", "--bf16", LOOP, "--crash-patched-at", "3")
    assert proc.returncode == verify.RUN_FAILED, proc.output
    assert "RuntimeError: a patched run that breaks" in proc.stdout
    assert "the nanopatch run failed (exit code 1) after 2 of 6 optimizer steps" in proc.stdout
    assert [r[0] for r in step_rows(proc.stdout)] == ["1", "2"], proc.output
    assert "the patched run took 2 optimizer steps, stock 6" in verdict(proc.stdout)


def test_a_module_that_ends_before_n_steps_is_compared_over_the_steps_it_took():
    proc = run_verify("--verify", "--bf16", "-m", "data.verify_loop", "--epochs", "1")
    assert proc.returncode == verify.LEARNS, proc.output
    assert "== nanopatch: python -m nanopatch --bf16 -m data.verify_loop --epochs 1 " in proc.stdout
    assert len(step_rows(proc.stdout)) == 4
    assert f"the script ended after 4 optimizer steps (of {verify.DEFAULT_STEPS} asked for)" in proc.stdout
    assert "stopping the run" not in proc.stdout


# --- frameworks and the demo --------------------------------------------------------------------


def test_a_lightning_script_with_automatic_optimization():
    framework("lightning.pytorch")
    proc = run_verify("--verify", "6", "--bf16", str(DATA / "verify_lightning.py"))
    assert proc.returncode == verify.LEARNS, proc.output
    assert len(step_rows(proc.stdout)) == 6
    assert verdict(proc.stdout).startswith("verdict: learns as stock (6 steps"), proc.output
    assert re.search(r"accelerated: yes \(\w+: computed in bfloat16, channels-last", proc.stdout), proc.output


def test_a_hugging_face_trainer_script(tmp_path):
    framework("transformers")
    framework("accelerate")
    proc = run_verify("--verify", "5", "--bf16", str(DATA / "verify_hf_trainer.py"), str(tmp_path / "out"))
    assert proc.returncode == verify.LEARNS, proc.output
    assert len(step_rows(proc.stdout)) == 5
    assert verdict(proc.stdout).startswith("verdict: learns as stock (5 steps"), proc.output
    assert "accelerated: yes (BertForSequenceClassification: computed in bfloat16" in proc.stdout
    # the parameter samples are taken by name: BERT's are larger than a sample
    assert "estimated from 1024 elements of each larger parameter" in proc.stdout


def test_the_demo_script(tmp_path):
    # At its own image size (at 64 px with batches of 4, a few steps from scratch swing by 10% between
    # fp32 and bf16 by hand as well), on a small set.
    tiny = ["--num-images", "24", "--batch-size", "8", "--workers", "0"]
    script = str(REPO_ROOT / "examples" / "train_imagefolder.py")
    proc = run_verify("--verify", "3", script, *tiny, "--cache-dir", str(tmp_path), cwd=tmp_path)
    assert proc.returncode == verify.LEARNS, proc.output
    assert len(step_rows(proc.stdout)) == 3 and {r[1] for r in step_rows(proc.stdout)} == {"SGD"}
    assert verdict(proc.stdout).startswith("verdict: learns as stock (3 steps"), proc.output


# --- the command line and the drift -------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "own", "steps"),
    [
        (["--verify", "s.py", "7"], ["--verify"], verify.DEFAULT_STEPS),
        (["--verify", "7", "s.py", "7"], ["--verify", "7"], 7),
        (["--verify=7", "--no-bf16", "s.py", "7"], ["--verify=7", "--no-bf16"], 7),
        (["--no-bf16", "--verify", "--bf16", "s.py", "7"], ["--no-bf16", "--verify", "--bf16"], verify.DEFAULT_STEPS),
    ],
)
def test_the_option_takes_an_optional_number_before_the_script(argv, own, steps):
    parser = build_parser()
    split = split_argv(parser, argv)
    assert split == (own, "script", "s.py", ["7"])
    assert parser.parse_args(own).verify == steps
    assert "--verify" not in " ".join(verify.runner_options(own)) and "7" not in verify.runner_options(own)


@pytest.mark.parametrize("args", [["--verify", "--compare"], ["--verify", "--nproc", "2"], ["--verify=0"]])
def test_options_that_do_not_go_with_it_are_usage_errors(args):
    proc = run_verify(*args, LOOP)
    assert proc.returncode == 2, proc.output
    assert "error" in proc.stderr


def test_drift_is_relative_to_the_parameter_or_near_zero_to_the_model_scale():
    ones = torch.ones(100)
    stock = {"shapes": {"w": [100], "b": [4]}, "values": {"w": ones, "b": torch.zeros(4)}}
    moved = {"shapes": {"w": [100], "b": [4]}, "values": {"w": ones * 1.02, "b": torch.full((4,), 1e-6)}}
    assert verify.drift(stock, moved) == (pytest.approx(0.02), "w")
    # a bias stock left at zero that moved by 0.05 (model RMS ~0.98): measured against 10% of it
    moved["values"]["b"] = torch.full((4,), 0.05)
    relative, name = verify.drift(stock, moved)
    rms = (100 / 104) ** 0.5
    assert name == "b" and relative == pytest.approx(0.1 / (verify.DRIFT_FLOOR * rms * 2))
    # a parameter whose shape differs between the runs is left out
    moved["shapes"]["b"] = [2, 2]
    assert verify.drift(stock, moved)[1] == "w"
