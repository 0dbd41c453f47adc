"""What a script prints, read: its speed meter, loss and accuracy (training's and an
evaluation's), by their labels, as ``--compare`` and ``--verify`` show them. A :class:`Run` is one
run of a script: its command, exit code, time, the lines it printed, and the account a patched
run writes of itself (:mod:`nanopatch.runner.runs`)."""

from __future__ import annotations

import dataclasses
import re
from typing import NamedTuple

# Every pattern here runs on every line a script prints, so none may take more than linear time
# on any line (a line of 16,000 digits, or a label followed by 16,000 spaces, took 28 s with
# overlapping alternatives): a number starts only where no digit or point is before it, and its
# parts cannot match the same characters two ways; a separator is ``\s*(?:[:=]\s*)?``, not
# ``\s*[:=]?\s*``; a count is at most 12 digits, so ``int()`` never meets Python's 4,300-digit limit.
_NUMBER = r"(?<![\d.])[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
_COUNT = r"(?<!\d)\d{1,12}(?!\d)"
_PER_SECOND = r"(?:images|imgs|img|samples|examples)\s*/\s*s(?:ec)?\b"
#: the ways scripts print their speed, strongest first: a run's rate is read from the values of
#: the strongest kind found anywhere in its output (a training meter over a progress bar's it/s)
RATE_KINDS = (
    # "img/s: 135.2" (torchvision's references), "samples/s = 80", HF's "'train_samples_per_second': 3.2"
    # (transformers >= 5 quotes the value: "'train_samples_per_second': '3.2'")
    ("labelled", re.compile(rf"(?:{_PER_SECOND}|\btrain_samples_per_second\b)['\"]?\s*[:=]\s*['\"]?({_NUMBER})", re.I)),
    # "412.5 img/s", "1.2e3 samples/sec" (not the number before a label: "lr: 0.05  img/s: 135")
    ("labelled", re.compile(rf"({_NUMBER})\s*{_PER_SECOND}(?!['\"]?\s*[:=])", re.I)),
    # timm's "Time: 2.08s,  15.38/s  (2.08s,  15.38/s)"
    ("per second", re.compile(rf"(?:^|[\s,(])({_NUMBER})/s\b")),
    # a tqdm progress bar's batches per second (Lightning's, HF's): "5.93it/s", "2.10s/it"
    ("batches", re.compile(rf"({_NUMBER})\s*(it/s|s/it)\b")),
)
#: a word before a label that says whose figure it is: "val loss", "val_loss", "train loss"
_SCOPE = r"(?:\b(?P<scope>val|valid|validation|test|eval|evaluation|train|training)[\s_-]*|\b)"
#: between a label and its value: "loss: 2.1", "loss=2.1", "loss 2.1", and a logged dict's
#: "'loss': 2.1" or, as the HF Trainer prints it from transformers 5 on, "'loss': '2.1'"
_SEPARATOR = r"['\"]?\s*(?:[:=]\s*)?['\"]?"
_EVALUATION_SCOPES = {"val", "valid", "validation", "test", "eval", "evaluation"}
#: a line an evaluation prints: torchvision's references' "Test:", pytorch/examples' "Test set:",
#: Lightning's "Validation DataLoader 0: ..." progress bar (whose speed is not training's)
_EVALUATION_LINE = re.compile(
    r"^\W*(?:Test|Testing|Val|Valid|Validation|Validating|Eval|Evaluation|Evaluating|Predicting)\b", re.I
)
PATTERNS = {
    "loss": re.compile(rf"{_SCOPE}loss\b{_SEPARATOR}({_NUMBER})", re.I),
    # "acc@1: 71.2%", "acc1: 3.12", "accuracy=0.875", and the examples' "Accuracy: 9912/10000 (99%)"
    # and "80.00% (64/80)": a percentage with the count it is of
    "accuracy": re.compile(
        rf"{_SCOPE}acc(?:uracy)?(?:@?1)?\b{_SEPARATOR}({_NUMBER})"
        rf"\s*(?:(%)(?:\s*\(\s*{_COUNT}\s*/\s*({_COUNT})\s*\))?|/\s*({_COUNT}))?",
        re.I,
    ),
}
#: a batch counter, "[0/8]": an evaluation's line with one before its last batch shows that
#: batch's figures (torchvision's references print the first), not the whole set's
_BATCH_COUNTER = re.compile(rf"\[\s*({_COUNT})\s*/\s*({_COUNT})\s*\]")


@dataclasses.dataclass
class Run:
    name: str
    command: list[str]
    exit_code: int | None = None
    seconds: float = 0.0
    output: list[str] = dataclasses.field(default_factory=list)
    report: dict | None = None  # the patched run's account of what it accelerated
    used: set[str] = dataclasses.field(default_factory=set)  # the parts its processes used (foundation.usage)

    def rate(self) -> tuple[float, str, str] | None:
        """The script's own speed meter: (value, as shown, kind) of the strongest kind in
        :data:`RATE_KINDS` the output has; None when it has none. A meter printed several times
        gives the median of its values after the first (the first step's one-off costs), which
        a last, smaller batch or a slow moment does not sway; it is shown with their count."""
        values = self._meter()
        if not values:
            return None
        values = sorted(values[1:] if len(values) > 1 else values, key=lambda rate: rate[1])
        kind = values[0][3]
        middle = len(values) // 2
        if len(values) == 1:
            return values[0][1], values[0][2], kind
        if len(values) % 2:
            value, shown = values[middle][1], _compact(values[middle][2])
        else:
            value = (values[middle - 1][1] + values[middle][1]) / 2
            shown = f"{value:.4g}" + {"per second": "/s", "batches": " it/s"}.get(kind, "")
        return value, f"{shown} (median of {len(values)})", kind

    def rate_unit(self) -> str:
        """What the script's own meter (:meth:`rate`) counts: "samples/s" for a labelled meter
        of samples or examples (the HF Trainer's ``train_samples_per_second``), "images/s" for
        another labelled one, "batches/s" for a progress bar's, "/s" for timm's unlabelled rate."""
        values = self._meter()
        if not values:
            return "images/s"
        kind, matched = values[-1][3:]
        if kind == "labelled":
            return "samples/s" if re.search(r"sampl|exampl", matched, re.I) else "images/s"
        return "batches/s" if kind == "batches" else "/s"

    def _meter(self) -> list[tuple[int, float, str, str, str]]:
        """Every reading of the strongest kind of :data:`RATE_KINDS` in the output, in order (see
        :func:`_rate_in`); empty where there is none."""
        found = []
        for line in self.output:
            for segment in line.split("\r"):  # a progress bar redraws itself on one line
                rate = _rate_in(segment)
                if rate is not None:
                    found.append(rate)
        if not found:
            return []
        strongest = min(rate[0] for rate in found)
        return [rate for rate in found if rate[0] == strongest]

    def metric(self, key: str, validation: bool = False) -> tuple[float, str] | None:
        """The last value the script printed with this label: (value, as printed with its
        unit); with ``validation``, the last of an evaluation's (a label such as ``val loss``
        or ``eval_loss``, or a line such as ``Test: ...``), else the last of training's.
        ``"rate"``: :meth:`rate`."""
        if key == "rate":
            rate = self.rate()
            return None if rate is None else rate[:2]
        found = self.readings(key, validation)
        return (found[-1].value, found[-1].shown) if found else None

    def readings(self, key: str, validation: bool = False) -> list[Reading]:
        """Every value the script printed with this label (``"loss"`` or ``"accuracy"``), in
        order, training's or (``validation``) an evaluation's; see :meth:`metric`."""
        found = []
        for line in self.output:
            evaluation_line = bool(_EVALUATION_LINE.search(line))
            counter = _BATCH_COUNTER.search(line) if validation else None
            if counter and int(counter.group(1)) + 1 < int(counter.group(2)):
                continue  # one batch of an evaluation, not its last
            for match in PATTERNS[key].finditer(line):
                scope = (match.group("scope") or "").lower()
                if scope and "train_runtime" in line:  # the HF Trainer's summary: the run's mean loss
                    continue
                evaluation = scope in _EVALUATION_SCOPES or (evaluation_line and not scope)
                if evaluation != validation:
                    continue
                value, shown, total = float(match.group(2)), match.group(2), None
                if key == "accuracy" and match.group(3):
                    shown += "%"
                    total = int(match.group(4)) if match.group(4) else None
                elif key == "accuracy" and match.group(5):  # a count of a total
                    total = int(match.group(5))
                    value = 100.0 * value / max(total, 1)
                    shown += f"/{total} ({value:.1f}%)"
                found.append(Reading(value, shown, total))
        return found


class Reading(NamedTuple):
    """One value a script printed: the number (an accuracy in percent), as printed, and the
    number of samples it is of where the script said (``80.00% (64/80)``, ``9912/10000``)."""

    value: float
    shown: str
    total: int | None = None


def _compact(shown: str) -> str:
    """A number printed with a dozen digits (``32.14056839624901``) to four significant ones."""
    match = re.match(rf"{_NUMBER}", shown)
    if match and len(re.sub(r"\D", "", match.group())) > 6:
        return f"{float(match.group()):.4g}" + shown[match.end() :]
    return shown


#: each kind's rank in RATE_KINDS, strongest (0) first
_STRENGTH = {kind: rank for rank, kind in enumerate(dict.fromkeys(kind for kind, _ in RATE_KINDS))}


def _rate_in(text: str) -> tuple[int, float, str, str, str] | None:
    """The speed ``text`` prints, by the first of :data:`RATE_KINDS` it has: (strength, value,
    as shown, kind, the text matched)."""
    for kind, pattern in RATE_KINDS:
        if kind == "batches" and _EVALUATION_LINE.search(text):
            continue
        matches = list(pattern.finditer(text))
        if not matches:
            continue
        match = matches[-1]
        value, shown = float(match.group(1)), match.group(1)
        if kind == "batches":
            shown += f" {match.group(2)}"
            if match.group(2) == "s/it":
                value = 1.0 / value if value else 0.0
        elif kind == "per second":
            shown += "/s"
        return _STRENGTH[kind], value, shown, kind, match.group(0)
    return None
