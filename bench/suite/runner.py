"""Running every bench in one command: each in a fresh process, its progress, its log and JSON,
the machine facts and the results file bench/run.py writes.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import platform
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import harness as h
from report.markdown import duration
from report.readme import readme_table
from report.render import render

from .benches import REPO_ROOT, SCHEMA, Bench, Options, deadlines, rows_of

LOG_TAIL_LINES = 40


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The benches' environment: this checkout's nanopatch first on PYTHONPATH, unbuffered output."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def parse_json_output(text: str) -> dict[str, Any]:
    """The JSON object a bench printed (tolerating lines printed before it)."""
    text = text.strip()
    try:
        return json.loads(text)
    except ValueError:
        pass
    decoder = json.JSONDecoder()
    for match in re.finditer(r"^\{", text, re.MULTILINE):
        try:
            return decoder.raw_decode(text[match.start() :])[0]
        except ValueError:
            continue
    raise ValueError(f"no JSON object in its output ({len(text)} characters)")


def tail(text: str, lines: int = LOG_TAIL_LINES) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def stop(proc: subprocess.Popen) -> None:
    """End a bench we started, with the workers it started (its own process group)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        try:
            proc.wait(timeout=10)
            return
        except subprocess.TimeoutExpired:
            continue


class Progress:
    """tqdm over the benches (on stderr), or plain lines when tqdm is not installed."""

    def __init__(self, total: int) -> None:
        try:
            from tqdm import tqdm
        except ImportError:
            self.bar = None
            self.total, self.done = total, 0
        else:
            self.bar = tqdm(
                total=total,
                unit="bench",
                file=sys.stderr,
                dynamic_ncols=True,
                bar_format="{desc} |{bar}| {n_fmt}/{total_fmt} benches [{elapsed} in all]{postfix}",
            )

    def start(self, name: str) -> None:
        if self.bar is not None:
            self.bar.set_description_str(f"running {name}", refresh=False)
            self.bar.set_postfix_str("0 s in this bench")
        else:
            print(f"[{self.done + 1}/{self.total}] running {name} ...", file=sys.stderr, flush=True)

    def tick(self, elapsed: float) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(f"{duration(elapsed)} in this bench")

    def finish(self, message: str) -> None:
        if self.bar is not None:
            self.bar.write(message, file=sys.stderr)
            self.bar.update(1)
        else:
            self.done += 1
            print(message, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.set_description_str("done", refresh=False)
            self.bar.set_postfix_str("", refresh=False)
            self.bar.close()


def run_bench(
    bench: Bench, options: Options, log_path: Path, progress: Progress, timeout: float | None
) -> dict[str, Any]:
    """Run one bench as a subprocess, its output to ``log_path``; read and normalise its JSON.
    Returns the bench's entry of the results (status ok or failed, never raises for a failing bench)."""
    with tempfile.TemporaryDirectory(prefix=f"nanopatch-bench-{bench.name}-") as tmp:
        json_path = Path(tmp) / f"{bench.name}.json"
        command = [sys.executable, str(bench.script), *bench.args(options, json_path)]
        entry: dict[str, Any] = {"status": "failed", "command": command, "log": log_path.name}
        log_path.write_text(f"$ {shlex.join(command)}\n")
        started = time.monotonic()
        progress.start(bench.name)
        with open(log_path, "a") as log, tempfile.TemporaryFile("w+") as stdout:
            proc = subprocess.Popen(
                command,
                cwd=REPO_ROOT,
                env=child_env(bench.extra_env),
                stdin=subprocess.DEVNULL,
                stdout=stdout if bench.json_to == "stdout" else log,
                stderr=log,
                start_new_session=True,  # its own process group: stopped with its workers
                text=True,
            )
            timed_out = False
            try:
                while True:
                    try:
                        returncode = proc.wait(timeout=0.5)
                        break
                    except subprocess.TimeoutExpired:
                        elapsed = time.monotonic() - started
                        progress.tick(elapsed)
                        if timeout is not None and elapsed > timeout:
                            timed_out = True
                            stop(proc)
                            returncode = proc.wait()
                            break
            except BaseException:  # Ctrl-C: stop the bench we started, then let it propagate
                stop(proc)
                raise
            entry["seconds"] = time.monotonic() - started
            entry["returncode"] = returncode
            stdout.seek(0)
            printed = stdout.read()
        log_tail = tail(log_path.read_text())
        if bench.json_to == "stdout" and printed:
            with open(log_path, "a") as log:
                log.write(f"\n--- stdout ---\n{printed}")
        if timed_out:
            entry["error"] = f"timed out after {duration(timeout or 0)} (stopped)"
        elif returncode != 0:
            entry["error"] = f"killed by signal {-returncode}" if returncode < 0 else f"exited with code {returncode}"
        else:
            try:
                text = printed if bench.json_to == "stdout" else json_path.read_text()
                entry["raw"] = parse_json_output(text)
            except (OSError, ValueError) as exc:
                entry["error"] = f"exited with code 0 but gave no JSON result: {exc}"
                log_tail = tail(log_tail + ("\n--- stdout ---\n" + tail(printed, 10) if printed else ""))
            else:
                try:
                    entry["rows"] = rows_of(bench, entry["raw"])
                    entry["status"] = "ok"
                except (KeyError, TypeError) as exc:  # the JSON is kept
                    entry["error"] = f"its JSON has no rows in the schema: {type(exc).__name__}: {exc}"
                    log_tail = f"(the bench's raw JSON is kept)\n{log_tail}"
        if entry["status"] != "ok":
            entry["log_tail"] = log_tail
        return entry


#: versions the report gives besides Python, torch, torchvision and nanopatch
VERSIONS = ("intel-extension-for-pytorch", "numpy", "pillow", "opencv-python-headless", "opencv-python", "PyTurboJPEG")


def machine_facts() -> dict[str, Any]:
    """The machine, the versions and the git state (bench/harness/machine.py), with the host name."""
    m = h.machine_facts(*VERSIONS)
    keep = ("vendor", "physical_cores", "logical_cpus", "usable_cores", "flags", "native_bf16", "amx", "mem_total_gib")
    machine = {
        "hostname": socket.gethostname(),
        "cpu_model": m["model_name"],
        **{k: m[k] for k in keep},
        "platform": platform.platform(),
    }
    versions = {k: m[k] for k in ("python", "torch", "torchvision", "nanopatch", *VERSIONS)}
    versions["opencv"] = versions.pop("opencv-python-headless") or versions.pop("opencv-python")
    versions.pop("opencv-python", None)
    return {"machine": machine, "versions": versions, "git": m["git"]}


def results_stem(out_dir: Path, when: dt.datetime, hostname: str) -> str:
    """``<YYYY-MM-DD>-<hostname>``, with -2, -3 ... when that day's file exists (never overwritten)."""
    host = re.sub(r"[^A-Za-z0-9._-]+", "-", hostname).strip("-") or "host"
    stem = f"{when:%Y-%m-%d}-{host}"
    candidate, index = stem, 1
    while (out_dir / f"{candidate}.json").exists():
        index += 1
        candidate = f"{stem}-{index}"
    return candidate


def reproduce_command(argv: Sequence[str]) -> str:
    return shlex.join(["python", "bench/run.py", *argv]).replace("python", "PYTHONPATH=. python", 1)


def write_json(path: Path, results: dict[str, Any]) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(results, indent=1) + "\n")
    tmp.replace(path)


def run(args: argparse.Namespace, argv: Sequence[str], benches: dict[str, Bench]) -> int:
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    start = dt.datetime.now().astimezone()
    started = time.monotonic()
    server = bool(getattr(args, "server", False))
    options = Options(quick=args.quick, ipex_python=args.ipex_python, server=server)
    names = list(benches) if args.only is None else args.only
    selected = [benches[n] for n in names if benches[n].script.exists()]
    skipped = {
        n: f"not run: {display_path(benches[n].script)} does not exist" for n in names if not benches[n].script.exists()
    }
    for name, why in skipped.items():
        print(f"{name}: {why}", file=sys.stderr)
    facts = machine_facts()
    stem = results_stem(out_dir, start, facts["machine"]["hostname"] + ("-server" if server else ""))
    json_path = out_dir / f"{stem}.json"
    results: dict[str, Any] = {
        "schema": SCHEMA,
        "command": reproduce_command(argv),
        "argv": list(argv),
        "python_executable": sys.executable,
        "quick": args.quick,
        "server": server,
        "started": start.isoformat(timespec="seconds"),
        "duration_s": None,
        "complete": False,
        **facts,
        "environment": {k: v for k, v in sorted(os.environ.items()) if k.startswith("NANOPATCH_")},
        "loadavg": {"start": h.load_average(), "end": None},
        "benches": {},
        "skipped": skipped,
        "failures": [],
        "rows": [],
    }
    write_json(json_path, results)
    progress = Progress(len(selected))
    minutes = getattr(args, "minutes", None)
    until = {} if minutes is None else deadlines([b.name for b in selected], minutes, time.time())
    if minutes is not None:
        results["budget"] = {"minutes": minutes, "until": until}
    try:
        for bench in selected:
            asked = dataclasses.replace(options, until=until.get(bench.name))
            entry = run_bench(bench, asked, out_dir / f"{stem}-{bench.name}.log", progress, args.timeout)
            results["benches"][bench.name] = entry
            if entry["status"] == "ok":
                results["rows"].extend(entry["rows"])
                progress.finish(f"{bench.name}: ok ({duration(entry['seconds'])}, {len(entry['rows'])} rows)")
            else:
                failure = {
                    "bench": bench.name,
                    "error": entry["error"],
                    "log": entry["log"],
                    "log_tail": entry["log_tail"],
                }
                results["failures"].append(failure)
                progress.finish(
                    f"{bench.name}: FAILED ({entry['error']}); log: {display_path(out_dir / entry['log'])}\n"
                    + "\n".join("    " + line for line in tail(entry["log_tail"], 8).splitlines())
                )
            results["duration_s"] = time.monotonic() - started
            write_json(json_path, results)
    except KeyboardInterrupt:
        progress.close()
        results["duration_s"] = time.monotonic() - started
        results["interrupted"] = True
        write_json(json_path, results)
        print(f"interrupted; partial results in {display_path(json_path)}", file=sys.stderr)
        return 130
    progress.close()
    results["duration_s"] = time.monotonic() - started
    results["loadavg"]["end"] = h.load_average()
    results["complete"] = True
    write_json(json_path, results)
    written = render(results, json_path, benches)
    print(f"took {duration(results['duration_s'])}; wrote:", file=sys.stderr)
    for path in [json_path, *written]:
        print(f"  {display_path(path)}", file=sys.stderr)
    if args.readme:
        print(readme_table(results, benches))
    if results["failures"]:
        print(f"failed: {', '.join(f['bench'] for f in results['failures'])}", file=sys.stderr)
        return 1
    return 0


def display_path(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)
