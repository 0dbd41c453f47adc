"""examples/train_imagefolder.py: the plain torchvision training script the demo runs.

The script runs as a subprocess with tiny settings (24 images of the generated demo set,
64 px, one epoch), stock and under ``python -m nanopatch``; the dataset generation's
reuse, race and interruption handling are checked in-process on a few images.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
from pathlib import Path

import pytest
from PIL import Image

from conftest import REPO_ROOT, child_env, run_python

pytestmark = pytest.mark.py_only  # whole scripts under the runner: tox's py env runs them (tox.ini)

SCRIPT = REPO_ROOT / "examples" / "train_imagefolder.py"
CLASSES = ["city_night", "coast", "forest", "mountains", "still_life"]
TINY = ["--num-images", "24", "--image-size", "64", "--epochs", "1", "--batch-size", "8", "--workers", "0"]

NUMBER = r"\d+(?:\.\d+)?"
EPOCH = re.compile(
    rf"^epoch 1/1: train loss (?P<train_loss>{NUMBER}), train accuracy {NUMBER}%, "
    rf"val loss {NUMBER}, val accuracy {NUMBER}% \(\d+/\d+\), {NUMBER} images/s$",
    re.M,
)
FINAL = re.compile(
    rf"^final: train loss (?P<train_loss>{NUMBER}), val accuracy (?P<val_accuracy>{NUMBER})% "
    rf"\((?P<val_correct>\d+)/(?P<val_seen>\d+)\), "
    rf"(?P<images_per_second>{NUMBER}) images/s, (?P<seconds>{NUMBER}) s$"
)
DATA = re.compile(r"^data: (?P<path>.+) \((?P<how>generated|reused|given)\b", re.M)


def run_script(*args: str, nanopatch: bool = False):
    prefix = ["-m", "nanopatch"] if nanopatch else []
    proc = run_python([*prefix, str(SCRIPT), *args], env=child_env(), cwd=REPO_ROOT, timeout=300)
    assert proc.returncode == 0, f"exit {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
    return proc


def summary(proc) -> dict[str, float]:
    """The final line: last on stdout, exactly once, and it parses."""
    lines = proc.stdout.strip().splitlines()
    assert sum(line.startswith("final:") for line in lines) == 1, proc.stdout
    match = FINAL.match(lines[-1])
    assert match, f"no summary line at the end of\n{proc.stdout}"
    values = {name: float(value) for name, value in match.groupdict().items()}
    assert values["images_per_second"] > 0 and values["seconds"] > 0
    assert 0 <= values["val_accuracy"] <= 100
    assert values["val_accuracy"] == round(100 * values["val_correct"] / values["val_seen"], 2)
    return values


def data_line(proc) -> tuple[Path, str]:
    match = DATA.search(proc.stdout)
    assert match, proc.stdout
    return Path(match["path"]), match["how"]


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_ino, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))}


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    """One stock run on an empty cache folder: it generates the demo set."""
    cache = tmp_path_factory.mktemp("cache")
    proc = run_script(*TINY, "--cache-dir", str(cache))
    return cache, proc


def test_first_run_generates_the_demo_set(first_run):
    cache, proc = first_run
    root, how = data_line(proc)
    assert how == "generated"
    assert root.parent == cache and (root / "COMPLETE.json").is_file()
    assert [p.name for p in cache.iterdir()] == [root.name], "a temporary folder was left behind"
    files = {}
    for split in ("train", "val"):
        assert sorted(p.name for p in (root / split).iterdir()) == CLASSES
        files[split] = sorted((root / split).glob("*/*"))
        assert all(f.suffix == ".jpg" for f in files[split])
        assert all(any((root / split / name).iterdir()) for name in CLASSES), "a class without images"
    assert len(files["train"]) + len(files["val"]) == 24
    assert len(files["val"]) == 5  # about a fifth, at least one per class
    sizes = set()
    for path in files["train"] + files["val"]:
        with Image.open(path) as image:
            assert image.format == "JPEG" and image.mode == "RGB"
            sizes.add(image.size)
            assert 300 <= min(image.size) and max(image.size) <= 640, image.size
    assert len(sizes) > 10, f"sizes should vary: {sizes}"
    assert len({w > h for w, h in sizes}) == 2, "both landscape and portrait images expected"


def test_first_run_prints_an_epoch_line_and_the_summary(first_run):
    _, proc = first_run
    assert EPOCH.search(proc.stdout), proc.stdout
    summary(proc)


def test_second_run_reuses_the_demo_set_untouched(first_run):
    cache, first = first_run
    root, _ = data_line(first)
    before = snapshot(root)
    proc = run_script(*TINY, "--cache-dir", str(cache))
    assert data_line(proc) == (root, "reused")
    assert snapshot(root) == before
    assert [p.name for p in cache.iterdir()] == [root.name]
    # Same seed, same data, same crops: the same training loss.
    assert EPOCH.search(proc.stdout)["train_loss"] == EPOCH.search(first.stdout)["train_loss"]
    summary(proc)


def test_runs_under_nanopatch(first_run):
    cache, first = first_run
    root, _ = data_line(first)
    before = snapshot(root)
    with_workers = [*TINY[: TINY.index("--workers")], "--workers", "2"]  # patched DataLoader workers too
    proc = run_script(*with_workers, "--cache-dir", str(cache), nanopatch=True)
    assert data_line(proc) == (root, "reused")
    assert snapshot(root) == before
    summary(proc)
    # the runner pins the main thread to one CPU; torch's check of the worker count must still
    # count the run's CPUs (2 workers on a 2-CPU run: no warning)
    if len(os.sched_getaffinity(0)) >= 2:
        assert "worker processes in total" not in proc.stderr, proc.stderr


def test_compare_shows_the_patched_run_accelerated_and_learning_as_stock(first_run):
    """``python -m nanopatch --compare`` on the example: the patched run's model really ran
    accelerated (what the runner saw inside it), and it learns as the stock run does. On this
    tiny set (19 training images, one epoch, 5 validation images) "as stock" means the same
    final loss to within bf16's drift and the same validation accuracy to within one image."""
    from nanopatch.foundation import cpu

    cache, _ = first_run
    proc = run_python(
        ["-m", "nanopatch", "--compare", str(SCRIPT), *TINY, "--cache-dir", str(cache)],
        env=child_env(),
        cwd=REPO_ROOT,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {}
    for line in proc.stdout.splitlines():
        cells = [cell.strip() for cell in line.split("|")]
        if len(cells) >= 3:
            rows[cells[0]] = cells[1:]
    assert rows["exit code"][:2] == ["0", "0"], rows
    accelerated = rows["model accelerated"][1]
    assert accelerated.startswith("yes (ResNet:") and "channels-last" in accelerated, accelerated
    assert ("computed in bfloat16" in accelerated) == cpu.host_facts().native_bf16, accelerated
    stock_loss, patched_loss = (float(v) for v in rows["final loss"][:2])
    assert abs(patched_loss - stock_loss) <= 0.15, rows["final loss"]
    stock_acc, patched_acc = (float(v.rstrip("%")) for v in rows["validation accuracy"][:2])
    assert abs(patched_acc - stock_acc) <= 20.0, rows["validation accuracy"]
    assert "worker" not in proc.stderr, proc.stderr  # no DataLoader warning caused by the runner's pinning

    # the closing lines, what a newcomer reads: the verdicts, and what ran on this CPU and why
    closing = proc.stdout[proc.stdout.index("\nIn short: ") :]
    assert closing.splitlines()[1].startswith("In short: ") and "examples/train_imagefolder.py" in closing
    assert re.search(r"^  speed +(\d+\.\d\dx as fast as stock|about as fast as stock|slower than stock)", closing, re.M)
    assert re.search(r"^  accuracy +(the same|different): validation accuracy [\d.]+% against stock's", closing, re.M)
    assert "that 5 samples leave" in closing  # the count the example prints its accuracy of
    accelerated = closing[closing.index("  accelerated:") : closing.index("  not accelerated:")]
    assert "- ResNet: computed in " in accelerated and "channels-last" in accelerated, closing
    assert "- images: JPEG decoding by " in accelerated and "torchvision's transforms" in accelerated, closing
    if os.environ.get("NANOPATCH_TEST_REQUIRE_NATIVE"):  # CI: the compiled kernels are there, and said
        said = " ".join(accelerated.split())  # the summary wraps its lines
        assert "only the crop's box of each JPEG decoded" in said, closing
        assert "bilinear resizes on nanopatch's compiled copies of Pillow's loops" in said, closing
    not_accelerated = closing[closing.index("  not accelerated:") : closing.index("  next:")]
    if not cpu.host_facts().native_bf16:
        assert "bf16 autocast: this CPU has no native bf16" in not_accelerated, closing
    assert "torch.compile: off by default" in not_accelerated, closing
    assert "--verify " in closing and "--compare --plot breakdown.png " in closing


def test_data_option_trains_on_a_given_folder(first_run, tmp_path):
    _, first = first_run
    root, _ = data_line(first)
    proc = run_script(*TINY, "--data", str(root), "--cache-dir", str(tmp_path / "unused"))
    assert data_line(proc) == (root, "given")
    assert not (tmp_path / "unused").exists()
    summary(proc)


@pytest.mark.parametrize("option", ["--epochs", "--batch-size", "--image-size"])
def test_a_count_below_one_is_a_usage_error(option, tmp_path, example, monkeypatch, capsys):
    """The script's main(), in this process (a process per case cost ~15 s of CI each): argparse's
    exit status 2 and message, and nothing generated before the arguments are checked."""
    monkeypatch.setattr("sys.argv", [str(SCRIPT), option, "0", "--cache-dir", str(tmp_path)])
    with pytest.raises(SystemExit) as exited:
        example.main()
    assert exited.value.code == 2
    assert f"{option} must be at least 1" in capsys.readouterr().err
    assert not any(tmp_path.iterdir()), "nothing is generated before the arguments are checked"


def test_script_does_not_import_nanopatch():
    tree = ast.parse(SCRIPT.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            assert not any(alias.name.split(".")[0] == "nanopatch" for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0 and (node.module or "").split(".")[0] != "nanopatch"
    assert "importlib" not in SCRIPT.read_text()


# In-process: the dataset generation on its own.


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("train_imagefolder_example", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generation_is_deterministic(example, tmp_path):
    example.build_dataset(tmp_path / "a", 10)
    example.build_dataset(tmp_path / "b", 10)
    a = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*.jpg"))
    assert len(a) == 10
    assert a == sorted(p.relative_to(tmp_path / "b") for p in (tmp_path / "b").rglob("*.jpg"))
    assert all((tmp_path / "a" / p).read_bytes() == (tmp_path / "b" / p).read_bytes() for p in a)


def test_interrupted_generation_leaves_nothing_behind(example, tmp_path, monkeypatch):
    real_build = example.build_dataset

    def interrupted(root, num_images):
        real_build(root, num_images)
        raise KeyboardInterrupt

    monkeypatch.setattr(example, "build_dataset", interrupted)
    with pytest.raises(KeyboardInterrupt):
        example.demo_dataset(tmp_path, 10)
    assert list(tmp_path.iterdir()) == []


def test_a_run_that_loses_the_race_uses_the_winners_copy(example, tmp_path, monkeypatch, capsys):
    real_build = example.build_dataset
    winner = tmp_path / "images-10"

    def racing(root, num_images):
        real_build(root, num_images)
        real_build(winner, num_images)  # another run renames its copy into place first

    monkeypatch.setattr(example, "build_dataset", racing)
    assert example.demo_dataset(tmp_path, 10) == winner
    assert (winner / "COMPLETE.json").is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["images-10"]
    assert "another run" in capsys.readouterr().out


def test_an_unfinished_folder_is_replaced(example, tmp_path, capsys):
    stale = tmp_path / "images-10"
    (stale / "train" / "coast").mkdir(parents=True)
    (stale / "train" / "coast" / "half-written.jpg").write_bytes(b"\xff\xd8")
    root = example.demo_dataset(tmp_path, 10)
    assert root == stale and (root / "COMPLETE.json").is_file()
    assert not (root / "train" / "coast" / "half-written.jpg").exists()
    assert "generated" in capsys.readouterr().out
    assert example.demo_dataset(tmp_path, 10) == root
    assert "reused" in capsys.readouterr().out
