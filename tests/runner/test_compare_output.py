"""``--compare`` reads whatever a script prints without stalling or crashing, and echoes it as it
comes: every pattern it reads lines with takes linear time (a line of 16,000 digits, or a label
followed by 16,000 spaces, took 18-28 s with overlapping alternatives), a count of more than
4,300 digits is no count (``int()`` refused it after both runs had finished), and a progress bar
that redraws itself with ``\\r`` and no newline is shown while it runs."""

from __future__ import annotations

import io
import sys
import threading
import time

import pytest

from nanopatch.runner import output, runs

#: what a line of 16,000 characters may take to read: linear work is milliseconds; the
#: quadratic patterns took 18-28 s on such lines
BUDGET_S = 2.0
N = 16_000

ADVERSARIAL = {
    "digits": "1" * N,
    "digits and points": "1." * (N // 2),
    "loss then spaces": "loss" + " " * N,
    "quoted labels and quotes": "'loss': '" * (N // 9) + "'" * N,
    "accuracy then spaces": "val acc" + " " * N + "x",
    "rate label then spaces": "img/s" + " " * N + "x",
    "number then spaces": "5" + " " * N + "it",
    "a huge batch counter": "Test: [" + "1" * 5000 + "/" + "2" * 5000 + "] loss 0.5",
    "a huge count": "Test: accuracy " + "9" * 5000 + "/" + "9" * 5000,
    "a huge percentage count": "val accuracy 50% (" + "9" * 5000 + "/" + "9" * 5000 + ")",
    "signs": "loss " + "-+" * (N // 2),
    "scopes": "val " * (N // 4) + "loss",
}


def read_everything(run: output.Run) -> None:
    run.rate()
    for key in ("loss", "accuracy"):
        for validation in (False, True):
            run.metric(key, validation)
            run.readings(key, validation)


@pytest.mark.parametrize("line", ADVERSARIAL.values(), ids=ADVERSARIAL.keys())
def test_an_adversarial_line_is_read_in_linear_time_without_an_error(line):
    run = output.Run("x", [], output=[line, "epoch 1: loss 0.25, val accuracy 50.00% (4/8), 12.5 images/s"])
    started = time.perf_counter()
    read_everything(run)
    assert time.perf_counter() - started < BUDGET_S
    # the ordinary line after it is still read
    assert run.metric("loss") == (0.25, "0.25")
    assert run.readings("accuracy", validation=True)[-1] == output.Reading(50.0, "50.00%", 8)


def test_a_huge_count_is_not_taken_for_one():
    run = output.Run("x", [], output=["val accuracy 50% (" + "9" * 5000 + "/" + "9" * 5000 + ")"])
    assert run.readings("accuracy", validation=True) == [output.Reading(50.0, "50%", None)]
    run = output.Run("x", [], output=["Test: [" + "1" * 20 + "/8] loss 0.5"])
    assert run.metric("loss", validation=True) == (0.5, "0.5")  # no counter: the line counts


def test_numbers_are_still_read_where_they_start():
    cases = {
        "loss=-0.5": -0.5,
        "loss: .25": 0.25,
        "loss 1e-3": 1e-3,
        "loss:0.75": 0.75,
        "train_loss 1.5": 1.5,
    }
    for line, value in cases.items():
        assert output.Run("x", [], output=[line]).metric("loss")[0] == value, line
    assert output.Run("x", [], output=["412.5 img/s"]).rate()[0] == 412.5
    assert output.Run("x", [], output=["Time: 2.08s,  15.38/s"]).rate()[0] == 15.38


class Watched(io.StringIO):
    """An output stream that says when a text has been written to it."""

    def __init__(self, wanted: str) -> None:
        super().__init__()
        self.wanted, self.seen = wanted, threading.Event()

    def write(self, text: str) -> int:
        written = super().write(text)
        if self.wanted in self.getvalue():
            self.seen.set()
        return written


def test_a_progress_bar_without_a_newline_is_echoed_while_it_runs(tmp_path):
    """The child draws a bar with ``\\r`` and waits, without a newline, until the bar has been
    echoed: line-at-a-time reading would wait for the newline forever (here: the time-out)."""
    go = tmp_path / "go"
    code = (
        "import os, sys, time\n"
        "sys.stdout.write('\\r 40%|####  | 4/10 [00:01<00:01, 5.00it/s]'); sys.stdout.flush()\n"
        f"deadline = time.time() + 60\n"
        f"while not os.path.exists({str(go)!r}) and time.time() < deadline: time.sleep(0.05)\n"
        "sys.stdout.write('\\r100%|######| 10/10 [00:02<00:00, 5.00it/s]\\nloss: 0.5\\nend without newline')\n"
    )
    out = Watched("[x]  40%|####")
    run = output.Run("x", [sys.executable, "-c", code])
    worker = threading.Thread(target=runs.execute, args=(run, None, out))
    worker.start()
    try:
        assert out.seen.wait(30), f"the bar was not echoed while the child waited: {out.getvalue()!r}"
    finally:
        go.touch()
        worker.join(60)
    assert out.getvalue() == (
        "\r[x]  40%|####  | 4/10 [00:01<00:01, 5.00it/s]"
        "\r[x] 100%|######| 10/10 [00:02<00:00, 5.00it/s]\n"
        "[x] loss: 0.5\n"
        "[x] end without newline\n"
    )
    # read as universal newlines read it: each redraw a line of its own
    assert run.output == [
        "",
        " 40%|####  | 4/10 [00:01<00:01, 5.00it/s]",
        "100%|######| 10/10 [00:02<00:00, 5.00it/s]",
        "loss: 0.5",
        "end without newline",
    ]
    assert run.exit_code == 0 and run.rate()[0] == 5.0


def test_crlf_split_across_reads_is_one_line_end():
    run = output.Run("x", [sys.executable, "-c", "import sys; sys.stdout.write('a\\r\\nb\\r\\n' * 20000)"])
    runs.execute(run, None, io.StringIO())
    assert run.output == ["a", "b"] * 20000
