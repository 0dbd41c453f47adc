"""train_step's parent process: one persistent worker per variant, spoken to in rounds, and the
results of one model.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import tempfile
import time
from typing import Any

import harness as h

from families.train_step.models import SHAPES, describe, unit
from families.train_step.roof import ROOF_N, with_roof
from families.train_step.summary import summarise
from families.train_step.variants import (
    BROKEN,
    BY_HAND_VARIANTS,
    COMPILE,
    COMPILE_EXTRA_WARMUP,
    LIGHTNING_VARIANTS,
    PATCH_OPTIONS,
    SETTLE_S,
    variant_env,
)

#: a variant the time budget (--until) left no set-up or no round for
NOT_RUN_STATUS = "not run"
#: the script a worker runs (with --worker): bench/train_step.py
SCRIPT = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "train_step.py"))


class WorkerFailed(Exception):
    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.detail = detail


class Worker:
    """One variant's persistent process, spoken to in JSON lines over its stdin/stdout."""

    def __init__(self, variant: str, python: str, env: dict[str, str], timeout: float) -> None:
        self.variant, self.timeout = variant, timeout
        self.stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [python, SCRIPT, "--worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            env=env,
            text=True,
        )

    def request(self, payload: dict[str, Any]) -> dict[str, Any]:
        try:
            assert self.proc.stdin is not None and self.proc.stdout is not None
            self.proc.stdin.write(json.dumps(payload) + "\n")
            self.proc.stdin.flush()
            ready, _, _ = select.select([self.proc.stdout], [], [], self.timeout)
            if not ready:
                self.proc.kill()
                raise WorkerFailed(f"no answer within {self.timeout:.0f} s (killed)", self.stderr_tail())
            line = self.proc.stdout.readline()
        except (BrokenPipeError, OSError):
            line = ""
        if not line:
            raise WorkerFailed(self.exit_reason(), self.stderr_tail())
        try:
            reply = json.loads(line)
        except ValueError:
            raise WorkerFailed(f"answered something else than JSON: {line[:200]!r}", self.stderr_tail()) from None
        if "error" in reply:
            raise WorkerFailed(reply["error"], reply.get("traceback", ""))
        return reply

    def exit_reason(self) -> str:
        try:
            code = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            return "stopped answering"
        if code < 0:
            name = signal.Signals(-code).name
            hint = " (out of memory? the kernel's OOM killer sends SIGKILL)" if -code == signal.SIGKILL else ""
            reason = f"killed by {name}{hint}"
        else:
            reason = f"exited with status {code}"
        last = [line for line in self.stderr_tail().splitlines() if line.strip()]
        return f"{reason}: {last[-1].strip()}" if last else reason

    def stderr_tail(self, lines: int = 25) -> str:
        self.stderr.seek(0)
        text = self.stderr.read().decode(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(json.dumps({"cmd": "exit"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass
        self.stderr.close()


def failed(error: str, detail: str = "") -> dict[str, Any]:
    return {"status": "failed", "error": error, "detail": detail, "samples": []}


def run_model(
    model: str, variants: list[str], pythons: dict[str, str], skipped: dict[str, str], args, env, log, first=False
):
    """Start every variant's worker for ``model`` (one after another), then run the rounds.
    ``pythons``: variant -> interpreter; ``skipped``: variant -> why it does not run. Under
    ``--until`` a set-up, sample, roof or profile is asked for only where it is expected to end in
    time (by the variant's last request, else the mean of the model's requests so far); with
    ``first`` (the run's first model), the first set-up is asked for whatever the time."""
    shape = SHAPES[args.quick]
    started = time.perf_counter()
    results: dict[str, dict[str, Any]] = {}
    workers: dict[str, Worker] = {}
    rounds: list[dict[str, Any]] = []
    counter: str | None = None  # the worker that counts the model's FLOPs and measures the roof
    roof: dict[str, float] | None = None
    took: dict[str, float] = {}  # each variant's last request (its set-up, then its samples), seconds

    def fits(variant: str) -> bool:  # --until: a request expected to end in time
        if first and not took:
            return True
        return h.fits(args.until, SETTLE_S + h.expected_s(took, variant))

    try:
        for variant in variants:
            if variant in skipped:
                results[variant] = {"status": "skipped", "error": skipped[variant], "samples": []}
                continue
            if not fits(variant):
                log(f"{model}: {variant} not started: the time budget (--until) ends before it")
                results[variant] = {"status": NOT_RUN_STATUS, "error": h.NOT_RUN, "samples": []}
                continue
            python = pythons[variant]
            warmup = args.warmup + (COMPILE_EXTRA_WARMUP if variant == COMPILE else 0)
            log(f"{model}: starting {variant} ({python}), {warmup} warm-up step(s)")
            worker = Worker(variant, python, variant_env(variant, env, model), args.timeout)
            request = {
                "cmd": "setup",
                "model": model,
                "shape": shape,
                "warmup": warmup,
                "learn": args.learning_steps,
                "by_hand": variant in BY_HAND_VARIANTS,
                "lightning": variant in LIGHTNING_VARIANTS,
                "broken": variant == BROKEN,
                "count_flops": counter is None and variant not in LIGHTNING_VARIANTS,
            }
            try:
                asked = time.time()
                setup = worker.request({**request, "patch": PATCH_OPTIONS[variant]})
                took[variant] = time.time() - asked
            except WorkerFailed as exc:
                log(f"{model}: {variant} failed: {exc}")
                results[variant] = failed(str(exc), exc.detail)
                worker.close()
                continue
            workers[variant] = worker
            results[variant] = {"status": "ok", "setup": setup, "samples": []}
            if request["count_flops"]:
                counter = variant
        for index in range(args.rounds):
            live = [v for v in variants if v in workers]
            if not live:
                break
            order = h.rotated(live, index)
            rounds.append({"order": order, "loadavg": h.load_average()})
            log(f"{model}: round {index + 1}/{args.rounds}: {', '.join(order)}")
            for variant in order:
                if index > 0 and not fits(variant):  # (a set-up's time is no sample's: round 1 runs all)
                    rounds[-1].setdefault("skipped", []).append(variant)
                    log(f"{model}: {variant} not run in round {index + 1}: the time budget (--until) ends before it")
                    continue
                time.sleep(SETTLE_S)
                try:
                    meter = h.LoadMeter()
                    asked = time.time()
                    sample = workers[variant].request({"cmd": "run", "steps": args.steps})
                    took[variant] = time.time() - asked
                    sample["other_load"] = meter.other_load(sample["request_cpu_s"])
                except WorkerFailed as exc:
                    log(f"{model}: {variant} failed: {exc}")
                    done = results[variant]["samples"]
                    results[variant] = {**failed(str(exc), exc.detail), "setup": results[variant]["setup"]}
                    results[variant]["samples_before_failure"] = done
                    workers.pop(variant).close()
                    continue
                sample["round"] = index
                results[variant]["samples"].append(sample)
        if counter in workers and not h.fits(args.until, 0):
            log(f"{model}: the matmul roof is not measured: the time budget (--until) has ended")
        elif counter in workers:
            time.sleep(SETTLE_S)
            log(f"{model}: measuring the matmul roof in {counter}'s worker")
            try:
                roof = workers[counter].request({"cmd": "roof"})["matmul_flops"]
            except WorkerFailed as exc:
                log(f"{model}: the roof could not be measured: {exc}")
                workers.pop(counter).close()
        if args.profile:
            for variant in [v for v in variants if v in workers]:
                step_s = took[variant] / args.steps if results[variant]["samples"] else took.get(variant, 0.0)
                if not h.fits(args.until, SETTLE_S + 2 * step_s * args.profile):
                    log(f"{model}: {variant} not profiled: the time budget (--until) ends before it")
                    results[variant]["profile"] = {"error": h.NOT_RUN}
                    continue
                time.sleep(SETTLE_S)
                log(f"{model}: profiling {variant}, {args.profile} step(s)")
                try:
                    meter = h.LoadMeter()
                    profile = workers[variant].request({"cmd": "profile", "steps": args.profile})
                    profile["other_load"] = meter.other_load(profile["request_cpu_s"])
                    results[variant]["profile"] = profile
                except WorkerFailed as exc:  # the rates stand; the profile is missing
                    log(f"{model}: {variant} failed while profiled: {exc}")
                    results[variant]["profile"] = {"error": str(exc), "detail": exc.detail}
                    workers.pop(variant).close()
    finally:
        for worker in workers.values():
            worker.close()
    for variant, result in results.items():  # set up, but the budget left no round for it
        if result["status"] == "ok" and not result["samples"]:
            results[variant] = {**result, "status": NOT_RUN_STATUS, "error": h.NOT_RUN}
    flops = results[counter]["setup"]["observed"].get("flops_per_sample") if counter in results else None
    return {
        "description": describe(model, shape),
        "unit": unit(model),
        "shape": shape,
        "rounds": rounds,
        "roof": {"matmul_flops": roof, "n": ROOF_N, "measured_in": counter, "flops_per_sample": flops},
        "seconds": time.perf_counter() - started,
    }, with_roof(summarise(model, results, args.steps), roof, flops)
