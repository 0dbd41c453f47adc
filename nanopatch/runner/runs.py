"""Running a script for ``--compare`` and ``--verify``: its environment (stock's has nothing of
nanopatch's in it), its command (the stock run's prefix), the run itself with its output echoed
as it comes, and the account the patched run writes at its end (``NANOPATCH_REPORT``)."""

from __future__ import annotations

import codecs
import json
import os
import re
import subprocess
import sys
import time

from .output import Run

REPORT_VARIABLE = "NANOPATCH_REPORT"  # where the patched run writes its account (write_report, below)


def stock_environ(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment with nothing of nanopatch's in it: no ``NANOPATCH_*`` variables and no
    bootstrap on ``PYTHONPATH`` (a compare run started from a patched process, say)."""
    from ._bootstrap import BOOTSTRAP_DIR

    env = {k: v for k, v in (os.environ if environ is None else environ).items() if not k.startswith("NANOPATCH_")}
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and os.path.abspath(p) != BOOTSTRAP_DIR]
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(paths)
    else:
        env.pop("PYTHONPATH", None)
    env["PYTHONHASHSEED"] = "0"
    return env


def stock_prefix(cuda_to_cpu: bool, breakdown: bool = False) -> list[str]:
    """What the stock run starts with: plain ``python``; with ``--cuda-to-cpu``, the CUDA
    redirect (:mod:`nanopatch._stock`: a GPU script cannot run here without it); with
    ``breakdown``, the breakdown's timing."""
    flags = [flag for flag, on in (("--cuda-to-cpu", cuda_to_cpu), ("--breakdown", breakdown)) if on]
    return ["-m", "nanopatch._stock", *flags] if flags else []


def package_path(folder: str) -> str:
    """A ``PYTHONPATH`` entry through which ``-m nanopatch`` finds this nanopatch in the runs
    (when it runs from a checkout, say), and nothing else: a folder made in ``folder`` holding
    only a link to the package. The package's own parent folder would do it too, but for an
    installed copy that is a whole site-packages, which would come before the user's own
    ``PYTHONPATH`` in both runs and every process they start (another Python's included). Where
    links cannot be made, the parent folder after all."""
    import nanopatch

    package = os.path.dirname(os.path.abspath(nanopatch.__file__))
    entry = os.path.join(folder, "nanopatch-path")
    try:
        os.makedirs(entry, exist_ok=True)
        link = os.path.join(entry, "nanopatch")
        if not os.path.islink(link):
            os.symlink(package, link, target_is_directory=True)
    except OSError:
        return os.path.dirname(package)
    return entry


def execute(run: Run, env: dict[str, str], out=None) -> Run:
    """Run it, echoing its output (stdout and stderr, merged) as it comes, each line prefixed
    with its name. Output is echoed as soon as it is read, not a line at a time: a progress bar
    that redraws itself with ``\r`` and no newline shows as it moves (each redraw prefixed
    again), and the lines are kept for reading once the run ends."""
    out = sys.stdout if out is None else out
    start = time.perf_counter()
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    echo = _Echo(f"[{run.name}] ", out)
    pending = ""
    with subprocess.Popen(run.command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT) as proc:
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        while True:
            chunk = os.read(fd, 65536)
            text = decoder.decode(chunk, final=not chunk)
            echo.write(text)
            pending += text
            *lines, pending = _LINE_END.split(pending)
            run.output.extend(lines)
            if not chunk:
                break
        run.exit_code = proc.wait()
    if pending:
        run.output.extend(pending.rstrip("\r").split("\r") if pending.strip("\r") else [])
    echo.close()
    run.seconds = time.perf_counter() - start
    return run


#: a line's end in a child's output, as Python's universal newlines read it: ``\n``, ``\r\n``, or
#: a lone ``\r`` (a progress bar's redraw); a ``\r`` last in what was read so far waits for what
#: follows it, which may be its ``\n``
_LINE_END = re.compile(r"\r\n|\n|\r(?!\Z)")
#: where the echo starts a new prefixed line: after a newline, or a redraw's carriage return
_ECHO_BREAK = re.compile(r"(\r\n|\n|\r)")


class _Echo:
    """Writes a child's output with a prefix at the start of each line (and after each ``\r``
    a progress bar redraws with), flushing at once."""

    def __init__(self, prefix: str, out) -> None:
        self.prefix, self.out, self.at_start = prefix, out, True

    def write(self, text: str) -> None:
        if not text:
            return
        parts = []
        for piece in _ECHO_BREAK.split(text):
            if not piece:
                continue
            if piece in ("\r\n", "\n", "\r"):
                parts.append("\n" if piece == "\r\n" else piece)
                self.at_start = True
            else:
                if self.at_start:
                    parts.append(self.prefix)
                    self.at_start = False
                parts.append(piece)
        self.out.write("".join(parts))
        self.out.flush()

    def close(self) -> None:
        """A last line without its newline gets one, so that what follows starts a line."""
        if not self.at_start:
            self.out.write("\n")
            self.out.flush()
            self.at_start = True


def write_report() -> None:
    """At a run's end: its account as JSON to ``NANOPATCH_REPORT``, when that is set (by rank 0
    only in a ``--nproc`` run): the training patch's account of its models, where it is
    loaded, and the breakdown, where it is on."""
    path = os.environ.get(REPORT_VARIABLE)
    if not path or os.environ.get("RANK", "0") != "0":
        return
    account: dict = {}
    training = sys.modules.get("nanopatch.targets.training.patch")
    if training is not None:
        account.update(models=training.describe(), summary=training.summary())
    account.update(_patched_account())
    timing = sys.modules.get("nanopatch.targets.breakdown.patch")
    times = timing.describe() if timing is not None else None
    if times is not None:
        account["breakdown"] = times
    with open(path, "w") as f:
        json.dump(account, f, default=str)


def _patched_account() -> dict:
    """What a patched run chose, for the closing summary: each option's value and why
    (``options``), whether torchvision's decoding and transforms were patched (``vision``; what
    really ran through them, in every process, is :mod:`nanopatch.foundation.usage`'s), and the
    CPU runtime variables the runner set (``runtime``). Empty in a run nothing patched
    (``--compare``'s stock run)."""
    from nanopatch import engine
    from nanopatch.runtime import tuning

    config = engine.active_config()
    if config is None:
        return {}
    state, detail = engine.target_state("vision")
    account: dict = {"options": config.as_dict(), "vision": {"state": state, "detail": detail}}
    account["runtime"] = {
        name: os.environ[name] for name in sorted(tuning.tuned_names(os.environ)) if name in os.environ
    }
    training = sys.modules.get("nanopatch.targets.training.patch")
    if training is not None and training.malloc_reuse():
        account["malloc_reuse"] = training.malloc_reuse()
    return account
