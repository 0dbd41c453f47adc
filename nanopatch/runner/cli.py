"""``python -m nanopatch [options] (script.py | -m module) [args...]``: run a script patched.

The runner parses only the options *before* the script (or ``-m module``); everything after
belongs to the script, which runs as ``__main__`` with ``sys.argv`` as it would under plain
``python``. Its exit code and exceptions propagate unchanged. Options chosen here are
exported as ``NANOPATCH_*`` and a bootstrap directory goes on ``PYTHONPATH``, so Python child
processes (DataLoader workers started by spawn or forkserver, subprocesses) are patched too.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from nanopatch import __version__
from nanopatch.engine import config
from nanopatch.foundation import argv as words
from nanopatch.foundation.log import configure_stderr
from nanopatch.runtime import launch
from nanopatch.runtime import tuning as runtime

from ._bootstrap import BOOTSTRAP_DIR, LOG_LEVEL_VARIABLE, PREFIX_VARIABLE
from ._scripts import NoModule, run_module, run_script
from .verify import DEFAULT_STEPS

USAGE = (
    "python -m nanopatch [options] script.py [args ...]\n"
    "       python -m nanopatch [options] -m module [args ...]\n"
    "       python -m nanopatch --nproc N [options] script.py [args ...]\n"
    "       python -m nanopatch --compare [options] script.py [args ...]\n"
    "       python -m nanopatch --verify [N] [options] script.py [args ...]\n"
    "       python -m nanopatch --info [--json]\n"
    '       eval "$(python -m nanopatch --init [--no-pin-threads] [--allocator NAME])"'
)


class _UsageError(Exception):
    """Bad runner arguments: exit code 2, as argparse uses."""


def _compile_mode(text: str) -> Any:
    try:
        return config.parse_value("compile", text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m nanopatch",
        usage=USAGE,
        description="Run a PyTorch training script with nanopatch's CPU accelerations applied. "
        "Options not given fall back to NANOPATCH_<OPTION> environment variables, then to "
        "auto-detection.",
        epilog="Options go before the script; everything after the script belongs to it. "
        + launch.multi_node_help()
        + ".",
        allow_abbrev=False,
    )
    patches = parser.add_argument_group("patches (same names as nanopatch.patch_torch)")
    for option in config.TABLE:
        if option.flag:
            _add_option(patches, option)
    launch.add_options(parser)
    _add_check_options(parser)
    parser.add_argument("--info", action="store_true", help="print the capability report and exit")
    parser.add_argument(
        "--init",
        action="store_true",
        help="print the runtime tuning (threads, OpenMP affinity, allocator) as shell export lines and exit: "
        'eval "$(python -m nanopatch --init)" sets a shell or notebook launcher up as the runner would '
        "(replaces BigDL-Nano's source bigdl-nano-init)",
    )
    parser.add_argument("--json", action="store_true", help="with --info: print it as JSON")
    parser.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help=f"log what nanopatch does to stderr (-vv for debug); env {LOG_LEVEL_VARIABLE}",
    )
    parser.add_argument("--version", action="version", version=f"nanopatch {__version__}")
    return parser


def _add_check_options(parser: argparse.ArgumentParser) -> None:
    """--compare (with --try-compile and --plot) and --verify [N]."""
    parser.add_argument(
        "--compare",
        action="store_true",
        help="run the script twice, stock then patched (same arguments), and print a side-by-side table "
        "of wall time, images/s, final loss and accuracy, where each run's time went, and advice",
    )
    parser.add_argument(
        "--try-compile",
        action="store_true",
        help="with --compare: a third run patched with --compile, and whether torch.compile trained faster",
    )
    parser.add_argument(
        "--plot",
        metavar="FILE.png",
        help="with --compare: draw where each run's time went as a stacked bar chart (needs matplotlib)",
    )
    parser.add_argument(
        "--verify",
        nargs="?",
        const=DEFAULT_STEPS,
        default=None,
        type=launch._positive,
        metavar="N",
        help=f"run the script for N optimizer steps (default {DEFAULT_STEPS}) stock and patched from one seed, print "
        "per step the losses, the parameters that got a gradient in one run only and the largest parameter drift, "
        "and whether the patched run learns as stock; exit status 0 if it does, 1 if not, 3 if a run failed",
    )


def _add_option(group: argparse._ArgumentGroup, option: config.Option) -> None:
    """The runner's flags of one option of config.TABLE, with its help."""
    if option.kind == "compile":
        group.add_argument(
            option.flag_name,
            nargs="?",
            const="default",
            default=None,
            type=_compile_mode,
            metavar="MODE",
            help=f"{option.help}; write the mode as {option.flag_name}=MODE ({', '.join(config.COMPILE_MODES)}, "
            f"auto) (default: {option.default_word}; env {option.env})",
        )
        group.add_argument("--no-" + option.flag_name[2:], dest=option.name, action="store_false")
    else:
        group.add_argument(
            option.flag_name,
            action=argparse.BooleanOptionalAction,
            default=None,
            help=f"{option.help} (default: {option.default_word}; env {option.env})",
        )


def split_argv(
    parser: argparse.ArgumentParser, argv: Sequence[str]
) -> tuple[list[str], str | None, str | None, list[str]]:
    """Split ``argv`` into (runner options, kind, target, script args).

    ``kind`` is "script" or "module" (None when there is no target). The first word that is
    not an option, or ``-m MODULE``, ends the runner's options, as with ``python`` itself."""
    argv = list(argv)
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            if i + 1 >= len(argv):
                break
            return argv[:i], "script", argv[i + 1], argv[i + 2 :]
        if word == "-m":
            if i + 1 >= len(argv):
                raise _UsageError("argument -m: expected a module name")
            return argv[:i], "module", argv[i + 1], argv[i + 2 :]
        if word.startswith("-m") and not word.startswith("--"):
            return argv[:i], "module", word[2:], argv[i + 1 :]
        if word.startswith("-") and word != "-":
            action = parser._option_string_actions.get(word.split("=", 1)[0])
            takes_next = action is not None and "=" not in word and action.nargs not in (0, "?", "*")
            if action is not None and action.dest == "verify" and "=" not in word:  # --verify [N]
                takes_next = i + 1 < len(argv) and argv[i + 1].isdigit()
            i += 2 if takes_next else 1
            continue
        return argv[:i], "script", word, argv[i + 1 :]
    return argv, None, None, []


def export_environment(cfg: config.Config, log_level: str | None) -> None:
    """Make Python child processes start patched with the same explicit options."""
    os.environ.update(cfg.explicit_environ())
    os.environ[PREFIX_VARIABLE] = sys.prefix  # the bootstrap leaves Pythons of other environments alone
    if log_level:
        os.environ[LOG_LEVEL_VARIABLE] = log_level
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if BOOTSTRAP_DIR not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([BOOTSTRAP_DIR, *paths])


def parse(
    parser: argparse.ArgumentParser, argv: Sequence[str]
) -> tuple[list[str], argparse.Namespace, str | None, str | None, list[str]]:
    """Read a command line as the runner does, running nothing: (runner options as given, the
    parsed options, kind, target, script args). A usage error (an unknown option, a bad value,
    options that do not go together) exits with status 2 and argparse's message, as ``main``
    would. Whether the script exists, and the values ``NANOPATCH_*`` variables give, are checked
    by ``main`` when it runs."""
    try:
        own, kind, target, script_args = split_argv(parser, argv)
    except _UsageError as exc:
        parser.error(str(exc))
    opts = parser.parse_args(own)
    if opts.info:
        return own, opts, kind, target, script_args
    if opts.init:
        if target is not None or launch.wants_launch(opts) or not opts.tune:
            parser.error("--init takes no script, no --nproc/--cpus and no --no-tune: it prints one process's tuning")
        return own, opts, kind, target, script_args
    if opts.json:
        parser.error("--json goes with --info")
    if opts.plot and not opts.compare:
        parser.error("--plot goes with --compare")
    if opts.try_compile and (not opts.compare or opts.compile):
        parser.error("--try-compile goes with --compare, and without --compile (it tries both)")
    if opts.nproc == "measure" and not _on_this_machine(opts):
        parser.error(
            "--nproc measure chooses the count on this machine: it goes with no --cpus, --cores-per-proc "
            "or multi-node option"
        )
    if target is not None and opts.verify is not None and (opts.compare or launch.wants_launch(opts)):
        parser.error("--verify runs the script in one process at a time: it goes with neither --compare nor --nproc")
    return own, opts, kind, target, script_args


def main(argv: Sequence[str] | None = None) -> int:
    """The runner: read the command line, then do what its mode says (``--info``, ``--init``,
    ``--verify``, ``--compare``, or run the script, in one process or ``--nproc`` of them)."""
    parser = build_parser()
    may_reexec = argv is None  # a real command line, which can be executed again
    argv = sys.argv[1:] if argv is None else argv
    own, opts, kind, target, script_args = parse(parser, argv)
    log_level = _set_up_logging(opts)
    options = {name: getattr(opts, name, None) for name in config.OPTIONS if getattr(opts, name, None) is not None}
    if opts.info:
        return _print_info(parser, opts, options)
    if opts.init:
        return _print_init(parser, opts)
    if target is None:
        parser.print_usage(sys.stderr)
        print("python -m nanopatch: error: no script or -m module to run", file=sys.stderr)
        return 2
    if kind == "script" and not os.path.exists(target):
        print(
            f"python -m nanopatch: error: can't open file {os.path.abspath(target)!r}: No such file or directory",
            file=sys.stderr,
        )
        return 2
    target_argv = ["-m", target, *script_args] if kind == "module" else [target, *script_args]
    if opts.verify is not None or opts.compare:
        return _check(parser, opts, own, target_argv, options)
    _choose_processes(opts, own, target_argv)
    launching = _tune(parser, opts, may_reexec)
    try:
        cfg = config.resolve(options)
    except ValueError as exc:  # a bad NANOPATCH_* value
        parser.error(str(exc))
    export_environment(cfg, log_level)
    if launching:
        return launch.launch(opts, target_argv)

    import nanopatch

    nanopatch.patch_torch(**options)
    if opts.rank_worker:
        return _run_rank(kind, target, script_args)
    return _run_target(kind, target, script_args)


def _set_up_logging(opts: argparse.Namespace) -> str | None:
    """Logging to stderr at -v/-vv (or NANOPATCH_LOG_LEVEL); -v also times the run (the
    breakdown) unless the breakdown option is given. Returns the level for child processes."""
    log_level = os.environ.get(LOG_LEVEL_VARIABLE)
    if opts.verbose:
        log_level = "DEBUG" if opts.verbose > 1 else "INFO"
    if log_level:
        configure_stderr(log_level)
    if opts.verbose and opts.breakdown is None and not os.environ.get(config.env_name("breakdown"), "").strip():
        os.environ[config.env_name("breakdown")] = "1"  # -v says where the time went
    return log_level


def _print_info(parser: argparse.ArgumentParser, opts: argparse.Namespace, options: dict[str, Any]) -> int:
    """``--info [--json]``: the capability report, with the tuning the options given would get."""
    from ._info import collect, format_table

    try:
        tuning = None
        if opts.tune:
            plan = launch.current_plan(opts)
            tuning = launch.describe_processes(opts, plan) if launch.wants_launch(opts) else plan.as_dict()
        info = collect(options, tuning)
    except ValueError as exc:  # a bad NANOPATCH_* value, or a --nproc/--cpus that does not fit
        parser.error(str(exc))
    print(json.dumps(info, indent=2, default=str) if opts.json else format_table(info))
    return 0


def _print_init(parser: argparse.ArgumentParser, opts: argparse.Namespace) -> int:
    """``--init``: one process's runtime tuning as shell export lines."""
    try:
        print(runtime.shell_exports(launch.current_plan(opts)))
    except ValueError as exc:
        parser.error(str(exc))
    return 0


def _check(
    parser: argparse.ArgumentParser,
    opts: argparse.Namespace,
    own: Sequence[str],
    target_argv: list[str],
    options: dict[str, Any],
) -> int:
    """``--verify [N]`` or ``--compare``: the script run stock and patched, side by side."""
    try:
        cuda_to_cpu = config.resolve(options).cuda_to_cpu  # the stock run needs the redirect too
    except ValueError as exc:  # a bad NANOPATCH_* value
        parser.error(str(exc))
    if opts.verify is not None:
        from .verify import verify

        return verify(own, target_argv, opts.verify, cuda_to_cpu=cuda_to_cpu)
    from .compare import compare

    return compare(
        _without_compare(own), target_argv, cuda_to_cpu=cuda_to_cpu, plot=opts.plot, try_compile=opts.try_compile
    )


def _choose_processes(opts: argparse.Namespace, own: Sequence[str], target_argv: list[str]) -> None:
    """``--nproc measure``: the count this machine trains fastest with, measured now; otherwise
    an earlier measurement of this command is recalled, for the advice, and ``--nproc auto``
    trains with the count it chose."""
    from nanopatch.runtime import measure

    if opts.nproc == "measure":
        chosen, _, _ = measure.measure(own, target_argv)
        opts.nproc = chosen if chosen > 1 else None
    elif not opts.rank_worker:
        follow = opts.nproc == "auto" and _on_this_machine(opts)
        recalled = measure.recall(own, target_argv, follow=follow)
        if follow:  # the count measure chose, else one per socket; one process runs as one, not a group of one
            count = recalled if recalled is not None else measure.per_socket()
            opts.nproc = count if count > 1 else None


def _on_this_machine(opts: argparse.Namespace) -> bool:
    """Whether the processes' count is this machine's to choose: no CPU sets, cores per process or
    multi-node options given (``--nproc measure`` needs that; ``auto`` follows its figures then)."""
    return opts.cpus is None and opts.cores_per_proc is None and not any(getattr(opts, n) for n in launch.PASSTHROUGH)


def _tune(parser: argparse.ArgumentParser, opts: argparse.Namespace, may_reexec: bool) -> bool:
    """Tune the runtime, of the launcher, of one rank or of the one process; the interpreter may
    start again here to preload an allocator, so everything after this runs once, in the final
    interpreter. Returns whether this process launches the ``--nproc`` processes."""
    launching = launch.wants_launch(opts)
    if launching:
        try:
            launch.rank_cpus(opts)
        except ValueError as exc:
            parser.error(str(exc))
        launch.tune_launcher(opts, may_reexec)
    elif opts.rank_worker:
        launch.start_worker(opts)
    else:
        launch.tune(opts, may_reexec)
    return launching


def _run_target(kind: str, target: str, script_args: Sequence[str]) -> int:
    try:
        if kind == "module":
            run_module(target, script_args)
        else:
            run_script(target, script_args)
    except NoModule as exc:
        print(f"python -m nanopatch: error: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:
        _explain(exc)
        raise
    finally:
        _report()
    return 0


def _explain(exc: Exception) -> None:
    """Add to the script's error, under its traceback, what nanopatch did that it failed on,
    where nanopatch knows (channels-last weights that ``Tensor.view`` cannot flatten, bf16
    activations that numpy cannot take); on Python 3.10, which shows no notes, said before it."""
    training = sys.modules.get("nanopatch.targets.training.patch")
    note = training.explain(exc) if training is not None else None
    if note is not None and not hasattr(exc, "add_note"):
        print(note, file=sys.stderr)


def _without_compare(own: Sequence[str]) -> list[str]:
    """The runner options of ``--compare``'s patched run: ``--compare``, ``--try-compile`` and
    ``--plot`` left out."""
    return words.without(own, valued=("--plot",), flags=("--compare", "--try-compile"))


def _report() -> None:
    """At the script's end, at ``-v``: one line of what training ran with, where the time went
    and the advice; and the whole account as JSON to ``NANOPATCH_REPORT`` when that is set
    (``--compare`` reads it), by rank 0 only in a ``--nproc`` run."""
    from .runs import write_report

    training = sys.modules.get("nanopatch.targets.training.patch")
    timing = sys.modules.get("nanopatch.targets.breakdown.patch")
    try:
        logger = logging.getLogger("nanopatch")
        if training is not None:
            lines = training.summary()
            logger.info("trained: %s", "; ".join(lines) if lines else "no optimizer stepped, nothing was accelerated")
        times = timing.describe() if timing is not None else None
        if times is not None:
            logger.info("time: %s", timing.text(times))
            for advice in times["advice"]:
                logger.info("advice: %s", advice["text"])
        write_report()
    except Exception as exc:  # the script's own outcome is what counts
        print(f"nanopatch: could not report what it accelerated: {exc}", file=sys.stderr)


def _run_rank(kind: str, target: str, script_args: Sequence[str]) -> int:
    """One process of a ``--nproc`` run: the script runs data-parallel in the process group
    set up here; an exception is recorded for torchrun's summary (which shows it with this
    rank's traceback) and ends the process with exit code 1."""
    import torch  # noqa: F401 - first, so that its import hook patches before the next line runs

    from nanopatch.targets.parallel import patch as distributed

    distributed.start()
    try:
        return _run_rank_script(kind, target, script_args)
    finally:
        launch.settle_gloo()


def _run_rank_script(kind: str, target: str, script_args: Sequence[str]) -> int:
    from nanopatch.targets.parallel import patch as distributed

    try:
        code = _run_target(kind, target, script_args)
    except SystemExit as exc:
        # ``sys.exit(main())``, the commonest last line of a script: a success tears the group
        # down as a return does (left to the interpreter's shutdown, gloo's threads can abort the
        # process: "terminate called without an active exception", SIGABRT); a failure is the
        # launcher's to report, with this exit code
        if exc.code is None or exc.code == 0:
            distributed.finish()
        else:
            launch.record_exit()
        raise
    except Exception as exc:
        launch.record_failure(exc, skip_file=__file__)
        return 1
    distributed.finish()
    return code


if __name__ == "__main__":
    sys.exit(main())
