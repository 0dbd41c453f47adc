"""``python -m nanopatch``: the runner. Every runner test starts ``python -m nanopatch ...`` in a
fresh interpreter (conftest.run_python) on small scripts written into tmp_path; the
``split_argv`` tests at the end run in-process.

Scripts report what they saw as one ``RESULT <json>`` line on stdout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import nanopatch
from nanopatch.engine import config
from nanopatch.runner.cli import _UsageError, build_parser, split_argv

from conftest import child_env, run_python

# Prints what a script (or module) sees as the RESULT line.
REPORT = """
import json, os, sys
import nanopatch

def _report(**extra):
    options = nanopatch.status()["options"]
    print("RESULT " + json.dumps({
        "argv": sys.argv,
        "name": __name__,
        "file": globals().get("__file__"),
        "path": sys.path,
        "cwd": os.getcwd(),
        "patched": nanopatch.is_patched(),
        "options": {name: [o["value"], o["source"]] for name, o in options.items()},
        "env_compile": os.environ.get("NANOPATCH_COMPILE"),
        **extra,
    }))
"""


def write(path: Path, code: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(code))
    return path


def runner(args, *, cwd, env=None):
    return run_python(["-m", "nanopatch", *args], env=env, cwd=cwd)


def result(proc) -> dict:
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert len(lines) == 1, f"exit {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
    return json.loads(lines[0][len("RESULT ") :])


def ok(proc):
    assert proc.returncode == 0, f"exit {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
    return result(proc)


def same_path(a: str, b: str | os.PathLike[str]) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


@pytest.fixture
def project(tmp_path):
    """tmp_path/proj/s.py (reports) next to tmp_path/proj/sibling.py; the runner runs from tmp_path."""
    write(tmp_path / "proj" / "sibling.py", "VALUE = 'sibling here'\n")
    write(tmp_path / "proj" / "s.py", REPORT + "import sibling\n_report(sibling=sibling.VALUE)\n")
    return tmp_path


# --- 1. argv, __main__, __file__, sys.path, the runner's own options -----------------------

SCRIPT_ARGS = ["--no-bf16", "-v", "--info", "-m", "x", "--", "--compile=fastest", "plain"]


@pytest.mark.parametrize("separator", [[], ["--"]], ids=["no-separator", "double-dash"])
def test_script_sees_argv_main_file_and_path_like_plain_python(project, separator):
    proc = runner(["--no-bf16", "--no-compile", *separator, "proj/s.py", *SCRIPT_ARGS], cwd=project)
    seen = ok(proc)
    # everything after the script is the script's, even words that are runner options
    assert seen["argv"] == ["proj/s.py", *SCRIPT_ARGS]
    assert seen["name"] == "__main__"
    # (relative paths are relative to the script's working directory)
    assert same_path(os.path.join(seen["cwd"], seen["file"]), project / "proj" / "s.py")
    # sys.path[0] is the script's folder (not the current directory), so siblings import
    assert same_path(seen["path"][0], project / "proj")
    assert seen["sibling"] == "sibling here"
    assert not any(same_path(p, project) for p in seen["path"] if p)
    # options before the script are the runner's, exported for child processes
    assert seen["patched"] is True
    assert seen["options"]["bf16"] == [False, "argument"]
    assert seen["options"]["compile"] == [False, "argument"]
    assert seen["env_compile"] == "0"
    # "-v" and "--info" after the script were not taken by the runner
    assert "nanopatch:" not in proc.stderr
    assert "Packages" not in proc.stdout


def test_file_is_absolute_like_plain_python(project):
    seen = ok(runner(["proj/s.py"], cwd=project))
    assert seen["file"] == os.path.join(seen["cwd"], "proj", "s.py")


def test_installed_nanopatch_command_runs_scripts_like_python(project):
    """The `nanopatch` console script (installed next to the interpreter, as under tox)."""
    command = Path(sys.executable).with_name("nanopatch")
    if not command.exists():
        pytest.skip("nanopatch is not installed as a command in this environment (plain checkout)")
    proc = subprocess.run(
        [str(command), "--no-bf16", "proj/s.py", "x"],
        cwd=project,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    seen = ok(proc)
    assert seen["argv"] == ["proj/s.py", "x"] and seen["patched"] is True
    assert same_path(seen["path"][0], project / "proj")  # not the command's bin/ folder
    assert not any(same_path(p, command.parent) for p in seen["path"] if p)
    assert seen["options"]["bf16"] == [False, "argument"]


# --- 2. exit codes and exceptions ------------------------------------------------------------


@pytest.mark.parametrize(
    "body, code, stderr_tail",
    [
        ("sys.exit(3)", 3, None),
        ('sys.exit("the script gave up")', 1, "the script gave up"),
        ('def fail():\n    raise KeyError("boom")\nfail()', 1, "KeyError: 'boom'"),
    ],
    ids=["exit-3", "exit-message", "exception"],
)
def test_exit_code_and_exceptions_propagate(tmp_path, body, code, stderr_tail):
    script = write(tmp_path / "ends.py", "import sys\nprint('started')\n" + body + "\nprint('not reached')\n")
    proc = runner([str(script)], cwd=tmp_path)
    assert proc.returncode == code, proc.stderr
    assert proc.stdout == "started\n"
    if stderr_tail is None:
        assert proc.stderr == ""
    else:
        assert proc.stderr.rstrip().endswith(stderr_tail)
    if "raise" in body:
        assert proc.stderr.startswith("Traceback (most recent call last):")
        assert f'File "{script}", line 5, in <module>' in proc.stderr
        assert f'File "{script}", line 4, in fail' in proc.stderr


FLATTENS_GRADIENTS = """
import torch
from torch import nn

model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(2):
    optimizer.zero_grad()
    nn.functional.cross_entropy(model(torch.randn(4, 3, 8, 8)), torch.tensor([0, 1, 0, 1])).backward()
    print("norm", float(torch.cat([p.grad.{flatten} for p in model.parameters()]).norm()) > 0)
    optimizer.step()
"""


@pytest.mark.parametrize("flatten", ["view(-1)", "reshape(-1)"])
@pytest.mark.py_only  # a whole script under the runner
def test_a_script_failing_on_channels_last_weights_is_told_why(tmp_path, flatten):
    """``p.grad.view(-1)`` outside the forward (gradient logging, PCGrad, ``parameters_to_vector``)
    raises on the channels-last weights nanopatch gave the model, which nothing can rescue there:
    the error says what nanopatch did and how to run without it; ``reshape`` runs."""
    script = write(tmp_path / "flat.py", FLATTENS_GRADIENTS.replace("{flatten}", flatten))
    if flatten == "reshape(-1)":
        proc = runner(["--channels-last", "--no-bf16", str(script)], cwd=tmp_path)
        assert proc.returncode == 0 and proc.stdout == "norm True\nnorm True\n", proc.stderr
        return
    _told_why(
        tmp_path,
        script,
        ["--channels-last", "--no-bf16"],
        ["--no-channels-last", "--no-bf16"],
        "RuntimeError: view size is not compatible with input tensor's size and stride",
        "nanopatch: Sequential trains with channels-last weights and gradients (faster convolutions), and "
        "Tensor.view cannot flatten them: .reshape(-1) and .contiguous() work on both layouts, or turn "
        "channels-last off to keep stock's strides (--no-channels-last, patch_torch(channels_last=False) or "
        "NANOPATCH_CHANNELS_LAST=0)",
    )


def _told_why(tmp_path, script, on: list[str], off: list[str], error: str, line: str) -> None:
    """``script`` under the runner with ``on`` fails with ``error``, ``line`` ending its stderr,
    and runs with ``off``."""
    proc = runner([*on, str(script)], cwd=tmp_path)
    assert proc.returncode == 1
    assert error in proc.stderr
    assert proc.stderr.rstrip().endswith(line)
    fine = runner([*off, str(script)], cwd=tmp_path)
    assert fine.returncode == 0, fine.stderr


@pytest.mark.py_only  # a whole script
def test_a_script_patching_itself_is_told_why_too(tmp_path):
    """``nanopatch.patch_torch()`` in the script, no runner: the line comes under the traceback
    through ``sys.excepthook`` (while patched; unpatch gives the hook back, unless the script set
    its own meanwhile)."""
    script = write(
        tmp_path / "inline.py",
        "import sys\nimport nanopatch\nhook = sys.excepthook\nnanopatch.patch_torch(channels_last=True, bf16=False)\n"
        "import torch  # the training target applies with torch\n"
        "assert sys.excepthook is not hook\nnanopatch.unpatch_torch()\nassert sys.excepthook is hook\n"
        "nanopatch.patch_torch()\nsys.excepthook = own = lambda *a: None\nnanopatch.unpatch_torch()\n"
        "assert sys.excepthook is own  # one set meanwhile stays\nsys.excepthook = hook\n"
        "nanopatch.patch_torch(channels_last=True, bf16=False)\n" + FLATTENS_GRADIENTS.replace("{flatten}", "view(-1)"),
    )
    proc = run_python([str(script)], cwd=tmp_path)
    assert proc.returncode == 1 and "RuntimeError: view size is not compatible" in proc.stderr
    assert proc.stderr.rstrip().endswith("patch_torch(channels_last=False) or NANOPATCH_CHANNELS_LAST=0)")
    assert proc.stderr.count("nanopatch: Sequential trains with channels-last weights") == 1


KEEPS_ACTIVATIONS = """
import torch
from torch import nn

model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
kept = {}
model[1].register_forward_hook(lambda module, args, out: kept.__setitem__("act", out.detach()))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(2):
    optimizer.zero_grad()
    nn.functional.cross_entropy(model(torch.randn(4, 8)), torch.tensor([0, 1, 0, 1])).backward()
    optimizer.step()
    print("mean", kept["act"].numpy().mean() >= 0)
"""


@pytest.mark.py_only  # a whole script under the runner
def test_a_script_failing_on_bf16_activations_is_told_why(tmp_path):
    """An activation a forward hook kept is bf16 under nanopatch's autocast (as under
    ``torch.autocast``), and numpy has no bf16: ``act.numpy()`` after the step raises, outside
    the forward, where nothing can rescue it; the error says why and how to run without it."""
    _told_why(
        tmp_path,
        write(tmp_path / "acts.py", KEEPS_ACTIVATIONS),
        ["--bf16"],
        ["--no-bf16"],
        "TypeError: Got unsupported ScalarType BFloat16",
        "nanopatch: Sequential computes in bf16 (bf16 autocast, as torch.autocast would), so the activations "
        "a hook keeps are bf16, which numpy lacks: .float().numpy() works on both, or turn bf16 off to compute "
        "in fp32 (--no-bf16, patch_torch(bf16=False) or NANOPATCH_BF16=0)",
    )


# --- 3. -m module ----------------------------------------------------------------------------


@pytest.fixture
def package(tmp_path):
    write(tmp_path / "pkg" / "__init__.py", "")
    write(tmp_path / "pkg" / "mod.py", REPORT + "_report()\n")
    write(tmp_path / "pkg" / "__main__.py", REPORT + "_report(via='__main__')\n")
    return tmp_path


@pytest.mark.parametrize(
    "args, file, script_args, bf16",
    [
        (["-m", "pkg.mod", "a", "b"], "mod.py", ["a", "b"], "auto"),
        (["-mpkg.mod", "a", "b"], "mod.py", ["a", "b"], "auto"),
        (["--no-bf16", "-m", "pkg.mod", "-m", "x", "--no-bf16"], "mod.py", ["-m", "x", "--no-bf16"], "argument"),
        (["-m", "pkg", "--info"], "__main__.py", ["--info"], "auto"),
    ],
    ids=["module", "glued", "options-both-sides", "package-main"],
)
def test_module_form_runs_like_python_dash_m(package, args, file, script_args, bf16):
    seen = ok(runner(args, cwd=package))
    assert seen["argv"][1:] == script_args
    assert same_path(seen["argv"][0], package / "pkg" / file)
    assert os.path.isabs(seen["argv"][0])
    assert seen["name"] == "__main__"
    assert same_path(seen["path"][0], package)
    assert seen["patched"] is True
    assert seen["options"]["bf16"][1] == bf16


def test_missing_module_fails_naming_it(tmp_path):
    proc = runner(["-m", "no_such_module_xyz", "a"], cwd=tmp_path)
    assert proc.returncode == 1  # as plain `python -m` exits
    assert "No module named no_such_module_xyz" in proc.stderr
    assert "Traceback" not in proc.stderr  # one line, not the runner's own frames
    assert proc.stdout == ""


# --- 4. the script runs patched ----------------------------------------------------------------

DEMO_SCRIPT = """
import json, sys
import nanopatch
from helpers import demo_targets

demo_targets.register()
assert "torchvision" not in sys.modules
import torchvision.transforms  # noqa: F401
states = {name: t["state"] for name, t in nanopatch.status()["targets"].items()}
if nanopatch.status()["options"]["vision"]["value"]:
    demo_targets.assert_patched()
print("RESULT " + json.dumps({"patched": nanopatch.is_patched(), "states": states}))
"""

#: the --cuda-to-cpu targets and the breakdown are off unless asked for
OFF = {"cuda_to_cpu": "disabled", "cuda_extensions": "disabled", "breakdown": "disabled"}


@pytest.mark.parametrize(
    "options, states",
    [
        ([], {**OFF, "vision": "patched", "demo-vision": "patched", "demo-training": "patched"}),
        (["--no-vision"], {**OFF, "vision": "disabled", "demo-vision": "disabled", "demo-training": "patched"}),
    ],
    ids=["default", "no-vision"],
)
@pytest.mark.py_only  # a whole script under the runner
def test_script_runs_patched_with_demo_targets(tmp_path, options, states):
    script = write(tmp_path / "demo.py", DEMO_SCRIPT)
    seen = ok(runner([*options, str(script)], cwd=tmp_path))
    assert seen == {"patched": True, "states": states}


# --- 5. child processes ------------------------------------------------------------------------

CHILDREN_SCRIPT = """
import json, multiprocessing, os, subprocess, sys

CHILD_CODE = '''
import json, os, sys
import nanopatch
options = nanopatch.status()["options"]
print(json.dumps({
    "pid": os.getpid(),
    "patched": nanopatch.is_patched(),
    "bf16": [options["bf16"]["value"], options["bf16"]["source"]],
    "user_site": getattr(sys, "_nanopatch_test_user_site", False),
}))
'''


def report():
    namespace = {}
    import contextlib, io
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(CHILD_CODE, namespace)
    return json.loads(out.getvalue())


def child(queue):
    queue.put(report())


class Dataset:
    def __len__(self):
        return 1

    def __getitem__(self, index):
        import sys
        import nanopatch
        return [nanopatch.is_patched(), getattr(sys, "_nanopatch_test_user_site", False)]


if __name__ == "__main__":
    import nanopatch
    out = {"parent_patched": nanopatch.is_patched()}
    methods = ["spawn"] if "--control" in sys.argv else ["spawn", "forkserver"]
    for method in methods:
        ctx = multiprocessing.get_context(method)
        queue = ctx.Queue()
        process = ctx.Process(target=child, args=(queue,))
        process.start()
        out[method] = queue.get(timeout=120)
        process.join()
        out[method + "_exitcode"] = process.exitcode
    if "--control" not in sys.argv:
        done = subprocess.run([sys.executable, "-c", CHILD_CODE], capture_output=True, text=True, check=True)
        out["subprocess"] = json.loads(done.stdout)
        import torch.utils.data

        loader = torch.utils.data.DataLoader(
            Dataset(), batch_size=None, num_workers=1, multiprocessing_context="spawn"
        )
        out["dataloader"] = list(loader)
    print("RESULT " + json.dumps(out))
"""

USER_SITECUSTOMIZE = """
import os, sys
sys._nanopatch_test_user_site = True
with open(os.environ["NANOPATCH_TEST_MARKER"], "a") as marker:
    marker.write(f"{os.getpid()}\\n")
"""


@pytest.mark.py_only  # a whole script under the runner
def test_child_processes_are_patched_with_the_runners_options(tmp_path):
    script = write(tmp_path / "children.py", CHILDREN_SCRIPT)
    user_site = tmp_path / "user_site"
    write(user_site / "sitecustomize.py", USER_SITECUSTOMIZE)
    marker = tmp_path / "marker.txt"
    env = child_env(NANOPATCH_TEST_MARKER=str(marker))
    env["PYTHONPATH"] = os.pathsep.join([str(user_site), env["PYTHONPATH"]])
    seen = ok(runner(["--no-bf16", str(script)], cwd=tmp_path, env=env))

    assert seen["parent_patched"] is True
    for kind in ("spawn", "forkserver", "subprocess"):
        assert seen[kind]["patched"] is True, kind
        # the explicit --no-bf16 reached the child through NANOPATCH_BF16
        assert seen[kind]["bf16"] == [False, "environment"], kind
        # the user's own sitecustomize still ran in the child
        assert seen[kind]["user_site"] is True, kind
    assert seen["spawn_exitcode"] == seen["forkserver_exitcode"] == 0
    # the DataLoader worker (spawn) ran __getitem__ patched, with the user's sitecustomize
    assert seen["dataloader"] == [[True, True]]
    # the user's sitecustomize ran exactly once in each freshly started interpreter
    pids = marker.read_text().split()
    for kind in ("spawn", "subprocess"):
        assert pids.count(str(seen[kind]["pid"])) == 1, (kind, pids)


def test_without_the_runner_a_spawn_child_is_not_patched(tmp_path):
    """The control case: plain ``python script.py``."""
    script = write(tmp_path / "children.py", CHILDREN_SCRIPT)
    seen = ok(run_python([str(script), "--control"], cwd=tmp_path))
    assert seen["parent_patched"] is False
    assert seen["spawn"]["patched"] is False
    assert seen["spawn"]["bf16"][1] == "auto"
    assert seen["spawn"]["user_site"] is False


# --- 6. usage errors ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, env, code, expected",
    [
        ([], {}, 2, ["usage: python -m nanopatch", "no script or -m module to run"]),
        (["--no-bf16", "--"], {}, 2, ["usage: python -m nanopatch"]),
        (["missing.py"], {}, 2, ["can't open file", "missing.py", "No such file or directory"]),
        (["--bogus", "s.py"], {}, 2, ["usage:", "unrecognized arguments: --bogus"]),
        (["--compile=fastest", "s.py"], {}, 2, ["argument --compile", "'fastest'", *config.COMPILE_MODES]),
        (["s.py"], {"NANOPATCH_BF16": "maybe"}, 2, ["'bf16'", "NANOPATCH_BF16", "'maybe'"]),
        (["--json", "s.py"], {}, 2, ["usage:", "--json goes with --info"]),
        (["-m"], {}, 2, ["argument -m: expected a module name"]),
    ],
    ids=["no-script", "only-options", "missing-file", "unknown-option", "bad-compile", "bad-env", "json", "dash-m"],
)
def test_usage_errors(tmp_path, args, env, code, expected):
    write(tmp_path / "s.py", "print('the script ran')\n")
    proc = runner(args, cwd=tmp_path, env=child_env(env))
    assert proc.returncode == code, proc.stderr
    assert proc.stdout == ""  # the script never ran
    for text in expected:
        assert text in proc.stderr, (text, proc.stderr)


def test_version(tmp_path):
    proc = runner(["--version", "s.py"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"nanopatch {nanopatch.__version__}\n"


# --- 7. --compile forms ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "flag, value, exported",
    [("--compile=max-autotune", "max-autotune", "max-autotune"), ("--compile", "default", "default")],
)
def test_compile_forms(tmp_path, flag, value, exported):
    write(tmp_path / "s.py", REPORT + "_report()\n")
    seen = ok(runner([flag, "s.py", "arg"], cwd=tmp_path))
    assert seen["argv"] == ["s.py", "arg"]  # a bare --compile does not swallow the script
    assert seen["options"]["compile"] == [value, "argument"]
    assert seen["env_compile"] == exported


# --- 8. -v -------------------------------------------------------------------------------------

VERBOSE_SCRIPT = """
import subprocess, sys
import nanopatch
# different options than the runner's: the re-application is logged (INFO)
nanopatch.patch_torch(compile="max-autotune")
subprocess.run(
    [sys.executable, "-c", "import nanopatch; nanopatch.patch_torch(compile='reduce-overhead')"], check=True
)
print("done")
"""


@pytest.mark.parametrize("verbose", [True, False], ids=["verbose", "quiet"])
def test_verbose_logs_to_stderr_also_in_children(tmp_path, verbose):
    script = write(tmp_path / "s.py", VERBOSE_SCRIPT)
    proc = runner([*(["-v"] if verbose else []), "--no-bf16", str(script)], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "done\n"
    lines = proc.stderr.splitlines()
    if not verbose:
        assert lines == []
        return
    assert all(line.startswith("nanopatch: ") for line in lines), lines
    reapplied = [line for line in lines if "re-applying patches with new options" in line]
    # once in the script's process, once in the child (NANOPATCH_LOG_LEVEL is exported)
    assert len(reapplied) == 2, lines
    assert all(line.startswith("nanopatch: INFO: ") for line in reapplied)
    assert "'compile': 'max-autotune'" in reapplied[0] and "'compile': 'reduce-overhead'" in reapplied[1]
    ipex_ok, ipex_reason = config.ipex_compatibility()
    ipex_lines = [line for line in lines if "IPEX off" in line]
    if ipex_ok:
        assert ipex_lines == []
    else:  # auto-detection says why IPEX is off, in the runner and in the child
        assert ipex_lines == [f"nanopatch: INFO: IPEX off: {ipex_reason}"] * 2


# --- split_argv (in-process) ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["s.py"], ([], "script", "s.py", [])),
        (
            ["--no-bf16", "-v", "s.py", "--no-bf16", "-v", "--info"],
            (["--no-bf16", "-v"], "script", "s.py", ["--no-bf16", "-v", "--info"]),
        ),
        (["--compile", "s.py", "x"], (["--compile"], "script", "s.py", ["x"])),
        (["--compile=max-autotune", "s.py"], (["--compile=max-autotune"], "script", "s.py", [])),
        (["-vv", "--no-compile", "s.py"], (["-vv", "--no-compile"], "script", "s.py", [])),
        (["--bogus", "s.py", "a"], (["--bogus"], "script", "s.py", ["a"])),
        (["-m", "pkg.mod", "-m", "x", "--"], ([], "module", "pkg.mod", ["-m", "x", "--"])),
        (["--no-bf16", "-mpkg.mod", "a"], (["--no-bf16"], "module", "pkg.mod", ["a"])),
        (["-v", "s.py", "-m", "pkg"], (["-v"], "script", "s.py", ["-m", "pkg"])),
        (["--no-bf16", "--", "-odd.py", "--", "a"], (["--no-bf16"], "script", "-odd.py", ["--", "a"])),
        (["--", "-m", "x"], ([], "script", "-m", ["x"])),
        (["--info", "--json"], (["--info", "--json"], None, None, [])),
        ([], ([], None, None, [])),
    ],
)
def test_split_argv(argv, expected):
    assert split_argv(build_parser(), argv) == expected


@pytest.mark.parametrize("argv", [["-m"], ["--no-bf16", "-v", "-m"]])
def test_split_argv_dash_m_without_module_raises(argv):
    with pytest.raises(_UsageError, match="expected a module name"):
        split_argv(build_parser(), argv)


@pytest.mark.py_only  # a whole script under the runner
def test_v_prints_each_of_nanopatchs_lines_once_beside_a_root_handler(tmp_path):
    """``-v`` sends nanopatch's log to stderr; a handler on the root logger (the script's
    ``logging.basicConfig``, or the one IPEX installs on import) does not print it again."""
    script = tmp_path / "train.py"
    script.write_text(
        "import logging, torch\n"
        "logging.basicConfig(level=logging.INFO, format='root: %(message)s')\n"
        "logging.getLogger('train').info('the script logs too')\n"
        "model = torch.nn.Linear(4, 2)\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for _ in range(3):\n"
        "    optimizer.zero_grad()\n"
        "    model(torch.randn(8, 4)).sum().backward()\n"
        "    optimizer.step()\n"
    )
    proc = run_python(["-m", "nanopatch", "-v", str(script)], env=child_env(), cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "root: the script logs too" in proc.stderr  # the script's own logging is its own
    trained = [line for line in proc.stderr.splitlines() if "trained: Linear" in line]
    assert len(trained) == 1, proc.stderr
