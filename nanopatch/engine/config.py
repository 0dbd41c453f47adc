"""Options: explicit arguments beat ``NANOPATCH_*`` environment variables beat auto-detection.

Each option is defined once, in :data:`TABLE` (name, kind, default or detector, what it does,
the docs' default text): :class:`Config`'s fields, ``patch_torch``'s docstring, the runner's flags
and ``--help``, ``status()``/``--info`` and docs/runner.md's options table (:func:`markdown_table`,
kept equal by a test) all come from it.

Every option of :func:`nanopatch.patch_torch` can also be given as an environment variable
``NANOPATCH_<NAME>`` (``NANOPATCH_BF16=0``, ``NANOPATCH_COMPILE=max-autotune``), so processes
started by the runner, DataLoader workers started by spawn and cluster jobs see the same
settings. Auto-detection never imports torch: it reads CPU flags and package metadata.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from typing import Any

from nanopatch.foundation import cpu
from nanopatch.foundation.log import log_once, warn_once

ENV_PREFIX = "NANOPATCH_"

#: torch.compile modes the ``compile`` option accepts (``True`` means ``"default"``).
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
#: ``compile="auto"``: the model runs eagerly, and is compiled (torch.compile's default mode) only
#: where a measurement on the run's own steps finds that it pays (see
#: the training target's compile_choice)
COMPILE_AUTO = "auto"

#: what each kind of option accepts, as docs/runner.md's table says it
KINDS_MARKDOWN = {
    "bool": "true / false",
    "tristate": "true / false / auto",
    "compile": "false / true / `auto` (compiled where the run's steps measure it faster) / "
    + ", ".join(f"`{mode}`" for mode in COMPILE_MODES),
}


@dataclasses.dataclass(frozen=True)
class Option:
    """One option of ``patch_torch`` (and of the runner, and ``NANOPATCH_<NAME>``)."""

    name: str
    kind: str  # "bool" (on/off), "tristate" (on/off/auto), "compile" (off/on/mode/auto)
    help: str  # what it does, one clause: patch_torch's docstring, the runner's --help
    default_doc: str  # docs/runner.md's "default" cell: the default, and what it means
    default: Any = False  # the value when nothing chooses one (unused where ``detect`` is set)
    detect: Callable[[], tuple[bool, str]] | None = None  # auto-detection: (value, reason)
    flag: bool = True  # the runner takes --NAME/--no-NAME (data_parallel is set by --nproc)

    @property
    def env(self) -> str:
        return env_name(self.name)

    @property
    def flag_name(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def default_word(self) -> str:
        """``auto``, ``on`` or ``off``, as ``--help`` says it."""
        if self.detect is not None:
            return "auto"
        return "on" if self.default else "off"

    def markdown_row(self) -> str:
        if not self.flag:
            names = f"`{self.name}` (set by `--nproc`)"
        elif self.kind == "compile":
            names = f"`{self.name}` / `{self.flag_name}[=MODE]`, `--no-{self.flag_name[2:]}`"
        else:
            names = f"`{self.name}` / `--[no-]{self.flag_name[2:]}`"
        return f"| {names} | `{self.env}` | {KINDS_MARKDOWN[self.kind]} | {self.default_doc} |"


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
_AUTO = "auto"


def env_name(option: str) -> str:
    return ENV_PREFIX + option.upper()


def allowed_values(option: str) -> str:
    kind = BY_NAME[option].kind
    if kind == "bool":
        return "true/false (or 1/0, yes/no, on/off)"
    if kind == "tristate":
        return "true/false (or 1/0, yes/no, on/off), or auto/None"
    return "false, true, auto (compile where it measures faster), or a torch.compile mode: " + ", ".join(COMPILE_MODES)


def _bad(option: str, value: object, where: str) -> ValueError:
    return ValueError(f"nanopatch option {option!r}{where}: {value!r} is not allowed; use {allowed_values(option)}")


def parse_value(option: str, value: object, where: str = "") -> Any:
    """Normalise one option value; ``None`` means auto. Raises ValueError naming the option."""
    kind = BY_NAME[option].kind
    given = value
    if isinstance(value, str):
        text = value.strip().lower()
        if text in _TRUE:
            value = True
        elif text in _FALSE:
            value = False
        elif kind == "compile" and (text in COMPILE_MODES or text == COMPILE_AUTO):
            return text
        elif text in (_AUTO, "none", ""):
            value = None
        else:
            raise _bad(option, given, where)
    if value is None:
        if kind == "tristate":
            return None
        raise _bad(option, given, where)
    if not isinstance(value, bool):
        raise _bad(option, given, where)
    if kind == "compile":
        return "default" if value else False
    return value


@dataclasses.dataclass(frozen=True)
class Config:
    """A fully resolved set of options, with where each value came from and why. Its fields are
    :data:`TABLE`'s options, in its order (a test keeps them equal); what each means is there."""

    vision: bool
    training: bool
    bf16: bool
    bf16_eval: bool
    channels_last: bool
    ipex: bool
    compile: str | bool
    fast_decode: bool
    data_parallel: bool
    auto_lr: bool
    fast_dropout: bool
    malloc_reuse: bool
    cuda_to_cpu: bool
    breakdown: bool
    sources: Mapping[str, str] = dataclasses.field(compare=False)
    reasons: Mapping[str, str] = dataclasses.field(compare=False)

    def values(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in OPTIONS}

    def as_dict(self) -> dict[str, dict[str, Any]]:
        """Plain dict for ``status()``: each option's value, source and reason."""
        return {
            name: {
                "value": getattr(self, name),
                "source": self.sources[name],
                "reason": self.reasons[name],
            }
            for name in OPTIONS
        }

    def explicit_environ(self) -> dict[str, str]:
        """``NANOPATCH_*`` variables for the options chosen explicitly (argument or
        environment), so child processes resolve the same values; auto choices stay auto
        and children work them out (with their reasons) themselves."""
        env = {}
        for name in OPTIONS:
            if self.sources[name] in ("argument", "environment"):
                value = getattr(self, name)
                env[env_name(name)] = value if isinstance(value, str) else str(int(value))
        return env


def resolve(options: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None) -> Config:
    """Resolve every option: arguments > ``NANOPATCH_*`` environment > auto-detection.

    ``options`` values of ``None`` mean "not given" (auto). Unknown option names raise
    TypeError, like an unexpected keyword argument; bad values raise ValueError.
    """
    options = dict(options or {})
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise TypeError(f"unknown nanopatch option(s): {', '.join(unknown)}; known: {', '.join(OPTIONS)}")
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    reasons: dict[str, str] = {}
    for name in OPTIONS:
        given = options.get(name)
        value = parse_value(name, given) if given is not None else None
        if value is not None:
            sources[name], reasons[name] = "argument", f"set by patch_torch({name}=...)"
        else:
            var = env_name(name)
            raw = environ.get(var)
            if raw is not None and raw.strip():  # an empty variable counts as unset
                value = parse_value(name, raw, f" (from {var})")
                if value is not None:
                    sources[name], reasons[name] = "environment", f"set by {var}={raw}"
        if value is None:
            option = BY_NAME[name]
            if option.detect is None:
                value = option.default
                sources[name], reasons[name] = "default", "default"
            else:
                value, reasons[name] = option.detect()
                sources[name] = "auto"
        values[name] = value
    _check_explicit_choices(values, sources, reasons)
    return Config(**values, sources=sources, reasons=reasons)


def _check_explicit_choices(values: dict[str, Any], sources: dict[str, str], reasons: dict[str, str]) -> None:
    """An explicit choice the machine cannot honour well is the user's to fix: say so once."""
    if values["ipex"] and sources["ipex"] != "auto":
        ok, why = ipex_compatibility()
        if not ok:
            values["ipex"] = False
            reasons["ipex"] = f"{reasons['ipex']}, but {why}: IPEX stays off"
            warn_once("explicit-ipex", f"ipex was requested, but {why}; training runs without IPEX")
    if values["bf16"] and sources["bf16"] != "auto":
        facts = cpu.host_facts()
        if not facts.native_bf16:
            reasons["bf16"] = f"{reasons['bf16']}, although {facts.bf16_reason}"
            warn_once(
                "explicit-bf16",
                f"bf16 was requested, but {facts.bf16_reason}; "
                "bf16 autocast is on as asked, and likely slower than fp32 here",
            )


# --- auto-detection -------------------------------------------------------------------


def _auto_bf16() -> tuple[bool, str]:
    facts = cpu.host_facts()
    if not facts.native_bf16:
        log_once("auto-bf16-off", "bf16 autocast stays off: %s", facts.bf16_reason)
    return facts.native_bf16, facts.bf16_reason


def _auto_channels_last() -> tuple[bool, str]:
    facts = cpu.host_facts()
    if facts.avx2:
        return True, (
            "x86 CPU with AVX2: oneDNN's fastest convolution kernels use channels-last; "
            "applied only to models with 2-D/3-D convolutions, and kept only where a model's first steps "
            "measure it faster than stock's layout"
        )
    return False, "no AVX2 on this CPU: oneDNN channels-last kernels give no gain here"


def distribution_version(name: str) -> str | None:
    """Installed version of a distribution, from metadata (never imports it)."""
    import importlib.metadata  # imported only when a version is really needed (import cost)

    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _major_minor(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split("+")[0].split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


#: the newest IPEX (major, minor) whose import needs transformers < 5 when transformers is installed
IPEX_WITH_TRANSFORMERS_4 = (2, 8)


def ipex_compatibility() -> tuple[bool, str]:
    """Whether IPEX is installed and built for the installed torch, judged from package
    metadata only: importing a mismatched IPEX terminates the interpreter."""
    ipex = distribution_version("intel-extension-for-pytorch")
    if ipex is None:
        return False, "intel-extension-for-pytorch is not installed"
    torch = distribution_version("torch")
    if torch is None:
        return False, f"intel-extension-for-pytorch {ipex} is installed but torch is not"
    if _major_minor(ipex) != _major_minor(torch):
        return False, (
            f"intel-extension-for-pytorch {ipex} needs torch "
            f"{'.'.join(map(str, _major_minor(ipex)))}.*, but torch {torch} is installed"
        )
    transformers = distribution_version("transformers")
    if (
        transformers is not None
        and _major_minor(ipex) <= IPEX_WITH_TRANSFORMERS_4
        and _major_minor(transformers) >= (5, 0)
    ):
        # its import reaches transformers' attention-mask helpers, gone in 5.x, and dies halfway
        # (after registering its operators): not something to import
        return False, (
            f"intel-extension-for-pytorch {ipex} cannot be imported next to transformers {transformers} "
            "(it needs transformers < 5)"
        )
    return True, f"intel-extension-for-pytorch {ipex} matches torch {torch}"


def _auto_ipex() -> tuple[bool, str]:
    ok, reason = ipex_compatibility()
    if not ok:
        log_once("auto-ipex-off", "IPEX off: %s", reason)
    return ok, reason


#: Every option, once, in the order status(), --info and the docs list them.
TABLE: tuple[Option, ...] = (
    Option(
        "vision",
        "bool",
        "torchvision's decoding, datasets and transforms on libjpeg-turbo and OpenCV",
        "on",
        default=True,
    ),
    Option(
        "training",
        "bool",
        "accelerate the model and optimizer the script trains (each change kept where it measures faster)",
        "on",
        default=True,
    ),
    Option(
        "bf16",
        "tristate",
        "bf16 autocast for the trained model",
        "auto: on only with native bf16 (`avx512_bf16` or `amx_bf16`), and kept for a model only where its "
        "first steps measure bf16 not slower than fp32 (an explicit true is not measured)",
        detect=_auto_bf16,
    ),
    Option(
        "bf16_eval",
        "bool",
        "keep bf16 autocast when a paired model runs in eval mode",
        "on: a paired model keeps bf16 autocast in eval mode",
        default=True,
    ),
    Option(
        "channels_last",
        "tristate",
        "channels-last memory format for models with 2-D/3-D convolutions",
        "auto: on for x86 CPUs with AVX2, kept for a model only where its first steps measure it faster "
        "than stock's layout",
        detect=_auto_channels_last,
    ),
    Option(
        "ipex",
        "tristate",
        "intel-extension-for-pytorch's optimize() for the trained model and optimizer",
        "auto: on when intel-extension-for-pytorch is installed and built for the installed torch",
        detect=_auto_ipex,
    ),
    Option(
        "compile",
        "compile",
        "torch.compile the model forward: a mode, or auto to compile only where the run's own steps measure it faster",
        "off",
    ),
    Option(
        "fast_decode",
        "bool",
        "let a pipeline decode JPEGs DCT-scaled (a known, small pixel difference)",
        "on: a patched pipeline that starts with `Resize` or `RandomResizedCrop` decodes a dataset's JPEG at "
        "the smallest DCT scale that still covers its output (see [fast decode](what-is-patched.md#transforms-vision))",
        default=True,
    ),
    Option(
        "data_parallel",
        "bool",
        "data-parallel over torch.distributed (on in the processes --nproc starts)",
        "off; on in the processes `--nproc` starts",
        flag=False,
    ),
    Option(
        "auto_lr",
        "bool",
        "scale the learning rate by the world size, with a warm-up, when data-parallel",
        "on: with `--nproc`, scale the learning rate by the number of processes, with a warm-up",
        default=True,
    ),
    Option(
        "fast_dropout",
        "bool",
        "dropout masks in an accelerated training forward from a faster generator",
        "on: dropout masks in an accelerated training forward drawn four per 64-bit random value (same "
        "distribution to 1/65536, not stock's random stream)",
        default=True,
    ),
    Option(
        "malloc_reuse",
        "bool",
        "glibc malloc keeps freed memory for reuse (no other allocator loaded)",
        "on: on glibc's malloc (no other allocator loaded, nothing tuned by the user), freed memory is kept "
        "for reuse; the process keeps its peak memory",
        default=True,
    ),
    Option(
        "cuda_to_cpu",
        "bool",
        "a script written for a CUDA GPU runs on the CPU (its CUDA calls redirected)",
        "off: on, a script written for a CUDA GPU runs on the CPU (see [cuda-to-cpu.md](cuda-to-cpu.md))",
    ),
    Option(
        "breakdown",
        "bool",
        "time the run (waiting for data, forward + backward, the optimizer step, the rest) and advise",
        "off, and on under `--compare` and `-v`: time the run (waiting for data, forward + backward, the "
        "optimizer step, the rest) and advise (see "
        "[where the time goes](checking.md#where-the-time-goes---compare--v-breakdown))",
    ),
)
BY_NAME: dict[str, Option] = {option.name: option for option in TABLE}
#: option name -> kind ("bool", "tristate" or "compile"), in the table's order
OPTIONS: dict[str, str] = {option.name: option.kind for option in TABLE}


def markdown_table() -> str:
    """docs/runner.md's options table (a test keeps the two equal; print this to update it)."""
    head = ["| option (`patch_torch` / runner) | environment | values | default |", "|---|---|---|---|"]
    return "\n".join(head + [option.markdown_row() for option in TABLE])


def docstring_lines() -> str:
    """One line per option, as ``patch_torch``'s docstring lists them."""
    return "\n".join(f"    {option.name} ({option.default_word}): {option.help}" for option in TABLE)
