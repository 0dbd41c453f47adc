"""Shared test helpers: run Python in a fresh interpreter, with the test helpers importable."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from nanopatch.engine import config
from nanopatch.foundation import cpu

TESTS_DIR = Path(__file__).resolve().parent
REPO_ROOT = TESTS_DIR.parent
#: what a model left to nanopatch computes in on this CPU: bf16 where it is native (avx512_bf16,
#: AMX); fp32 on one without (an AMD EPYC with AVX2 alone), where bf16 would be emulated
AUTO_COMPUTE = "bfloat16" if cpu.host_facts().native_bf16 else "float32"


def pytest_configure(config):
    """Under pytest-xdist (tox runs ``-n 2`` on two cores) each worker's own torch work runs on
    one thread: with torch's default of a thread per core in each worker, two workers' OpenMP
    threads spin against each other for the same cores and a training test runs several times
    slower. Processes the tests start keep torch's default (or what the test sets).

    A suite started in the background (``pytest &``, ``nohup tox &``) ignores SIGINT, and every
    process it starts would inherit that: a script the tests interrupt would never see its
    KeyboardInterrupt. SIGINT is handled here as in a foreground run, which ``exec`` resets to
    the default in the children, as a terminal gives it.

    What nanopatch measures and keeps for later runs (compile=auto, the dropout masks, --nproc
    measure) goes to a folder of the suite's own, which the processes it starts inherit: the
    user's records never steer a test, and the tests write none of theirs."""
    if not os.environ.get("NANOPATCH_CACHE_DIR"):
        import tempfile

        os.environ["NANOPATCH_CACHE_DIR"] = tempfile.mkdtemp(prefix="nanopatch-test-cache-")
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(1)


def child_env(extra: dict[str, str] | None = None, **overrides: str) -> dict[str, str]:
    """The environment for a child interpreter: no NANOPATCH_* leaking in from outside, the
    tests folder (for helpers and data) on PYTHONPATH, and nanopatch importable even when it is
    not installed (a plain checkout)."""
    from nanopatch.engine import config

    private = {config.env_name(name) for name in config.OPTIONS} | {
        "NANOPATCH_LOG_LEVEL",
        "NANOPATCH_DECODER",
        "NANOPATCH_TUNED",
        "NANOPATCH_CPUS",
        "NANOPATCH_RUNTIME_TUNED",
        "NANOPATCH_REPORT",
        "NANOPATCH_USAGE",
        "NANOPATCH_PREFIX",
        "NANOPATCH_THREADS",
        "NANOPATCH_SHARED",
        "NANOPATCH_MEASURE_OUT",
        "NANOPATCH_MEASURE_STEPS",
        "NANOPATCH_MEASURE_TIMEOUT",
        "NANOPATCH_NPROC_MEASURED",
        "NANOPATCH_NATIVE",
    }
    env = {k: v for k, v in os.environ.items() if k not in private}
    paths = [str(TESTS_DIR)]
    try:
        import nanopatch

        package_parent = str(Path(nanopatch.__file__).resolve().parent.parent)
    except ImportError:  # pragma: no cover
        package_parent = str(REPO_ROOT)
    paths.append(package_parent)
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.pop("PYTHONSTARTUP", None)
    env.update(extra or {})
    env.update(overrides)
    return env


def run_python(
    args: list[str] | str,
    *,
    env: dict[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    timeout: float = 180,
    check: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Run ``python <args>`` (or ``python -c <code>`` when given a string) in a fresh process."""
    if isinstance(args, str):
        args = ["-c", textwrap.dedent(args)]
    proc = subprocess.run(
        [sys.executable, *args],
        env=child_env() if env is None else env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"python {' '.join(args)} exited {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
        )
    return proc


@pytest.fixture
def fresh_log_once(monkeypatch):
    """Forget which one-time messages were already said, so a test can see them."""
    import weakref

    from nanopatch.foundation import log

    monkeypatch.setattr(log, "_said", set())
    monkeypatch.setattr(log, "_said_about", weakref.WeakKeyDictionary())


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    """The image corpus of tests/data/make_corpus.py (good, bad and unusual files, the
    12000x9000 JPEG included), built once per session: name -> Entry."""
    from data.make_corpus import build

    entries = build(tmp_path_factory.mktemp("corpus"), huge=True)
    return {entry.name: entry for entry in entries}


FIXTURES = Path(__file__).parent / "fixtures" / "cpu"


def facts_of(name: str) -> cpu.CpuFacts:
    return cpu.facts(
        cpuinfo_path=str(FIXTURES / name),
        proc_self_cgroup="/nonexistent",
        cgroup_root="/nonexistent",
        allowed=(0, 1),
    )


@pytest.fixture
def machine(monkeypatch):
    """Pretend to run on a fixture CPU; no IPEX installed; no NANOPATCH_* in the environment."""

    def use(name: str, ipex: str | None = None, torch: str | None = "2.13.0") -> None:
        monkeypatch.setattr(cpu, "host_facts", lambda: facts_of(name))
        versions = {"intel-extension-for-pytorch": ipex, "torch": torch}
        monkeypatch.setattr(config, "distribution_version", lambda dist: versions.get(dist))

    for name in config.OPTIONS:
        monkeypatch.delenv(config.env_name(name), raising=False)
    use("xeon_spr_2s_ht.cpuinfo")
    return use


def run_rank_script(script: str, out: Path, *args: str, cwd: Path, timeout: float = 300) -> dict[int, dict]:
    """Run ``script OUT args...``, which writes ``OUT/rank<N>.json`` (with a ``rank`` key) and
    ``OUT/rank<N>.pt`` (weights) per training process: each report by rank, weights under
    ``"weights"``; what the run printed goes to ``OUT/output.txt``. Fails with the script's
    output when it exits non-zero."""
    import json

    import torch

    out.mkdir()
    proc = run_python([script, str(out), *args], cwd=cwd, env=child_env(), timeout=timeout)
    assert proc.returncode == 0, f"exit {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
    (out / "output.txt").write_text(proc.stdout + proc.stderr)
    reports = {}
    for path in sorted(out.glob("rank*.json")):
        report = json.loads(path.read_text())
        report["weights"] = torch.load(path.with_suffix(".pt"))
        reports[report["rank"]] = report
    return reports
