"""The run side of ``python -m nanopatch --verify``: one run of the user's script, recorded step
by step and stopped after N optimizer steps.

    python -m nanopatch.runner._verify_child OUT STEPS SEED (script.py | -m module) [args ...]

``--verify`` starts this twice: as it stands (the stock run) and under the runner, ``python -m
nanopatch [options] -m nanopatch.runner._verify_child ...`` (the patched run). Either way it seeds
torch, numpy and ``random`` with SEED, gives every DataLoader iterator a random stream of its
own (:class:`LoaderStreams`), and runs the target as ``python script.py args`` (or ``python -m
module args``) would, under a :class:`nanopatch.learning.Recorder`. After each optimizer step
it appends the step's record to ``OUT/steps.jsonl`` and a sample of every parameter's values to
``OUT/params-<step>.pt``, so a run that crashes leaves what it recorded. At the end of step
STEPS it raises :class:`StopRun` from the optimizer's step; that unwinds the script (its
``finally`` blocks and a framework's teardown run; ``except Exception`` does not catch it) and
the process ends with exit code 0.
"""

from __future__ import annotations

import json
import os
import random
import sys
import zlib
from collections.abc import Sequence
from typing import Any

import torch

from nanopatch.foundation.learning import Recorder

from .verify import SAMPLE_SIZE, STEPS_FILE, params_file


class StopRun(BaseException):
    """The run has taken the optimizer steps asked for (a BaseException, so that a script's
    ``except Exception`` lets it through, as it does KeyboardInterrupt)."""


def _numpy() -> Any:
    try:
        import numpy
    except ImportError:  # pragma: no cover - numpy comes with torchvision
        return None
    return numpy


def seed_everything(seed: int) -> None:
    torch.manual_seed(seed)
    random.seed(seed)
    numpy = _numpy()
    if numpy is not None:
        numpy.random.seed(seed)


class _Stream:
    """The global torch, numpy and ``random`` RNG states one DataLoader iterator draws from:
    entered, they replace the process's own; left, they are saved and the process's put back."""

    def __init__(self, seed: int) -> None:
        generator = torch.Generator()
        generator.manual_seed(seed)
        self._torch = generator.get_state()
        self._random = random.Random(seed).getstate()
        numpy = _numpy()
        self._numpy = None if numpy is None else numpy.random.RandomState(seed % 2**32).get_state()
        self._outer: list[tuple[Any, Any, Any]] = []

    def __enter__(self) -> None:
        numpy = _numpy()
        self._outer.append((torch.get_rng_state(), random.getstate(), numpy and numpy.random.get_state()))
        torch.set_rng_state(self._torch)
        random.setstate(self._random)
        if self._numpy is not None:
            numpy.random.set_state(self._numpy)

    def __exit__(self, *exc: Any) -> None:
        numpy = _numpy()
        self._torch, self._random = torch.get_rng_state(), random.getstate()
        outer_torch, outer_random, outer_numpy = self._outer.pop()
        torch.set_rng_state(outer_torch)
        random.setstate(outer_random)
        if self._numpy is not None:
            self._numpy = numpy.random.get_state()
            numpy.random.set_state(outer_numpy)


_STREAM = "_nanopatch_verify_stream"


class LoaderStreams:
    """While entered, each DataLoader iterator draws from a random stream of its own, seeded
    from ``seed`` and the iterator's rank among the iterators made so far in this process.

    The main-process work of loading (the sampler's shuffle, the workers' base seed, a
    dataset's random transforms when there are no workers) then does not depend on what the
    training drew from the global RNG: nanopatch's fast dropout masks draw from it otherwise
    than stock's, which would give the two runs a different order from the second epoch on.
    ``DataLoader.__iter__`` makes each iterator under its stream, and every ``__next__`` of it
    runs under the same stream; the training in between sees its own RNG states unchanged."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.made = 0
        self._saved: list[tuple[type, str, Any]] = []

    def _stream(self) -> _Stream:
        self.made += 1
        return _Stream(zlib.crc32(f"{self.seed}/{self.made}".encode()))

    def __enter__(self) -> LoaderStreams:
        from torch.utils.data import dataloader

        make, advance = dataloader.DataLoader.__dict__["__iter__"], dataloader._BaseDataLoaderIter.__dict__["__next__"]
        streams = self

        def __iter__(loader: Any) -> Any:
            stream = streams._stream()
            with stream:
                iterator = make(loader)
            try:
                setattr(iterator, _STREAM, stream)
            except AttributeError:  # an iterator type with slots: it draws from the global RNG
                pass
            return iterator

        def __next__(iterator: Any) -> Any:
            stream = iterator.__dict__.get(_STREAM)
            if stream is None:
                return advance(iterator)
            with stream:
                return advance(iterator)

        for owner, name, new, old in (
            (dataloader.DataLoader, "__iter__", __iter__, make),
            (dataloader._BaseDataLoaderIter, "__next__", __next__, advance),
        ):
            new.__wrapped__ = old  # type: ignore[attr-defined]
            self._saved.append((owner, name, old))
            setattr(owner, name, new)
        return self

    def __exit__(self, *exc: Any) -> None:
        while self._saved:
            owner, name, old = self._saved.pop()
            setattr(owner, name, old)


class StepWriter:
    """``Recorder.on_step``: writes each step's record and parameter sample as it comes, and
    stops the run at the end of step ``steps``."""

    def __init__(self, folder: str, steps: int) -> None:
        self.folder = folder
        self.steps = steps
        self._indices: dict[tuple[str, int], torch.Tensor | None] = {}
        self._file = open(os.path.join(folder, STEPS_FILE), "a", encoding="utf-8")

    def close(self) -> None:
        self._file.close()

    def __call__(self, recorder: Recorder) -> None:
        step = len(recorder.steps)
        if step > self.steps:  # the script caught StopRun and went on
            raise StopRun
        self._file.write(json.dumps(recorder.steps[-1].as_dict()) + "\n")
        self._file.flush()
        self._write_sample(step, recorder.named_parameters())
        if step == self.steps:
            print(f"nanopatch --verify: stopping the run after {step} optimizer steps", file=sys.stderr, flush=True)
            raise StopRun

    def _sample(self, name: str, param: torch.Tensor) -> torch.Tensor:
        flat = param.detach().reshape(-1)
        key = (name, flat.numel())
        if key not in self._indices:
            indices = None
            if flat.numel() > SAMPLE_SIZE:
                generator = torch.Generator()
                generator.manual_seed(zlib.crc32(name.encode()))
                indices = torch.randint(flat.numel(), (SAMPLE_SIZE,), generator=generator)
            self._indices[key] = indices
        indices = self._indices[key]
        return (flat if indices is None else flat[indices]).float().clone()

    def _write_sample(self, step: int, named: dict[str, torch.Tensor]) -> None:
        sample = {
            "shapes": {name: list(p.shape) for name, p in named.items()},
            "values": {name: self._sample(name, p) for name, p in named.items()},
            "sampled": sorted(name for name, p in named.items() if p.numel() > SAMPLE_SIZE),
        }
        path = params_file(self.folder, step)
        torch.save(sample, path + ".part")
        os.replace(path + ".part", path)


def main(argv: Sequence[str]) -> int:
    folder, steps, seed, *target = argv
    if not target or target == ["-m"]:
        print("nanopatch --verify: no script or -m module to run", file=sys.stderr)
        return 2
    from ._scripts import NoModule, run_module, run_script

    os.makedirs(folder, exist_ok=True)
    writer = StepWriter(folder, int(steps))
    seed_everything(int(seed))
    try:
        with LoaderStreams(int(seed)), Recorder(on_step=writer):
            if target[0] == "-m":
                run_module(target[1], target[2:])
            else:
                run_script(target[0], target[1:])
    except StopRun:
        pass
    except NoModule as exc:
        print(f"python -m nanopatch --verify: error: {exc}", file=sys.stderr)
        return 1
    finally:
        writer.close()
    return 0


if __name__ == "__main__":
    from nanopatch.runner._verify_child import main as _main  # the module under its own name, not __main__

    sys.exit(_main(sys.argv[1:]))
