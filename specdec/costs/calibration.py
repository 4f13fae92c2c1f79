"""What a round costs on this machine: the verification curve v(n) and the draft's cost c, measured once.

Leviathan et al. 2023 price a round at k*c + 1 target steps: drafting k tokens at c steps each, and
one verification forward assumed to cost one step. On a CPU it does not: a forward over n new
tokens costs v(n) one-token steps, with v(1) = 1 and v(n) growing with n (how fast depends on the
dtype's kernels). `calibrate` measures, for the loaded pair, dtype and thread count,

- v(n) = median time of a target forward over n new tokens / median time of a one-token step,
  for n = 1..n_max, after a 64-token context (`specdec.core.forwards`), the sizes interleaved and repeated;
- c = median time of one draft forward / median time of the target's one-token step (Leviathan's c), the two
  timed in turn in one loop, so a drift of the machine's speed between them moves both sides of the ratio;

and `CostModel.predicted_speedup(alpha, k)` = E[tokens per round] / (v(k+1) + k*c)
(`specdec.core.theory.predicted_speedup`). Results are cached as JSON under `$SPECDEC_CACHE/costs/`, one file
per target (v) and one per (target, draft) pair (c), keyed by model identity and weight format, the hardware
(CPU model and flags, threads, torch) and the int8 kernel path; `recalibrate=True` measures again, and
`cached_costs` reads the cache alone (None where nothing is).

A machine's speed can move by itself between processes (a shared host's memory bandwidth): the same CPU has run the
int8 target's one-token step in 27 ms in one process and 44 ms in another, and v(9) with it from 1.58 to 1.16
(the step gets slower where it waits on memory, a 9-token forward much less). So a curve read from the cache is
checked once per process (and again after CHECK_EVERY_S) before it prices anything: a one-token step and an
n_max-token forward timed in turn (`still_holds`); where either is more than DRIFT from the curve's, the curve and
the draft's c are measured again and stored. A cached c is timed again once per process too (a draft's step and
the target's in turn, as c was measured); more than DRIFT from it, the new c is stored: a c measured while the
machine was busy with something else (0.90 where the pair's is 0.31) would otherwise price every later round.
"""
from __future__ import annotations

import functools
import hashlib
import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Mapping

import torch

from specdec.core import files, hardware
from specdec.core.costmodel import CostModel, TargetCosts
from specdec.core.drafter import Drafter, NoDraft, SamplingPolicy, as_drafter
from specdec.core.forwards import forward_seconds, primed_cache
from specdec.core.inputs import unwrap, vocab_size
from specdec.core.limits import K_AUTO_MAX, LEAVES_MAX, Budget
from specdec.core.timing import interleaved, medians, warm_up
from specdec.models import cache
from specdec.models.formats import METHOD as FORMATS_METHOD, format_of
from specdec.models.quant import kernel_path
from specdec.models.speed import set_rows_first

REPEATS = 3  # timed forwards per size; the median is kept
DRAFT_REPEATS = 9  # draft forwards timed for c, each beside a one-token target step (a draft forward is cheap)
N_MAX = K_AUTO_MAX + 1 + LEAVES_MAX  # largest verification size calibrated: k_max drafts, the target's own token
# and the most leaves a round verifies beside them
MEASURING = "measuring what verification and drafting cost on this machine"  # what a BudgetExceeded says
METHOD = 8  # bump when what a calibration measures changes (7: c from draft forwards and target steps in turn; 8: v
# up to the leaves' rows)
CHECK_EVERY_S = 600.0  # a curve this process has measured or checked is taken as it is for this long
DRIFT = 0.15  # a cached curve whose step or v(n_max), timed now, is this far from it (relative) is measured again
C_FLOOR = 0.05  # a cached c is stored anew where c timed now is DRIFT * max(c, C_FLOOR) from it (c near 0: noise)
_checked: dict[str, float] = {}  # target or draft key -> time.monotonic() this process last measured or checked it


def calibrate(target, draft=None, *, n_max: int = N_MAX, repeats: int = REPEATS, recalibrate: bool = False,
              cache_dir: str | Path | None = None, budget: Budget = Budget(),
              curve: TargetCosts | None = None) -> CostModel:
    """The CostModel of `target` with `draft` (a model, LoadedModel, Drafter, or None for no draft).

    Cached results are returned unless `recalibrate`; a fresh measurement takes about
    (n_max + 1) * repeats target forwards plus a few draft forwards, `budget` checked before each
    (BudgetExceeded: nothing is stored, the next call measures again). `curve`, the target's curve this process
    has just read or measured (`calibrate_drafts`), is taken as it is where it was measured for this target.
    """
    target_model, drafter, folder, target_key, draft_key = _entries(target, draft, n_max, repeats, cache_dir)
    reused = curve is not None and curve.key == target_key
    cached = asdict(curve) if reused else _cached(folder, target_key, recalibrate)
    target_costs = None if cached is None else TargetCosts(**cached)
    if target_costs is not None:
        set_rows_first(target_model, target_costs.rows_first)  # the faster product for each size, as measured
        if not reused and _due(target_key) and not still_holds(target_model, target_costs, repeats, budget):
            target_costs = None  # the machine runs otherwise now than when it was measured
    fresh = target_costs is None
    if fresh:
        step_s, verify, rows_first = measure_verification(target_model, n_max, repeats, budget)
        target_costs = TargetCosts(step_s, verify, target_key, rows_first)
        _store(folder, target_key, asdict(target_costs))
        set_rows_first(target_model, target_costs.rows_first)
    _checked[target_key] = time.monotonic()
    stored = None if recalibrate or fresh else _cached(folder, draft_key, False)
    draft_model = _own_model(drafter, target_model)
    if stored is None:
        rows_first = measure_verification(draft_model, 2, repeats, budget)[2] if draft_model is not None else []
        stored = {"draft_cost": measure_draft_cost(target_model, drafter, max(repeats, DRAFT_REPEATS), budget),
                  "rows_first": rows_first}
        _store(folder, draft_key, stored)
        fresh = True
    elif _due(draft_key):  # c read from the cache: timed again once per process, as the curve is
        now = measure_draft_cost(target_model, drafter, max(repeats, DRAFT_REPEATS), budget)
        if abs(now - stored["draft_cost"]) > DRIFT * max(stored["draft_cost"], C_FLOOR):
            stored = {**stored, "draft_cost": now}
            _store(folder, draft_key, stored)
            fresh = True
    _checked[draft_key] = time.monotonic()
    if draft_model is not None:
        set_rows_first(draft_model, stored.get("rows_first", ()))  # its catch-up forward reads 2 tokens
    return CostModel(target_costs, stored["draft_cost"], draft_key, fresh)


def calibrate_drafts(target, drafts: Mapping[str, object], *, recalibrate: bool = False,
                     **options) -> dict[str, CostModel]:
    """`calibrate` of `target` with each of `drafts` (name -> draft), the target's curve read or measured once for
    them all: a recalibration measures it once, not once per draft (each later measurement would replace the one
    the drafts before were priced with)."""
    costs: dict[str, CostModel] = {}
    for name, draft in drafts.items():
        first = next(iter(costs.values()), None)
        costs[name] = calibrate(target, draft, recalibrate=recalibrate, curve=first.target if first else None,
                                **options)
    return costs


def cached_costs(target, draft=None, *, n_max: int = N_MAX, repeats: int = REPEATS,
                 cache_dir: str | Path | None = None) -> CostModel | None:
    """The CostModel `calibrate` returns from its cache, or None where this machine has not measured the pair yet:
    it never measures, and leaves the models as they are."""
    _, _, folder, target_key, draft_key = _entries(target, draft, n_max, repeats, cache_dir)
    curve, draft_costs = _cached(folder, target_key, False), _cached(folder, draft_key, False)
    if curve is None or draft_costs is None:
        return None
    return CostModel(TargetCosts(**curve), draft_costs["draft_cost"], draft_key)


def _entries(target, draft, n_max: int, repeats: int, cache_dir) -> tuple:
    """(target model, drafter, cache folder, target key, draft key) of a calibration."""
    target_model, _ = unwrap(target, None)
    drafter = NoDraft() if draft is None else as_drafter(draft, target_model)
    folder = Path(cache_dir) if cache_dir is not None else _default_cache_dir()
    device = str(next(target_model.parameters()).device)
    target_key = _key("target", device, METHOD, _identity(target), n_max, repeats)
    return target_model, drafter, folder, target_key, _key("draft", device, target_key, _drafter_identity(drafter))


def _own_model(drafter: Drafter, target_model: torch.nn.Module) -> torch.nn.Module | None:
    """The draft's model when it has one that shares no weights with the target (self-speculation does)."""
    if drafter.model is None:
        return None
    target_tensors = {p.data_ptr() for p in target_model.parameters()}
    return None if any(p.data_ptr() in target_tensors for p in drafter.model.parameters()) else drafter.model


def measure_verification(model: torch.nn.Module, n_max: int, repeats: int,
                         budget: Budget = Budget()) -> tuple[float, list[float], list[int]]:
    """(one-token step seconds, [v(1) .. v(n_max)], sizes where rows-first wins): sizes interleaved, medians kept.

    A float32 model with rows-first Linears (`specdec.models.speed`) is timed both ways at every size, in
    alternation; each size keeps the faster product, and v(n) is that one's time.
    """
    lm, base = primed_cache(model)
    forward_seconds(lm, base, 1)  # warm-up: first-call allocations and kernel choice
    modes = (False, True) if set_rows_first(model, ()) else (False,)  # (plain F.linear, rows-first)

    def forward(n: int, rows_first: bool) -> float:
        budget.check(MEASURING)
        set_rows_first(model, range(2, n_max + 1) if rows_first else ())
        return forward_seconds(lm, base, n)

    sizes = range(1, n_max + 1)
    seconds = medians(interleaved({(n, m): functools.partial(forward, n, m) for n in sizes for m in modes}, repeats))
    best = {n: min(modes, key=lambda m: seconds[(n, m)]) for n in sizes}
    step_s = seconds[(1, best[1])]
    return step_s, [seconds[(n, best[n])] / step_s for n in sizes], [n for n in sizes if n > 1 and best[n]]


def _due(key: str) -> bool:
    """Whether the curve `key` is to be checked: this process has not measured or checked it in CHECK_EVERY_S."""
    return time.monotonic() - _checked.get(key, -CHECK_EVERY_S) >= CHECK_EVERY_S


def still_holds(model: torch.nn.Module, costs: TargetCosts, repeats: int, budget: Budget = Budget()) -> bool:
    """Whether `costs` still describe `model` on this machine as it runs now: a one-token step and a forward over
    the curve's largest size timed in turn (`repeats` each, medians), each within DRIFT of what the curve says."""
    lm, base = primed_cache(model)
    forward_seconds(lm, base, 1)  # warm-up
    largest = len(costs.verify)

    def forward(n: int) -> float:
        budget.check(MEASURING)
        return forward_seconds(lm, base, n)

    seconds = medians(interleaved({n: functools.partial(forward, n) for n in (1, largest)}, repeats))
    step, v = seconds[1], seconds[largest] / seconds[1]
    return abs(step / costs.step_s - 1.0) <= DRIFT and abs(v / costs.verify[-1] - 1.0) <= DRIFT


def measure_draft_cost(target_model: torch.nn.Module, drafter: Drafter, repeats: int,
                       budget: Budget = Budget()) -> float:
    """c: the median seconds per draft forward of a one-token proposal (a model-free drafter: per proposal) over
    the median seconds of a one-token target step, the two timed in turn (`interleaved`), `repeats` of each.

    Both read the same context, which repeats no token, so a hybrid's prompt lookup finds nothing and its model
    drafts."""
    lm, base = primed_cache(target_model)
    policy = SamplingPolicy(0.0, 1.0, torch.Generator(), vocab_size(target_model))
    drafter.prefill(base)

    def draft() -> float:
        budget.check(MEASURING)
        proposal = drafter.propose(base, 1, policy)
        return proposal.time_s / max(proposal.forwards, 1)

    def step() -> float:
        budget.check(MEASURING)
        return forward_seconds(lm, base, 1)

    warm_up(draft, step)
    seconds = medians(interleaved({"draft": draft, "step": step}, repeats))
    return seconds["draft"] / seconds["step"]


def _identity(model_or_loaded) -> str:
    """Name, folder and weight format of a LoadedModel; config hash, size and weight format of a bare module (the
    format read off its layers, `formats.format_of`: int8, int8-dynamic and int4 run other kernels)."""
    model, _ = unwrap(model_or_loaded, None)
    dtype = format_of(model)
    if hasattr(model_or_loaded, "path"):
        return f"{model_or_loaded.name}|{model_or_loaded.path}|{dtype}"
    config = model.config.to_json_string(use_diff=False)
    size = sum(p.numel() for p in model.parameters())
    return f"module|{hashlib.sha256(config.encode()).hexdigest()[:16]}|{size}|{dtype}"


def _drafter_identity(drafter: Drafter) -> str:
    """What the draft's cost depends on: the drafter's own cost key and the identity of the model it drafts with."""
    return "|".join([drafter.cost_key] + ([_identity(drafter.model)] if drafter.model is not None else []))


def _key(kind: str, device: str, *parts) -> str:
    """A cache file's name: `kind` and a hash of `parts`, the hardware (CPU model and flags, threads, GPU, torch),
    and the int8 kernel path measured (`quant.kernel_path`) and what the formats are (`formats.METHOD`)."""
    machine = json.dumps({**hardware.describe(device), "int8_kernel": kernel_path(), "formats": FORMATS_METHOD},
                         sort_keys=True)
    text = "|".join(map(str, (kind, *parts, machine)))
    return f"{kind}-{hashlib.sha256(text.encode()).hexdigest()[:20]}"


def _default_cache_dir() -> Path:
    return cache.root() / "costs"


def _cached(folder: Path, key: str, recalibrate: bool) -> dict | None:
    path = folder / f"{key}.json"
    if recalibrate or not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):  # a damaged file is measured again
        return None


def _store(folder: Path, key: str, data: dict) -> None:
    files.write_text(folder / f"{key}.json", json.dumps(data))
