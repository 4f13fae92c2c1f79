"""Cost profiles that travel: v(n) and c measured on one machine, saved as JSON, read on another.

`python -m specdec profile --save FILE` writes the target's verification curve v(1..n) and one-token step, the
cost c of each draft it was given, the dtype and device, the hardware (`specdec.core.hardware.describe`), the
date and the code version. `generate`, `bench` and the bench's k advisor read one with `--costs FILE` and
price the acceptance measured here with the costs measured there:

    predicted speedup there at k = E[tokens per round](k) / (v_there(k+1) + k * c_there),

E[tokens per round](k) from the α̂ per draft position measured here (`specdec.core.theory.tokens_per_round_by_k`:
the acceptance of a draft does not depend on the hardware, its price does). A file that is not a profile, of
another format version, damaged, or of another target is refused with one line naming it.

The app offers the profiles bundled under `assets/hardware/*.json` (`bundled_profiles`): its compare and theory
tabs show, next to the speedup measured here, the speedup predicted on the hardware chosen (`predict_for`).
"""
from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path

from specdec.core import files, hardware, theory
from specdec.core.costmodel import CostModel, TargetCosts

FORMAT = "specdec cost profile"  # the "format" field every profile carries
VERSION = 1  # bump when the fields change meaning
HARDWARE = files.ASSETS / "hardware"  # the profiles the app offers (`*.json`)

log = logging.getLogger(__name__)


@dataclass
class CostProfile:
    """What one machine's round costs: the target's v(n) and step, and c per draft."""

    target: str  # the target's name (a catalogue name, or the folder's name)
    dtype: str  # the weights' dtype when measured ("float32", "bfloat16", "int8")
    device: str  # torch device the forwards ran on ("cpu", "cuda", ...)
    weights: str  # "random" (the architecture built from its config) or "loaded" (the model's own weights)
    hardware: dict  # `specdec.core.hardware.describe()`: CPU model and flags, threads, GPU, platform, torch
    date: str  # when it was measured, ISO 8601 UTC
    code_version: str  # `specdec.core.hardware.code_version()` of the code that measured it
    step_s: float  # seconds of one one-token target step
    verify: list[float]  # v(1..n): a forward over n new tokens, in one-token steps (verify[0] = 1)
    drafts: dict[str, float]  # draft spec (as given to --draft) -> c, one draft forward in target steps
    source: str = field(default="", compare=False)  # the file it was read from ("" when made here)

    @property
    def label(self) -> str:
        """The hardware in a few words, with dtype and device."""
        return f"{hardware.label(self.hardware)} ({self.dtype}, {self.device})"

    @property
    def title(self) -> str:
        """The label and the day it was measured: which hardware a prediction is for."""
        return f"{self.label}, profiled {self.date[:10]}"

    def to_dict(self) -> dict:
        data = asdict(self)
        del data["source"]
        return {"format": FORMAT, "version": VERSION, **data}

    def costs(self, draft: str) -> CostModel:
        """The CostModel of the target with `draft` on the profiled machine."""
        if draft not in self.drafts:
            have = ", ".join(sorted(self.drafts)) or "none"
            raise ValueError(f"{self.source}: no cost c for draft {draft!r} (it has: {have}); profile it with "
                             f"`python -m specdec profile --draft {draft} --save FILE`")
        return CostModel(TargetCosts(self.step_s, list(self.verify), f"profile {self.source}"), self.drafts[draft],
                         f"profile {self.source} {draft}")

    def check_target(self, name: str) -> None:
        """Refuse a profile measured for another target than `name`."""
        if name != self.target:
            raise ValueError(f"{self.source}: a cost profile of target {self.target!r}, not {name!r}")

    def unpriced(self, target: str, draft: str) -> str | None:
        """Why this profile cannot price `draft` drafting for `target`, in a few words (a table cell), or None."""
        if target != self.target:
            return f"not for this target (a profile of {self.target})"
        if draft not in self.drafts:
            return "no c for this draft there"
        return None


def measured_profile(target, curve: TargetCosts, drafts: dict[str, float], weights: str) -> CostProfile:
    """A profile of `target` (a LoadedModel) on this machine: its calibrated curve and c per draft spec."""
    return CostProfile(target.name, target.dtype, str(target.device), weights, hardware.describe(target.device),
                       datetime.now(timezone.utc).isoformat(timespec="seconds"), hardware.code_version(),
                       curve.step_s, list(curve.verify), dict(drafts))


def save_profile(profile: CostProfile, path: str | Path) -> None:
    """Write `profile` to `path` as JSON (atomically)."""
    files.write_json(Path(path), profile.to_dict())


def load_profile(path: str | Path) -> CostProfile:
    """The profile in `path`; a ValueError of one line naming the file when it is not one this version reads."""
    names = {f.name for f in fields(CostProfile)} - {"source"}
    data = files.read_json(Path(path), "cost profile", FORMAT, VERSION, names,
                           "profile the machine with `python -m specdec profile --save FILE`")
    profile = CostProfile(**{name: data[name] for name in names}, source=str(path))
    problem = _problem(profile)
    if problem:
        raise ValueError(f"{path}: a damaged cost profile ({problem})")
    return profile


def bundled_profiles(folder: Path | None = None) -> dict[str, CostProfile]:
    """The profiles in `folder` (default `HARDWARE`; `*.json`, none when it is absent) by file name; a file
    `load_profile` refuses is left out, its one line naming it logged as a warning."""
    profiles = {}
    for path in sorted(Path(folder or HARDWARE).glob("*.json")):
        try:
            profiles[path.name] = load_profile(path)
        except ValueError as error:
            log.warning("%s", error)
    return profiles


def _problem(profile: CostProfile) -> str | None:
    """What makes a read profile unusable (one phrase), or None."""
    curve = profile.verify
    if not isinstance(curve, list) or not curve or not all(_positive(v) for v in curve) or curve[0] != 1.0:
        return "verify must be a list of positive numbers starting at v(1) = 1"
    if not _positive(profile.step_s):
        return "step_s must be a positive number"
    if not isinstance(profile.drafts, dict) or not all(_positive(c) or c == 0 for c in profile.drafts.values()):
        return "drafts must map draft names to costs c >= 0"
    if not all(isinstance(getattr(profile, name), str) for name in ("target", "dtype", "device", "date")):
        return "target, dtype, device and date must be text"
    if not isinstance(profile.hardware, dict):
        return "hardware must be an object"
    return None


def _positive(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def speedups_by_k(position_rates: list[float], costs: CostModel) -> list[float]:
    """Predicted speedup at k = 0..len(position_rates): E[tokens per round](k) from the conditional acceptance per
    draft position (`theory.tokens_per_round_by_k`), divided by the round's cost v(k+1) + k*c."""
    tokens = theory.tokens_per_round_by_k(position_rates)
    return [expected / (costs.v(k + 1) + k * costs.draft_cost) for k, expected in enumerate(tokens)]


@dataclass
class Prediction:
    """A run measured here, priced with a profile's costs."""

    hardware: str  # the profiled machine (`CostProfile.label`)
    k: int  # the k the run drafted (its mean draft length when k was "auto")
    speedup: float  # predicted speedup there at k, from the α̂ per position measured here
    best_k: int  # the k in 1..len(position_rates) with the best predicted speedup there (the advisor's k)
    best_speedup: float  # that speedup


    def line(self, predicted_here: float, measured_here: float | None = None) -> str:
        """One line: the prediction there next to the prediction (and the measurement, when given) here."""
        here = f"here: predicted {predicted_here:.2f}x" + (f", measured {measured_here:.2f}x" if measured_here
                                                             is not None else "")
        return (f"on {self.hardware}: predicted {self.speedup:.2f}x at k={self.k} from this run's α̂ per position "
                f"(the k to use there: {self.best_k}, {self.best_speedup:.2f}x); {here}")


def predict(profile: CostProfile, draft: str, position_rates: list[float], k: int) -> Prediction:
    """What the run (its α̂ per position, its k) would gain on the profiled machine, and the k to use there."""
    curve = speedups_by_k(position_rates, profile.costs(draft))
    best_k = max(range(1, len(curve)), key=lambda n: (curve[n], -n), default=0)
    return Prediction(profile.label, k, curve[min(k, len(curve) - 1)], best_k, curve[best_k])


def predict_for(profile: CostProfile, target: str, draft: str, position_rates: list[float], k: int) -> Prediction | str:
    """`predict` for `draft` drafting for `target` (a LoadedModel's name), or why `profile` cannot price that pair
    in a few words (`CostProfile.unpriced`: another target, no c for the draft)."""
    return profile.unpriced(target, draft) or predict(profile, draft, position_rates, k)
