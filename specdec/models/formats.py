"""Which weight format runs a model fastest on this machine: measured here, never read off CPU flags.

The formats (`FORMATS`): float32; bfloat16; int8, the row-invariant integer path of `specdec.models.quant`
(verification rows bitwise one-token steps, so greedy output equals the target alone by construction);
int8-dynamic, fbgemm's own dynamic quantization (`quant.couple_rows`: one op per layer, rows not independent);
int4, 4-bit weights read straight from a GGUF (`specdec.models.quant4`, row-invariant too); and int4-dynamic, those
4-bit weights on specdec's compiled product with rows quantized to int8 on the fly (`quant4.dynamic_rows`, a draft's
form, where the product builds here).

`choose_format(config, role)` times each candidate on a random-weight model of `config`'s real architecture
(v(n) and c depend on shapes, not values) at two depths, LAYERS, and extrapolates to the model's depth:
t(L) = fixed + L·per_layer, so the head, the embeddings and every layer's shapes are those of the real model
while a calibration takes seconds. The rule:

- a target takes the format whose verification rows are its one-token steps (ROW_INVARIANT) with the least time
  for a one-token step plus a VERIFY_ROWS-token forward (`FormatTiming.score_s`: the target alone's price and a
  round's, so a fast step with a costly verification does not win), and the fastest of all only where no
  row-invariant format is available; only its candidates are timed (`candidates`);
- a draft takes the format of all with the least time for the same round seen from the draft: VERIFY_ROWS - 1
  one-token proposals plus one forward over several tokens (its catch-up after a full acceptance, the prompt's
  prefill), timed as a VERIFY_ROWS-token forward (`FormatTiming.round_s`): a draft steps k times for each
  multi-token forward, so its step weighs k times as much as for a target. Verification decides the output, so a
  draft's precision never changes it, only how often its tokens pass.

Timings are cached as JSON under `$SPECDEC_CACHE/costs/`, keyed by the hardware (CPU model and flags, threads,
GPU), torch's version, METHOD, the int8 kernel path (`quant.kernel_path()`), the architecture's shapes and the
candidates, so no timing outlives the path it measured; `recalibrate=True` measures again.
"""
from __future__ import annotations

import copy
import functools
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM
from transformers.initialization import no_init_weights

from specdec.core import files, hardware
from specdec.core.forwards import CONTEXT_TOKENS, forward_seconds, primed_cache
from specdec.core.timing import interleaved
from specdec.models import cache, native, quant, quant4
from specdec.models.speed import apply_speed_levers

FORMATS = ("float32", "bfloat16", "int8", "int8-dynamic", "int4", "int4-dynamic")  # weight formats a model can run in
ROW_INVARIANT = ("int8", "int4")  # formats whose verification rows are bitwise one-token steps
CPU_ONLY = ("int8", "int8-dynamic", "int4", "int4-dynamic")  # formats of integer codes, with CPU kernels only (timed on drawn codes)
ROLES = ("target", "draft")
LAYERS = (2, 6)  # depths timed; the model's depth is extrapolated from these two
VERIFY_ROWS = 5  # rows of the timed verification forward (k = 4 drafts + the target's token)
REPEATS = 7  # timed forwards per depth and size, the two depths interleaved; the fastest is kept (noise only adds)
SCREEN_REPEATS = 2  # repeats every format gets; the rest only where these score under SCREEN_MARGIN × the best
SCREEN_MARGIN = 1.5  # a format this much slower than one already timed is not timed further: it cannot win
METHOD = 8  # bump when what a format calibration measures changes (8: the int4 target on the compiled product)


@dataclass
class FormatTiming:
    """One format's measured forward times at the model's depth (seconds, extrapolated)."""

    format: str
    step_s: float  # a one-token forward after CONTEXT_TOKENS tokens
    verify_s: float  # a VERIFY_ROWS-token forward after CONTEXT_TOKENS tokens

    @property
    def score_s(self) -> float:
        """A one-token step plus a VERIFY_ROWS-token forward: a target's plain step and verification, so a fast
        step with a costly verification does not win (`round_s`)."""
        return self.step_s + self.verify_s

    def round_s(self, role: str) -> float:
        """What a format is chosen by for `role`: a target's `score_s`; a draft's VERIFY_ROWS - 1 proposals and one
        forward over several tokens (a round of VERIFY_ROWS - 1 drafts as the target verifies it)."""
        return self.score_s if role == "target" else (VERIFY_ROWS - 1) * self.step_s + self.verify_s

    @property
    def verify_steps(self) -> float:
        """v(VERIFY_ROWS): the verification forward in one-token steps."""
        return self.verify_s / self.step_s


@dataclass
class FormatChoice:
    """The format chosen for one role, why, and what every candidate measured."""

    role: str  # "target" or "draft"
    chosen: str  # one of FORMATS
    reason: str  # one sentence
    timings: list[FormatTiming]
    key: str  # what was measured: hardware, torch, kernel path, shapes, candidates
    measured_now: bool = field(default=False)  # False when read from the cache

    def ranked(self) -> list[FormatTiming]:
        """The candidates' timings, fastest for the role (`FormatTiming.round_s`) first."""
        return sorted(self.timings, key=lambda t: t.round_s(self.role))

    def describe(self) -> str:
        """One line per candidate, fastest for the role first, the chosen one marked."""
        lines = [f"{self.role} format: {self.chosen} ({self.reason})"]
        for t in self.ranked():
            mark = "*" if t.format == self.chosen else " "
            lines.append(f" {mark} {t.format:<13} step {t.step_s * 1e3:7.1f} ms   v({VERIFY_ROWS}) {t.verify_steps:4.2f}"
                         f"{'   row-invariant' if t.format in ROW_INVARIANT else ''}")
        return "\n".join(lines)


DRAFT_ONLY = ("int8-dynamic", "int4-dynamic")  # a draft's forms (rows coupled, or not the row-invariant bits)
DERIVED = {"int8-dynamic": ("int8", quant.couple_rows),  # format: (the format whose stored model it is made from,
           "int4-dynamic": ("int4", quant4.dynamic_rows),  # and how): a draft's forms, and the int4 target on the
           "int4": ("int4", quant4.rows_on_product)}  # compiled product where it builds


def candidates(device: str = "cpu", role: str = "draft") -> tuple[str, ...]:
    """The formats "auto" may choose for `role` on `device`: for a draft every format with kernels there; for a
    target only the row-invariant ones where the device has any, else all but DRAFT_ONLY."""
    available = tuple(f for f in FORMATS if (device == "cpu" or f not in CPU_ONLY)
                      and (f != "int4-dynamic" or native.library() is not None))
    if role == "draft":
        return available
    return tuple(f for f in available if f in ROW_INVARIANT) or tuple(f for f in available if f not in DRAFT_ONLY)


def choose_format(config, role: str, *, device: str = "cpu", recalibrate: bool = False,
                  cache_dir: str | Path | None = None, repeats: int = REPEATS) -> FormatChoice:
    """The fastest format for `role` of a model with this transformers `config`, on this machine (see module doc)."""
    _check_role(role)
    key, timings = (None, None) if recalibrate else _cached(config, role, device, cache_dir)
    measured_now = timings is None
    if measured_now:
        key, path = _stored(config, device, role, cache_dir)
        timings = time_formats(config, candidates(device, role), device=device, repeats=repeats)
        files.write_text(path, json.dumps([asdict(t) for t in timings]))
    return _choose(role, timings, key, device, measured_now)


def cached_choice(config, role: str, *, device: str = "cpu",
                  cache_dir: str | Path | None = None) -> FormatChoice | None:
    """The choice `choose_format` returns from its cache, or None where this machine has not measured the
    architecture yet: it never measures."""
    _check_role(role)
    key, timings = _cached(config, role, device, cache_dir)
    return None if timings is None else _choose(role, timings, key, device, measured_now=False)


def _check_role(role: str) -> None:
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")


def _stored(config, device: str, role: str, cache_dir: str | Path | None) -> tuple[str, Path]:
    """(key, cache file) of the timings of `role`'s candidates for `config` on `device`."""
    key = _key(config, candidates(device, role), device)
    folder = Path(cache_dir) if cache_dir is not None else cache.root() / "costs"
    return key, folder / f"formats-{key}.json"


def _cached(config, role: str, device: str, cache_dir) -> tuple[str | None, list[FormatTiming] | None]:
    """(key, timings) cached for `role`, or (None, None): a target also reads a draft's calibration of the same
    architecture (its candidates include the target's), so one calibration serves a model in both roles."""
    for measured_for in dict.fromkeys((role, "draft")):
        key, path = _stored(config, device, measured_for, cache_dir)
        timings = _read(path)
        if timings is not None:
            return key, timings
    return None, None


def _choose(role: str, timings: list[FormatTiming], key: str, device: str, measured_now: bool) -> FormatChoice:
    timings = [t for t in timings if t.format in candidates(device, role)]
    best = min(timings, key=lambda t: t.round_s(role))
    if role == "draft":
        reason = (f"the fastest here, {VERIFY_ROWS - 1} steps plus a {VERIFY_ROWS}-token forward; a draft's "
                  "precision never changes the output")
    elif best.format in ROW_INVARIANT:
        reason = ("the fastest here, step plus verification, of the formats whose verification rows are its "
                  "one-token steps (the others are not timed for a target)")
    else:
        reason = "the fastest here, step plus verification (no row-invariant format on this device)"
    return FormatChoice(role, best.format, reason, timings, key, measured_now)


def time_formats(config, formats, *, device: str = "cpu", repeats: int = REPEATS) -> list[FormatTiming]:
    """Each format's one-token and VERIFY_ROWS-token forward at `config`'s depth, from random-weight models at the
    depths LAYERS (the two depths of a format interleaved by `specdec.core.timing.interleaved`, the fastest of
    `repeats` kept: noise only adds). Each format's model is made for it alone, at the deeper depth: a float one
    has its random weights drawn in its own dtype; an int8 or 4-bit one has its codes drawn (`_drawn`) on a
    model whose float weights are never filled (nor read); int8-dynamic is the int8 model just timed, its rows
    coupled, and int4-dynamic the int4 one (`DERIVED`). The shallower depth is a view of the deeper model's first layers (`at_depth`), and one format's model
    is alive at a time. The integer formats are timed first (the cheapest to make); a format whose first
    SCREEN_REPEATS already score SCREEN_MARGIN times the fastest timed so far keeps those (`_timed`)."""
    deep = functools.partial(random_model, config, max(LAYERS), device)
    formats = list(formats)
    ordered = sorted(formats, key=lambda f: f not in CPU_ONLY)  # stable: int8 and int4 stay just before their DERIVED
    with quant.weights_kept():  # the DERIVED forms take the model's weights as they are, never unpacked
        timings = _time_each(deep, config.num_hidden_layers, ordered, repeats)
    return sorted(timings, key=lambda t: formats.index(t.format))  # in the order asked


def _time_each(deep, depth: int, formats, repeats: int) -> list[FormatTiming]:
    timings, last = [], None  # the last format timed and its model
    for format_ in formats:
        source, derive = DERIVED.get(format_, (None, None))
        if last is not None and last[0] == source != format_:
            model = derive(last[1])  # the model just timed in its draft's form: as to_format makes it
        elif format_ in CPU_ONLY:
            model = _drawn(deep(values=False), format_)
        else:
            model = _drawn(deep(dtype=_dtype(format_)), format_)
        bar = min((t.score_s for t in timings), default=float("inf")) * SCREEN_MARGIN
        timings.append(_timed(model, depth, format_, repeats, bar))
        last = (format_, model) if format_ in ("int8", "int4") else None
        del model  # before the next format's model is made: one format's model alive at a time
    return timings


def _timed(deep: torch.nn.Module, depth: int, format_: str, repeats: int, bar: float = float("inf")) -> FormatTiming:
    """`format_`'s timing from `deep` (SCREEN_REPEATS repeats first; the rest only where those score under
    `bar`)."""
    caches = {layers: primed_cache(at_depth(deep, layers)) for layers in LAYERS}
    for lm, base in caches.values():
        forward_seconds(lm, base, 1)  # warm-up
    forwards = {(layers, n): functools.partial(forward_seconds, *caches[layers], n)
                for layers in LAYERS for n in (1, VERIFY_ROWS)}
    screen = min(SCREEN_REPEATS, repeats)
    samples = interleaved(forwards, screen)
    if repeats > screen and _extrapolated(samples, depth, format_).score_s < bar:
        for key, values in interleaved(forwards, repeats - screen).items():
            samples[key] += values
    return _extrapolated(samples, depth, format_)


def _extrapolated(samples: dict, depth: int, format_: str) -> FormatTiming:
    """The timing at `depth` from the fastest sample of each (layers, rows): t(L) = t(low) + (L - low)·per_layer."""
    fastest = {key: min(values) for key, values in samples.items()}
    low, high = LAYERS

    def at(n: int) -> float:
        per_layer = max(fastest[(high, n)] - fastest[(low, n)], 0.0) / (high - low)
        return fastest[(low, n)] + (depth - low) * per_layer

    return FormatTiming(format_, at(1), at(VERIFY_ROWS))


def build(config, format_: str, layers: int, device: str = "cpu") -> torch.nn.Module:
    """A random-weight model of `config`'s architecture with `layers` decoder layers, in `format_`, in eval mode."""
    return _drawn(random_model(config, layers, device, values=format_ not in CPU_ONLY, dtype=_dtype(format_)), format_)


def _drawn(model: torch.nn.Module, format_: str) -> torch.nn.Module:
    """A random-weight `model` in `format_`, its int8 and 4-bit codes drawn for each weight's shape rather than
    quantized from its values (`quant.random_codes`): the same shapes, so the same timings, made in far less time."""
    with quant.random_codes():
        return to_format(model, format_)


def random_model(config, layers: int, device: str = "cpu", values: bool = True,
                 dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """A model of `config`'s architecture in `dtype` with `layers` decoder layers and random unit-scale weights
    (values=False: its matrices left unfilled, for a format that draws its own codes, `_drawn`)."""
    with no_init_weights():  # values are filled below, cheaply: timings depend on shapes, not values
        model = AutoModelForCausalLM.from_config(_config_at_depth(config, layers), dtype=dtype).eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # unit-scale activations: tiny weights would decay them to subnormals, slow on a CPU
        for name, parameter in model.named_parameters():
            if parameter.dim() == 1:
                parameter.fill_(0.0 if name.endswith("bias") else 1.0)  # norms 1, biases 0
            elif values:  # uniform of std in**-0.5, a period drawn and repeated (drawing every value took seconds)
                bound = (3 / parameter.shape[-1]) ** 0.5
                parameter.copy_(quant.repeated(
                    lambda count: torch.empty(count).uniform_(-bound, bound, generator=generator), parameter.shape))
    return model.to(device)


def at_depth(model: torch.nn.Module, layers: int) -> torch.nn.Module:
    """A view of `model` that runs only its first `layers` decoder layers: the same modules (weights shared, nothing
    copied), with a config of that depth (transformers' decoders run `layers[:num_hidden_layers]`, and a cache
    made from the view's config has that many layers)."""
    view, inner = copy.copy(model), copy.copy(model.base_model)
    view._modules, inner._modules = dict(model._modules), dict(model.base_model._modules)
    setattr(view, model.base_model_prefix, inner)
    view.config = inner.config = _config_at_depth(model.config, layers)
    return view


def _config_at_depth(config, layers: int):
    shallow = copy.deepcopy(config)
    shallow.num_hidden_layers = layers
    for name in ("layer_types", "mlp_only_layers"):  # per-layer lists follow the depth
        if isinstance(getattr(shallow, name, None), list):
            values = getattr(shallow, name)
            setattr(shallow, name, (values * layers)[:layers] if values else values)  # deeper than the model: repeat
    return shallow


def format_of(model: torch.nn.Module) -> str:
    """The weight format a model runs in, read off its layers (one of FORMATS; another float dtype by its name):
    int4 where a layer is 4-bit and attention row by row (`quant4.rows_on_product` or torch's kernel), int4-dynamic
    where a layer is on the compiled product and attention is not, int8-dynamic where its int8 layers run fbgemm's
    coupled rows, int8, else the dtype of its parameters."""
    layers = [m for m in model.modules()
              if isinstance(m, (quant.Int8Linear, quant4.Int4Linear, quant4.Int4DynamicLinear))]
    if any(isinstance(m, quant4.Int4DynamicLinear) for m in layers):
        return "int4" if model.config._attn_implementation == quant.ROWWISE_ATTENTION else "int4-dynamic"
    if any(isinstance(m, quant4.Int4Linear) for m in layers):
        return "int4"
    if any(m.coupled is not None for m in layers):
        return "int8-dynamic"
    if layers:
        return "int8"
    return str(next(model.parameters()).dtype).removeprefix("torch.")


def _dtype(format_: str) -> torch.dtype:
    return torch.bfloat16 if format_ == "bfloat16" else torch.float32


def to_format(model: torch.nn.Module, format_: str) -> torch.nn.Module:
    """`model` (float32 or bfloat16 as loaded) in `format_`, with the load-time speed levers; in place."""
    source, derive = DERIVED.get(format_, (format_, None))
    if source == "int8":
        quant.quantize_int8(model.float())
    elif source == "int4":
        quant4.quantize_int4(model.float())
    else:
        apply_speed_levers(model)
    return derive(model) if derive is not None else model


def _key(config, formats, device: str) -> str:
    shapes = {name: getattr(config, name, None) for name in (
        "model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
        "num_key_value_heads", "vocab_size", "tie_word_embeddings")}
    about = {"hardware": hardware.describe(device), "method": METHOD, "int8_kernel": quant.kernel_path(),
             "shapes": shapes, "formats": list(formats), "context": CONTEXT_TOKENS}
    return files.json_key(about)


def _read(path: Path) -> list[FormatTiming] | None:
    try:
        return [FormatTiming(**row) for row in json.loads(path.read_text())]
    except (OSError, ValueError, TypeError):
        return None  # absent or unreadable: measured again
