"""The one clock of specdec: every timed region waits for the device at both ends.

A CUDA op returns as soon as it is queued, so `time.perf_counter()` around a forward on a GPU measures the
launch, not the run. Every timed region of the product (the engine's forwards and proposals, the calibration
of v(n) and c, the bench's cells and baselines, the levers and the breakdown) goes through `Timer`, which calls
`device_sync` on entry and on exit: on a GPU the times are run times; on the CPU, whose ops have finished
when they return, the sync does nothing and the times are what they always were.

- `clock(device)`: one end of a region that a `with` block cannot hold (the engine's wall time);
- `Timer(device)`: `with Timer(device) as timer: ...`, then `timer.seconds`;
- `timed(fn, device)`: fn's output and its seconds;
- `time_median(fn, repeats, device)`: the first output and the median seconds of `repeats` runs;
- `interleaved(candidates, repeats)`: the candidates timed in turn, round-robin, `repeats` times (each
  repeat starts one candidate later, so a drift of the machine's speed spreads over all of them); the
  calibration of v(n) and the lever table are built on it.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Hashable, Mapping, TypeVar

import torch

Key = TypeVar("Key", bound=Hashable)


def device_sync(device: torch.device | str | None) -> None:
    """Wait until `device` has run the work queued on it: torch.cuda.synchronize on a CUDA device, nothing
    on the CPU (None: the CPU)."""
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def clock(device: torch.device | str | None) -> float:
    """`time.perf_counter()` once `device` has run its queued work: one end of a timed region."""
    device_sync(device)
    return time.perf_counter()


@dataclass
class Timer:
    """Seconds of the `with` block, the device synchronised when it opens and when it closes."""

    device: torch.device | str | None = None  # the device whose queued work the block's time includes
    seconds: float = 0.0  # set when the block closes
    _start: float = field(default=0.0, repr=False)

    def __enter__(self) -> "Timer":
        self._start = clock(self.device)
        return self

    def __exit__(self, *exc) -> None:
        self.seconds = clock(self.device) - self._start


def timed(fn: Callable[[], object], device: torch.device | str | None = None) -> tuple[object, float]:
    """fn()'s output and its seconds (a `Timer` around the call)."""
    with Timer(device) as timer:
        output = fn()
    return output, timer.seconds


def warm_up(*fns: Callable[[], object]) -> None:
    """Call each once, untimed, so first-call allocations and kernel choice never land in a measurement."""
    for fn in fns:
        fn()


def time_median(fn: Callable[[], object], repeats: int,
                device: torch.device | str | None = None) -> tuple[object, float]:
    """Run fn `repeats` times (at least once): (the first run's output, the median seconds)."""
    output, first_s = timed(fn, device)
    seconds = [first_s] + [timed(fn, device)[1] for _ in range(repeats - 1)]
    return output, statistics.median(seconds)


def interleaved(candidates: Mapping[Key, Callable[[], float]], repeats: int) -> dict[Key, list[float]]:
    """Seconds of each candidate, `repeats` samples each, taken round-robin (a, b, c, a, b, c, ...).

    Each candidate times itself and returns its seconds (a `Timer` inside it, e.g. `CachedLM.forward`'s), so
    the setup around what it measures stays out. Repeat r starts at candidate r (mod their number)."""
    keys = list(candidates)
    seconds: dict[Key, list[float]] = {key: [] for key in keys}
    for repeat in range(repeats):
        shift = repeat % len(keys)
        for key in keys[shift:] + keys[:shift]:
            seconds[key].append(candidates[key]())
    return seconds


def medians(samples: Mapping[Key, list[float]]) -> dict[Key, float]:
    """The median of each candidate's samples (`interleaved`'s result)."""
    return {key: statistics.median(values) for key, values in samples.items()}
