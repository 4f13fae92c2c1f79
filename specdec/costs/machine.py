"""Why a decode is faster or slower here: the machine, each loaded model's weight format and why, and the pair's
v(n) and c, assembled from what is in memory and in the caches (nothing is loaded or timed here).

`machine_report(held, target, draft)` reads
- the device (`specdec.core.hardware`): the CPU's model, the threads torch uses, the CPU's vector features as the
  OS lists them and the kernels torch dispatches to; the GPU's name on a GPU;
- each model in memory (`ModelPool.held()`): its weight format and, where the format was "auto", the cached
  `FormatChoice` of its role: every candidate's one-token step and v(5), and why one won (`specdec.models.formats`);
- the pair's `CostModel` from the calibration cache (`specdec.costs.calibration.cached_costs`): v(1..9) and c, or
  nothing where this machine has not measured the pair yet.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec.core import hardware
from specdec.core.costmodel import CostModel
from specdec.costs.calibration import cached_costs
from specdec.models import formats
from specdec.models.formats import VERIFY_ROWS, FormatChoice
from specdec.models.loading import LoadedModel, architecture, resolve_device
from specdec.models.pool import Held

ROUND_K = VERIFY_ROWS - 1  # the k a round is priced at in the costs line: its verification reads VERIFY_ROWS tokens


@dataclass
class Device:
    """What the forwards run on."""

    device: str  # torch device: "cpu", "cuda", "cuda:1"
    gpu: str | None  # the GPU's name; None on a CPU
    cpu: str  # the CPU's model name
    threads: int  # threads torch's CPU kernels use
    features: list[str]  # the CPU's vector features as the OS lists them (`hardware.features`)
    kernels: str  # the CPU kernels torch dispatches to ("AVX512", "AVX2", "DEFAULT", ...)
    torch: str  # torch's version

    def lines(self) -> list[str]:
        """Two lines: the device, then the CPU's vector features and torch."""
        cpu = f"{self.cpu}, {self.threads} thread{'s' if self.threads != 1 else ''} used by torch"
        first = f"GPU {self.gpu} ({self.device}), on a {cpu}" if self.gpu else f"CPU {cpu}"
        return [first, f"vector features (the OS): {', '.join(self.features) or 'none of those listed'}; "
                       f"torch's CPU kernels: {self.kernels}; torch {self.torch}"]


@dataclass
class ModelFormat:
    """One model in memory: its weight format and how it was chosen."""

    name: str  # the model's name
    role: str  # what it was loaded as: "target", "draft" or "train"
    format: str  # its weight format, one of `formats.FORMATS`
    asked: str  # the format asked for at load: "auto" (measured) or a format
    memory_bytes: int  # its parameters and buffers
    choice: FormatChoice | None  # asked "auto": the measured choice for its role; None where the cache has none

    @property
    def why(self) -> str:
        """How the format was chosen, one phrase."""
        if self.asked != "auto":
            return f"asked for ({self.asked})"
        if self.choice is None:
            return ("float32: what training computes in" if self.role == "train"
                    else "measured when it loaded; those timings are no longer in the cache")
        if self.choice.chosen != self.format:
            return f"measured again since it loaded: {self.choice.chosen} now ({self.choice.reason})"
        return f"measured: {self.choice.reason}"


@dataclass
class PairCosts:
    """The pair's calibrated costs, when this machine has measured them."""

    target: str  # the target's name
    draft: str  # the draft as named
    costs: CostModel | None  # v(n) and c; None where not measured yet


@dataclass
class MachineReport:
    """Everything the hardware panel shows (module docstring)."""

    device: Device
    models: list[ModelFormat]  # the models in memory, least recently used first
    pair: PairCosts | None  # None where the pair is not in memory
    missing: str = ""  # why there is no pair (one line), when there is none

    def models_line(self) -> str:
        """One line over the models table."""
        if not self.models:
            return "no model in memory yet: a decode loads its pair"
        return f"{len(self.models)} model(s) in memory, least recently used first"

    def model_rows(self) -> list[dict]:
        """One row per model in memory: role, weight format, memory and why that format."""
        return [{"model": m.name, "role": m.role, "format": m.format, "MB": round(m.memory_bytes / 2**20, 1),
                 "why this format": m.why} for m in self.models]

    def candidate_rows(self) -> list[dict]:
        """Every candidate format measured for each model loaded with "auto", fastest first, the chosen one marked."""
        return [{"model": m.name, "role": m.role, "format": t.format, "step ms": round(t.step_s * 1e3, 2),
                 f"v({VERIFY_ROWS})": round(t.verify_steps, 2),
                 "round ms (chosen by)": round(t.round_s(m.role) * 1e3, 2),  # `FormatTiming.round_s`
                 "row-invariant": "yes" if t.format in formats.ROW_INVARIANT else "no",
                 "chosen": "✓" if t.format == m.choice.chosen else ""}
                for m in self.models if m.choice is not None for t in m.choice.ranked()]

    def curve_rows(self) -> list[dict]:
        """v(n) for n = 1..9 and its time, of the pair's calibration (none when not measured)."""
        costs = self.pair.costs if self.pair is not None else None
        if costs is None:
            return []
        curve = costs.target
        return [{"n new tokens": n, "v(n) target steps": round(v, 2), "ms": round(v * curve.step_s * 1e3, 2)}
                for n, v in enumerate(curve.verify, start=1)]

    def costs_line(self) -> str:
        """One line: the pair's step, v(5) and c and what a round costs, or why they are not shown."""
        if self.pair is None:
            return self.missing
        pair, costs = self.pair, self.pair.costs
        if costs is None:
            return f"{pair.target} with {pair.draft}: v(n) and c not measured on this machine yet"
        round_cost = costs.round_cost(ROUND_K, ROUND_K)
        return (f"{pair.target} with {pair.draft}: a one-token target step takes {costs.target.step_s * 1e3:.1f} ms; "
                f"verifying {VERIFY_ROWS} tokens costs v({VERIFY_ROWS}) = {costs.v(VERIFY_ROWS):.2f} steps (Leviathan "
                f"et al. assume 1); one draft forward costs c = {costs.draft_cost:.3f} steps, so a round at "
                f"k = {ROUND_K} costs {round_cost:.2f} steps and gains only when it yields more tokens than that")


def machine_report(held: list[Held], target=None, draft=None, *, draft_name: str = "", missing: str = "",
                   cache_dir=None) -> MachineReport:
    """This machine with the models `held` (`ModelPool.held()`) and, when it is in memory, the pair `target` (a
    LoadedModel) with `draft` (as `load_draft` returns it; `draft_name` names one that is not a model); else
    `missing` says why there is no pair. Reads caches only (`cache_dir`: the costs cache, default the model cache's).
    """
    if target is None:
        device, pair = held[0].model.device if held else resolve_device("auto"), None
    else:
        name = draft.name if isinstance(draft, LoadedModel) else draft_name or "no draft"
        device, pair = target.device, PairCosts(target.name, name, cached_costs(target, draft, cache_dir=cache_dir))
    return MachineReport(describe_device(device), [model_format(h, cache_dir) for h in held], pair, missing)


def describe_device(device: str) -> Device:
    """The device `device` and the CPU beside it (`specdec.core.hardware`)."""
    gpu = hardware.gpu(device) if device != "cpu" else None
    return Device(device, gpu, hardware.cpu()["model"], torch.get_num_threads(), hardware.features(),
                  hardware.kernel_level(), torch.__version__)


def model_format(held: Held, cache_dir=None) -> ModelFormat:
    """A held model's format and, where it was "auto", the cached choice for its role (never measured here)."""
    loaded = held.model
    choice = None
    if held.dtype == "auto" and held.role in formats.ROLES:
        try:
            choice = formats.cached_choice(architecture(held.spec), held.role, device=loaded.device,
                                           cache_dir=cache_dir)
        except (OSError, ValueError):  # its files are gone since it loaded: the choice cannot be looked up
            choice = None
    return ModelFormat(loaded.name, held.role, loaded.dtype, held.dtype, loaded.memory_bytes, choice)
