"""Every weight format's path on this machine: what a one-token step reads, the floor that puts under it, and what
the step, the verification curve and each draft's cost measure (`python -m specdec profile --paths`).

A one-token step reads every weight once, so at this machine's read speed (`breakdown.read_bandwidth`) its weights
alone take bytes / bandwidth: no kernel makes that format's step faster. The row of each format sets that floor
beside the measured step, v(2..9) (`specdec.costs.calibration`) and each draft's c, the draft and the target both in
that format. Built with random weights of the real architecture (`specdec.models.random_weights`): bytes, v(n) and c
depend on shapes, not values, so no model file is read and nothing is converted.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from specdec.costs.calibration import calibrate, calibrate_drafts
from specdec.drafters import Vocabulary, from_spec
from specdec.lab.breakdown import read_bandwidth, weight_bytes_per_step
from specdec.models import formats
from specdec.models.loading import LoadedModel, resolve_device
from specdec.models.random_weights import load_random


@dataclass
class DraftPath:
    """One draft in one format."""

    bytes: int | None  # weight bytes one draft forward reads; None for a model-free draft
    cost: float  # c: one draft forward in target steps, the target in the same format


@dataclass
class PathRow:
    """The target (and its drafts) in one weight format."""

    format: str  # one of formats.FORMATS
    bytes: int  # weight bytes one target step reads
    step_s: float  # a one-token target step after a 64-token context
    verify: list[float]  # v(1..n_max): a forward over n new tokens in one-token steps
    drafts: dict[str, DraftPath] = field(default_factory=dict)  # spec -> the draft in this format

    def floor_s(self, bandwidth: float) -> float:
        """The step's memory floor: its weights' bytes at `bandwidth` bytes per second."""
        return self.bytes / bandwidth


def random_draft(spec: str, target: LoadedModel, dtype: str):
    """The draft `spec` for `target` with random weights in `dtype` (its ids as they are: a draft built without a
    tokenizer cannot go through the text bridge)."""
    build = lambda name: load_random(name, dtype=dtype, device=target.device, role="draft")  # noqa: E731
    return from_spec(spec, target, load=build, vocabulary=Vocabulary.AS_IS)


def measure_paths(target: str, drafts: list[str], *, device: str = "auto",
                  recalibrate: bool = False) -> tuple[float, list[PathRow]]:
    """(bytes per second this machine reads, a PathRow per format with kernels here), one format's models alive
    at a time."""
    device = resolve_device(device)
    rows = []
    for format_ in formats.candidates(device, "draft"):
        model = load_random(target, dtype=format_, device=device)
        made = {spec: random_draft(spec, model, format_) for spec in drafts}
        costs = calibrate_drafts(model, made, recalibrate=recalibrate)
        curve = next(iter(costs.values())).target if costs else calibrate(model, None, recalibrate=recalibrate).target
        row = PathRow(format_, weight_bytes_per_step(model.model), curve.step_s, list(curve.verify))
        for spec, draft in made.items():
            own = getattr(draft, "model", None)
            row.drafts[spec] = DraftPath(None if own is None else weight_bytes_per_step(own), costs[spec].draft_cost)
        rows.append(row)
        del model, made, costs  # before the next format's models are built
    return read_bandwidth(max(row.bytes for row in rows)), rows
