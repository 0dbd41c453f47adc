"""Every benchmark in one command: runs them, then writes a JSON record, a Markdown summary and charts.

Runs the benches in bench/ one after another, each as its own subprocess that times stock against
nanopatch side by side exactly as it does when run alone (this script times nothing itself), with
a progress bar over the benches. Each bench's output goes to a log file beside the results; a
bench that fails is recorded as failed, with the tail of its log, and the others go on (the exit
code is then 1). Every bench writes its results as rows of one schema (bench/_harness.py: bench,
group = pipeline and size or model, variant, rate, unit, ratio to stock, spread); they are written,
with the machine, the versions, the git commit and the command, to
``<out>/<YYYY-MM-DD>-<hostname>.json``; beside it a Markdown summary (``.md``, one table per bench)
and one PNG chart per bench (the speed-up over stock per pipeline or model).

    PYTHONPATH=. python bench/run.py [--quick]
                                     [--only decode,transforms,train_step,import_cost,multi_instance,frameworks]
                                     [--ipex-python PATH] [--out bench/results] [--timeout SECONDS] [--readme]
    PYTHONPATH=. python bench/run.py --render bench/results/<file>.json [--readme]

``--quick`` runs every bench's quick mode (and 5 rounds of import_cost): a few minutes on 2 cores, to
check that everything works, not to quote. ``--render`` rewrites the Markdown and the charts from
an existing JSON without running anything; ``--readme`` prints a compact Markdown table for the
project README (one row per bench and pipeline or model: stock's rate and nanopatch's speed-ups).
Ratios are always speed-ups: above 1.00x is faster than stock (for import_cost, stock's start-up
time over the variant's). The training benches judge each variant's first steps from the seed
against stock's (``nanopatch.learning``): a variant that does not learn as stock is shown as
"does not learn" in the rows, the Markdown, the charts and the README table, never as a speed-up.
Needs matplotlib for the charts (left out, with a note, without it) and uses tqdm for the
progress bar when it is installed.
"""

from __future__ import annotations

import argparse
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
import textwrap
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import harness as h  # bench/ is this script's folder, first on sys.path

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
#: 2: the training benches' rows carry ``learning`` (their verdict against stock's run)
SCHEMA = 2
LOG_TAIL_LINES = 40
BUSY_CPU_SHARE, SUSPECT_MARK, one_line, suspect = h.BUSY_CPU_SHARE, h.SUSPECT_MARK, h.one_line, h.suspect
IMPORT_COST_QUICK_ROUNDS = 5


@dataclass(frozen=True)
class Options:
    """What the benches are asked for."""

    quick: bool = False
    ipex_python: str | None = None


@dataclass(frozen=True)
class Bench:
    """One benchmark script and how to read it.

    ``args(options, json_path)`` gives its command-line options; with ``json_to == "stdout"`` its
    JSON is what it prints, with ``"file"`` what it writes to ``json_path``; its ``rows`` are in
    the one schema of bench/harness/rows.py. ``label(variant)`` is the variant's name in the report.
    ``readme`` maps the variants shown in the README table to short labels (None: every variant but
    stock, by name). ``show_delta`` adds the difference from stock in the rate's unit (for times)."""

    name: str
    script: Path
    title: str
    group_label: str
    args: Callable[[Options, Path], list[str]]
    label: Callable[[str], str] = str
    json_to: str = "stdout"
    about: str = ""
    readme: dict[str, str] | None = None
    show_delta: bool = False
    extra_env: dict[str, str] = field(default_factory=dict)


# --- reading the benches' rows ---------------------------------------------------------------------

#: the keys of a row (bench/harness/rows.py's ``row``) that the report keeps; the rest stays in ``raw``.
#: ``ratio_to_by_hand``: train_step's speed-up over its ``by-hand`` row (the step edited for bf16 and channels-last);
#: ``model_flops``, ``roof_fraction``: train_step's model FLOP/s and their share of the matmul roof measured
#: in the same run (the faster of bf16's and fp32's rates);
#: ``learning``: a training variant's loss and gradient count per step beside stock's, and its verdict (a row
#: whose variant does not learn as stock has no rate and no ratio)
ROW_KEYS = (
    "bench", "group", "variant", "rate", "unit", "ratio_to_stock", "stock", "spread", "note", "cpu_share",
    "other_load", "noisy", "ratio_to_by_hand", "learning", "model_flops", "roof_fraction",
)  # fmt: skip


def rows_of(bench: Bench, raw: dict[str, Any]) -> list[dict[str, Any]]:
    """The bench's rows as the report keeps them: the common keys, the variant shown by ``label``."""
    rows = []
    for r in raw["rows"]:
        kept = {k: r[k] for k in ROW_KEYS if k in r}
        kept["bench"] = bench.name
        kept["variant"] = bench.label(r["variant"])
        if kept["rate"] is None and not kept.get("note"):
            kept["note"] = one_line(r.get("error") or "did not run")
        rows.append(kept)
    return rows


def frameworks_label(variant: str) -> str:
    """``hf-nanopatch`` -> ``nanopatch``: the groups share columns."""
    return re.sub(r"^(ddp|hf|timm)-", "", variant)


def _quick(options: Options) -> list[str]:
    return ["--quick"] if options.quick else []


def json_to_stdout(options: Options, _: Path) -> list[str]:
    return [*_quick(options), "--json"]


def json_to_file(options: Options, path: Path) -> list[str]:
    return [*_quick(options), "--json", str(path)]


BENCHES: dict[str, Bench] = {
    bench.name: bench
    for bench in (
        Bench(
            name="decode",
            script=BENCH_DIR / "decode.py",
            title="JPEG loading: torchvision's pil_loader, stock against nanopatch",
            group_label="size",
            args=json_to_stdout,
            about="images/s on one pinned core, file read included; stock = torchvision's own `pil_loader`",
            readme={"nanopatch loader": "loader", "nanopatch DCT-scaled (min 224)": "DCT-scaled decode"},
        ),
        Bench(
            name="transforms",
            script=BENCH_DIR / "transforms.py",
            title="ImageFolder + torchvision transforms pipelines",
            group_label="pipeline",
            args=json_to_stdout,
            about="images/s of `dataset[i]` on one pinned core; stock = torchvision as installed",
            readme={"nanopatch": "nanopatch", "nanopatch fast decode": "fast decode"},
        ),
        Bench(
            name="train_step",
            script=BENCH_DIR / "train_step.py",
            title="Training step: stock PyTorch against nanopatch's training patch",
            group_label="model",
            args=lambda o, path: [*(["--ipex-python", o.ipex_python] if o.ipex_python else []), *json_to_file(o, path)],
            json_to="file",
            about="samples/s of a full training step with torch's default threads; stock = nanopatch not imported",
            readme={"patched": "patched", "compile": "compile", "ipex": "IPEX"},
        ),
        Bench(
            name="multi_instance",
            script=BENCH_DIR / "multi_instance.py",
            title="Several training instances on one machine",
            group_label="model",
            args=json_to_file,
            json_to="file",
            about="total samples/s; stock = plain python, nanopatch not imported",
        ),
        Bench(
            name="frameworks",
            script=BENCH_DIR / "frameworks.py",
            title="Framework training code: Lightning, Hugging Face Trainer, timm",
            group_label="framework",
            args=json_to_file,
            label=frameworks_label,
            json_to="file",
            about="samples/s of the training steps of unmodified framework scripts; stock = plain python",
            readme={"nanopatch": "nanopatch", "nanopatch+bf16-mixed": "nanopatch + bf16-mixed", "nproc2": "--nproc 2"},
        ),
        Bench(
            name="import_cost",
            script=BENCH_DIR / "import_cost.py",
            title="Start-up: what importing nanopatch adds to import torch",
            group_label="command",
            args=lambda o, _: [*(["--rounds", str(IMPORT_COST_QUICK_ROUNDS)] if o.quick else []), "--json"],
            about="median wall time of `python -c ...`, interleaved rounds; ratio = stock's time / the variant's",
            readme={
                "import torch, nanopatch": "import nanopatch",
                "import torch, nanopatch + patch_torch()": "+ patch_torch()",
            },
            show_delta=True,
        ),
    )
}


# --- running the benches -----------------------------------------------------------------------


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


def duration(seconds: float) -> str:
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


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
    options = Options(quick=args.quick, ipex_python=args.ipex_python)
    names = list(benches) if args.only is None else args.only
    selected = [benches[n] for n in names if benches[n].script.exists()]
    skipped = {
        n: f"not run: {display_path(benches[n].script)} does not exist" for n in names if not benches[n].script.exists()
    }
    for name, why in skipped.items():
        print(f"{name}: {why}", file=sys.stderr)
    facts = machine_facts()
    stem = results_stem(out_dir, start, facts["machine"]["hostname"])
    json_path = out_dir / f"{stem}.json"
    results: dict[str, Any] = {
        "schema": SCHEMA,
        "command": reproduce_command(argv),
        "argv": list(argv),
        "python_executable": sys.executable,
        "quick": args.quick,
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
    try:
        for bench in selected:
            entry = run_bench(bench, options, out_dir / f"{stem}-{bench.name}.log", progress, args.timeout)
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


# --- reports: Markdown, README table, charts --------------------------------------------------


def fmt_rate(value: float | None) -> str:
    if value is None:
        return "-"
    if abs(value) >= 99.95:
        return f"{value:.0f}"
    return f"{value:#.3g}"


def fmt_ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def ordered(values: list[str]) -> list[str]:
    return list(dict.fromkeys(values))


def bench_rows(results: dict[str, Any], name: str) -> list[dict[str, Any]]:
    entry = results["benches"].get(name, {})
    return entry.get("rows") or [r for r in results.get("rows", []) if r["bench"] == name]


def table_layout(rows: list[dict[str, Any]]) -> tuple[list[str], list[str], dict[tuple[str, str], dict[str, Any]]]:
    """Groups (in order), variants (stock first) and the row of each (group, variant)."""
    groups = ordered([r["group"] for r in rows])
    variants = ordered([r["variant"] for r in rows if r["stock"]] + [r["variant"] for r in rows])
    cells = {(r["group"], r["variant"]): r for r in rows}
    return groups, variants, cells


def stock_of(rows: list[dict[str, Any]], group: str) -> dict[str, Any] | None:
    return next((r for r in rows if r["group"] == group and r["stock"]), None)


def machine_line(results: dict[str, Any], *, short: bool = False) -> str:
    m = results.get("machine", {})
    v = results.get("versions", {})
    cores = m.get("physical_cores")
    parts = [m.get("cpu_model") or "unknown CPU"]
    if cores:
        parts.append(
            f"{cores} physical cores" if short else f"{cores} physical cores ({m.get('logical_cpus')} logical)"
        )
    bf16 = [f for f in m.get("flags", []) if "bf16" in f or f.startswith("amx")]
    parts.append(", ".join(bf16) if bf16 else "no native bf16")
    if m.get("amx") is False:
        parts.append("no AMX")
    parts.append(f"torch {v.get('torch') or '?'}")
    return ", ".join(parts)


def bench_meta(name: str, benches: dict[str, Bench]) -> Bench | None:
    return benches.get(name)


def cell(r: dict[str, Any] | None, stock: dict[str, Any] | None, show_delta: bool) -> str:
    if r is None:
        return ""
    if h.learns(r) is False:
        return f"**{h.DOES_NOT_LEARN}**"
    if r["rate"] is None:
        return "did not run"
    mark = SUSPECT_MARK if suspect(r) else ""
    roof = f", {roof_text(r)}" if roof_text(r) else ""
    if r["stock"]:
        return fmt_rate(r["rate"]) + mark + (f" ({roof_text(r)})" if roof else "")
    extra = fmt_ratio(r["ratio_to_stock"])
    if show_delta and stock is not None and stock["rate"] is not None:
        extra = f"{r['rate'] - stock['rate']:+.0f} {r['unit']}, {extra}"
    return f"{fmt_rate(r['rate'])}{mark} ({extra}{roof})"


def roof_text(r: dict[str, Any]) -> str:
    """A training step's fraction of the machine's matmul roof, where it was measured."""
    return f"{r['roof_fraction']:.0%} of roof" if r.get("roof_fraction") is not None else ""


def markdown(results: dict[str, Any], benches: dict[str, Bench], charts: dict[str, str]) -> str:
    m, v, git = results.get("machine", {}), results.get("versions", {}), results.get("git", {})
    date = results.get("started", "")[:10]
    lines = [f"# nanopatch benchmarks: {date}, {m.get('hostname', '?')}", ""]
    flags = " ".join(m.get("flags", [])) or "-"
    yes_no = {True: "yes", False: "no", None: "?"}
    lines.append(
        f"- **Machine**: {m.get('cpu_model')}, {m.get('physical_cores')} physical cores ({m.get('logical_cpus')} "
        f"logical, {m.get('usable_cores')} usable); ISA flags: {flags}; native bf16: {yes_no[m.get('native_bf16')]}, "
        f"AMX: {yes_no[m.get('amx')]}"
        + (f"; {m['mem_total_gib']:.0f} GiB" if m.get("mem_total_gib") else "")
        + f"; {m.get('platform', '')}"
    )
    commit = (git.get("commit") or "?")[:12] + (" with uncommitted changes" if git.get("dirty") else "")
    lines.append(
        f"- **Software**: Python {v.get('python')}, torch {v.get('torch')}, torchvision {v.get('torchvision')}, "
        f"nanopatch {v.get('nanopatch')}"
        + (f", IPEX {v['intel-extension-for-pytorch']}" if v.get("intel-extension-for-pytorch") else "")
        + f" (git {commit})"
    )
    took = duration(results["duration_s"]) if results.get("duration_s") is not None else "?"
    lines.append(f"- **Command** (from the repository root): `{results.get('command')}`")
    load = results.get("loadavg") or {}
    lines.append(
        f"- Started {results.get('started')}, took {took}."
        + (" Interrupted." if results.get("interrupted") else "")
        + (f" Load average (1, 5, 15 min) at start: {load['start']}" if load.get("start") else "")
        + (f"; at the end: {load['end']}." if load.get("end") else "")
    )
    if results.get("quick"):
        lines.append(
            "- **Quick mode**: small sizes and few rounds, to check that everything runs; not numbers to quote."
        )
    if results.get("environment"):
        lines.append("- Environment: " + ", ".join(f"`{k}={val}`" for k, val in results["environment"].items()))
    lines += [
        "",
        "Each cell: the rate, then in brackets the speed-up over stock (above 1.00x is faster than stock). "
        "Every bench times its stock and nanopatch variants side by side in the same run; see bench/README.md. "
        f"A training variant whose first steps from the seed do not learn as stock's (nanopatch.learning, the test "
        f"suite's definition) shows **{h.DOES_NOT_LEARN}** and no rate.",
    ]
    for name, entry in results.get("benches", {}).items():
        bench = bench_meta(name, benches)
        title = bench.title if bench else name
        lines += ["", f"## {name}: {title}", ""]
        if bench and bench.about:
            lines += [bench.about[0].upper() + bench.about[1:] + f"; ran in {duration(entry.get('seconds', 0))}.", ""]
        if entry["status"] != "ok":
            lines += [f"**Failed**: {entry.get('error')} (log: `{entry.get('log')}`)", "", "```text"]
            lines += [entry.get("log_tail", "").replace("```", "'''"), "```"]
            continue
        rows = bench_rows(results, name)
        groups, variants, cells = table_layout(rows)
        label = bench.group_label if bench else "group"
        lines.append(f"| {label} | unit | " + " | ".join(variants) + " |")
        lines.append("|---|---|" + "---:|" * len(variants))
        for group in groups:
            stock = stock_of(rows, group)
            unit = next(r["unit"] for r in rows if r["group"] == group)
            show_delta = bool(bench and bench.show_delta)
            values = [cell(cells.get((group, variant)), stock, show_delta) for variant in variants]
            lines.append(f"| {group} | {unit} | " + " | ".join(values) + " |")
        noted: dict[tuple[str, str], list[str]] = {}
        for r in rows:
            if r.get("note") and h.learns(r) is not False:  # a verdict is in the learning list below
                noted.setdefault((r["variant"], r["note"]), []).append(r["group"])
        notes = [f"`{variant}` ({', '.join(groups)}): {note}" for (variant, note), groups in noted.items()]
        busy = [
            f"`{r['variant']}` {r['group']} {r['cpu_share'] * 100:.0f}%"
            for r in rows
            if r.get("cpu_share") is not None and r["cpu_share"] < BUSY_CPU_SHARE
        ]
        if busy:
            notes.append(
                f"{SUSPECT_MARK} CPU below {BUSY_CPU_SHARE:.0%} of the wall time ({', '.join(busy)}): other processes "
                "were taking the cores while these were timed, so these rates (and ratios) are suspect"
            )
        loaded = [
            f"`{r['variant']}` {r['group']} {r['other_load']:.0%}"
            for r in rows
            if r.get("other_load") is not None and r["other_load"] > h.OTHER_LOAD_WARNING
        ]
        if loaded:
            notes.append(
                f"{SUSPECT_MARK} other load above {h.OTHER_LOAD_WARNING:.0%} of all CPUs during a round "
                f"({', '.join(loaded)}): these rates (and ratios) are suspect"
            )
        if notes:
            lines.append("")
            lines += [f"- {note}" for note in notes]
        judged = [r for r in rows if r.get("learning")]
        if judged:
            lines += ["", "Learning, per variant against stock's run (loss and gradient count per step):", ""]
            lines += [f"- {r['group']}: {h.learning_line(r)}" for r in judged]
        if name in charts:
            lines += ["", f"![{name}: speed-up over stock]({charts[name]})"]
    if results.get("skipped"):
        lines += ["", "## Not run", ""]
        lines += [f"- {name}: {why}" for name, why in results["skipped"].items()]
    if results.get("failures"):
        lines += ["", "**Failed benches**: " + ", ".join(f["bench"] for f in results["failures"]) + " (above)."]
    return "\n".join(lines) + "\n"


def readme_table(results: dict[str, Any], benches: dict[str, Bench]) -> str:
    """A compact Markdown table for the project README: one row per bench and pipeline or model,
    stock's rate and nanopatch's speed-up(s); then the machine, date and command."""
    lines = ["| benchmark | pipeline / model | stock | nanopatch (speed-up over stock) |", "|---|---|---:|---|"]
    any_suspect = any_refused = False
    for name, entry in results.get("benches", {}).items():
        if entry.get("status") != "ok":
            lines.append(f"| {name} | - | - | failed: {one_line(entry.get('error', ''), 80)} |")
            continue
        bench = bench_meta(name, benches)
        labels = bench.readme if bench else None
        rows = bench_rows(results, name)
        for group in ordered([r["group"] for r in rows]):
            stock = stock_of(rows, group)
            shown = []
            for r in rows:
                refused = h.learns(r) is False
                if r["group"] != group or r["stock"] or (r["ratio_to_stock"] is None and not refused):
                    continue
                if labels is not None and r["variant"] not in labels:
                    continue
                label = labels[r["variant"]] if labels is not None else r["variant"]
                if refused:  # no speed-up for it, only the verdict
                    shown.append(f"{label} **{h.DOES_NOT_LEARN}**")
                    any_refused = True
                    continue
                value = fmt_ratio(r["ratio_to_stock"])
                if suspect(r) or (stock is not None and suspect(stock)):
                    value += SUSPECT_MARK
                    any_suspect = True
                if bench and bench.show_delta and stock is not None:
                    value = f"{r['rate'] - stock['rate']:+.0f} {r['unit']} ({value})"
                if roof_text(r):
                    value += f", {roof_text(r)}"
                shown.append(f"{label} {value}")
            stock_text = f"{fmt_rate(stock['rate'])} {stock['unit']}" if stock and stock["rate"] is not None else "-"
            lines.append(f"| {name} | {group} | {stock_text} | {', '.join(shown) or '-'} |")
    quick = " (quick mode: a smoke test, not numbers to quote)" if results.get("quick") else ""
    lines.append("")
    if any_suspect:
        lines += [
            f"{SUSPECT_MARK} suspect: other processes were taking the cores while it was timed, or its samples "
            "spread wider than the effect.",
            "",
        ]
    if any_refused:
        lines += [
            f"**{h.DOES_NOT_LEARN}**: its first training steps from the seed did not learn as stock's (the report "
            "gives why), so no speed-up is given for it.",
            "",
        ]
    lines += [
        f"Measured on {machine_line(results)}, {results.get('started', '')[:10]}{quick}. "
        f"Reproduce: `{results.get('command')}`",
    ]
    return "\n".join(lines)


def chart(results: dict[str, Any], name: str, bench: Bench | None, path: Path) -> bool:
    """One PNG of :func:`chart_figure` at ``path``. False if there is nothing to draw."""
    import matplotlib.pyplot as plt

    fig = chart_figure(results, name, bench)
    if fig is None:
        return False
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def chart_figure(results: dict[str, Any], name: str, bench: Bench | None):
    """Grouped bars of each variant's speed-up over stock per pipeline / model, stock as the 1.0
    line, values on the bars, the machine in the subtitle (a matplotlib figure, or None if there is
    nothing to draw). A variant that does not learn as stock gets no bar: a red cross and "does not
    learn" in its place."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    rows = bench_rows(results, name)
    plotted = [r for r in rows if not r["stock"] and (r["ratio_to_stock"] is not None or h.learns(r) is False)]
    if not plotted:
        return None
    groups = ordered([r["group"] for r in rows if r["ratio_to_stock"] is not None or h.learns(r) is False])
    variants = ordered([r["variant"] for r in plotted])
    cells = {(r["group"], r["variant"]): r for r in plotted}
    n = len(variants)
    width = min(0.8 / n, 0.3)
    fig_width = min(16.0, max(7.0, 1.5 + len(groups) * (0.7 + 0.55 * n)))
    fig, ax = plt.subplots(figsize=(fig_width, 5.2))
    colours = plt.get_cmap("tab10").colors
    greys = ("0.62", "0.78", "0.48", "0.88", "0.36")
    # nanopatch's own variants in colour, the others (raw decoders, albumentations...) in grey, hatched
    ours = [v for v in variants if bench is None or bench.readme is None or v in bench.readme]
    variants = ours + [v for v in variants if v not in ours]
    top = 1.0
    label_size = 8 if n * len(groups) <= 16 else 7
    others = [v for v in variants if v not in ours]
    refused: list[tuple[float, Any]] = []  # (x, colour) of the cells of variants that do not learn as stock
    legend_only: list[Any] = []  # variants that never learned: a legend entry, no bar
    for i, variant in enumerate(variants):
        if variant in ours:
            style = {"color": colours[ours.index(variant) % len(colours)], "label": variant}
        else:
            grey = greys[others.index(variant) % len(greys)]
            style = {"color": grey, "hatch": "//", "edgecolor": "white", "label": f"{variant} (reference)"}
        xs, ys, labels = [], [], []
        for j, group in enumerate(groups):
            r = cells.get((group, variant))
            x = j + (i - (n - 1) / 2) * width
            if r is not None and h.learns(r) is False:
                refused.append((x, style["color"]))
            elif r is not None:
                xs.append(x)
                ys.append(r["ratio_to_stock"])
                busy = suspect(r) or (stock_of(rows, group) is not None and suspect(stock_of(rows, group)))
                labels.append(f"{r['ratio_to_stock']:.2f}x" + (SUSPECT_MARK if busy else ""))
        if not ys:
            legend_only.append(Patch(**style))
            continue
        top = max(top, *ys)
        bars = ax.bar(xs, ys, width * 0.92, zorder=2, **style)
        ax.bar_label(bars, labels=labels, padding=2, fontsize=label_size, rotation=90 if n > 3 else 0)
    for x, colour in refused:  # in a bar's place: a cross in the variant's colour, and the verdict
        ax.plot([x], [0.04 * top], marker="x", markersize=9, markeredgewidth=2.5, color=colour, zorder=4)
        ax.text(x, 0.09 * top, h.DOES_NOT_LEARN, rotation=90, ha="center", va="bottom", fontsize=label_size,
                color="tab:red", zorder=4)  # fmt: skip
    stock_names = ordered([r["variant"] for r in rows if r["stock"]])
    ax.axhline(
        1.0, color="black", linestyle="--", linewidth=1.2, zorder=3, label=f"{' / '.join(stock_names) or 'stock'} = 1.0"
    )
    ticks = []
    for group in groups:
        stock = stock_of(rows, group)
        ticks.append(group if stock is None else f"{group}\nstock {fmt_rate(stock['rate'])} {stock['unit']}")
    ax.set_xticks(range(len(groups)), ticks, fontsize=9)
    ax.set_xlim(-0.6, len(groups) - 0.4)
    ax.set_ylim(0, top * (1.3 if n > 3 else 1.15))
    ax.set_ylabel("speed-up over stock (x)")
    ax.grid(axis="y", color="0.9", zorder=0)
    ax.spines[["top", "right"]].set_visible(False)
    title = f"{name}: {bench.title}" if bench else name
    fig.suptitle(textwrap.fill(title, width=int(fig_width * 8)), fontsize=12, fontweight="bold")
    quick = ", --quick" if results.get("quick") else ""
    ax.set_title(
        f"{machine_line(results, short=True)}; {results.get('started', '')[:10]}{quick}", fontsize=9, color="0.3"
    )
    handles, _ = ax.get_legend_handles_labels()
    ax.legend(
        handles=[*handles, *legend_only],
        loc="upper center",
        bbox_to_anchor=(0.5, -0.14),
        ncols=min(n + 1, 4),
        fontsize=8,
        frameon=False,
    )
    if refused:
        fig.text(
            0.99,
            0.01,
            f"\u2717 {h.DOES_NOT_LEARN}: no speed-up drawn (its first steps did not learn as stock's)",
            fontsize=7,
            color="tab:red",
            ha="right",
        )
    if any(suspect(r) for r in rows):
        fig.text(
            0.01,
            0.01,
            f"{SUSPECT_MARK} suspect: other processes took the cores while it (or stock) was timed, or its samples "
            "spread wider than the effect",
            fontsize=7,
            color="0.35",
        )
    fig.tight_layout()
    return fig


def render(results: dict[str, Any], json_path: Path, benches: dict[str, Bench]) -> list[Path]:
    """Write the Markdown summary and the charts beside ``json_path``; return what was written."""
    written: list[Path] = []
    charts: dict[str, str] = {}
    stem = json_path.with_suffix("").name
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("matplotlib is not installed: no charts (pip install matplotlib)", file=sys.stderr)
    else:
        for name, entry in results.get("benches", {}).items():
            if entry.get("status") != "ok":
                continue
            png = json_path.parent / f"{stem}-{name}.png"
            if chart(results, name, bench_meta(name, benches), png):
                charts[name] = png.name
                written.append(png)
    md_path = json_path.with_suffix(".md")
    md_path.write_text(markdown(results, benches, charts))
    return [md_path, *written]


# --- command line --------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None, benches: dict[str, Bench] | None = None) -> int:
    benches = BENCHES if benches is None else benches
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="every bench's quick mode: a few minutes in all")
    parser.add_argument("--only", help=f"comma-separated, of {', '.join(benches)} (default: all that exist)")
    parser.add_argument(
        "--ipex-python", help="interpreter with intel-extension-for-pytorch, for train_step's ipex variant"
    )
    parser.add_argument(
        "--out", default=str(BENCH_DIR / "results"), help="directory for the results and logs (default: bench/results)"
    )
    parser.add_argument("--timeout", type=float, help="stop a bench that runs longer than this many seconds (failed)")
    parser.add_argument(
        "--render", metavar="JSON", help="re-render the Markdown and charts of this results file; runs nothing"
    )
    parser.add_argument("--readme", action="store_true", help="print a compact Markdown table for the project README")
    args = parser.parse_args(argv)
    if args.only is not None:
        args.only = h.parse_names(args.only, benches, "--only", parser)
    if args.render:
        path = Path(args.render)
        try:
            results = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            parser.error(f"--render: cannot read {path}: {exc}")
        written = render(results, path, benches)
        for p in written:
            print(f"wrote {display_path(p)}", file=sys.stderr)
        if args.readme:
            print(readme_table(results, benches))
        return 0
    return run(args, argv, benches)


if __name__ == "__main__":
    sys.exit(main())
