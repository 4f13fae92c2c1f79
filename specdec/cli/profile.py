"""`python -m specdec profile`: where a round's time goes on this machine.

Prints the verification cost curve v(n) (a target forward over n new tokens, in one-token steps),
each draft's cost c and the speedup they predict at a few acceptance rates (`specdec.costs.calibration`); with
`--kernels`, the Linear kernels behind them for the target's shapes (float32 F.linear, float32
rows-first W @ x.T, bfloat16 F.linear) by rows.

Profiles that travel (`specdec.costs.profile`): `--save FILE` writes v(n), c per draft, dtype, device, the
hardware, the date and the code version as JSON; `generate`, `bench` and the bench's k advisor read it with
`--costs FILE` and predict the speedup on that machine from the acceptance measured on theirs.
`--random-weights` builds the target (and model drafts) from the catalogue's shipped architecture with random
weights (`specdec.models.random_weights`): v(n) and c depend on shapes, not values, so a machine without the
model files can be profiled:

    python -m specdec profile --target qwen2.5-coder-1.5b-instruct --draft qwen2.5-coder-0.5b-instruct lookup \
        --random-weights --save gpu.json

Per-forward overhead (any dtype; meant for `--quant int8`, where the GEMMs are fast and the rest of a forward
counts), instead of the cost curve:

    python -m specdec profile --target MODEL --quant int8 --levers [--repeats 15]
    python -m specdec profile --target MODEL --quant int8 --breakdown [--forwards 5]

`--levers` times the one-token step and the verification forward over 5 new tokens with no lever and with each
lever alone, interleaved in one process (none, lever, lever, ..., none, ...; medians of --repeats), and checks
each lever's greedy target-alone tokens against no lever (`specdec.lab.levers`):
- static-cache: keys/values written in place into preallocated storage (transformers' DynamicCache copies the
  whole cache with torch.cat every forward); rollbacks follow specdec.core.kv's one rule;
- compile: torch.compile of the model's forward, dynamic shapes; int8 GEMMs enter the graph as one custom op
  each (its compilation is the warm-up column, minutes on 2 cores; a failure to compile prints one line and the
  other levers carry on);
- sdpa-math: scaled_dot_product_attention's math backend instead of the default kernel.
The thread count stays the machine's. `--breakdown` profiles a few one-token steps and 5-token verifications
with torch.profiler and prints the CPU time per forward by group (GEMM, linear overhead, attention,
norms/rotary/elementwise, cache ops, other) and the top ops (`specdec.lab.breakdown`).
"""
from __future__ import annotations

import functools

import torch

from specdec.core.inputs import unwrap
from specdec.core.limits import K_AUTO_MAX
from specdec.core.timing import time_median, warm_up
from specdec.costs.calibration import calibrate, calibrate_drafts
from specdec.costs.profile import measured_profile, save_profile
from specdec.lab import breakdown, levers, paths
from specdec.lab.quality import quality_lines
from specdec.models import formats
from specdec.models.loading import LoadedModel, add_model_arguments, format_choice, load_draft, load_model
from specdec.models.random_weights import load_random

ALPHAS = (0.6, 0.8, 0.9)  # acceptance rates the predicted speedup is printed for
KERNEL_ROWS = (1, 2, 5, 8)  # rows of the kernel table (tokens in one forward)


def register(subparsers) -> None:
    p = subparsers.add_parser("profile", help="measure v(n), the draft's c and the speedup they predict; "
                                                       "--levers / --breakdown: per-forward overhead")
    add_model_arguments(p)
    p.add_argument("--draft", nargs="+", default=[],
                   help="drafts whose cost c to measure (models, lookup, self:L, MODEL+lookup)")
    p.add_argument("--random-weights", action="store_true",
                   help="build the target and model drafts from the catalogue's shipped architecture with random "
                        "weights (v(n) and c depend on shapes, not values): profile a machine without the model "
                        "files; nothing is written to the model cache")
    p.add_argument("--save", metavar="FILE",
                   help="write the cost profile (v(n), c per draft, dtype, device, hardware, date, code version) as "
                        "JSON, for `generate --costs FILE` and `bench --costs FILE` on another machine")
    p.add_argument("--recalibrate", action="store_true",
                   help="measure again (v(n), c and the int8 kernel of each weight shape) instead of reading the cache")
    p.add_argument("--kernels", action="store_true", help="also time the Linear kernels of the target's shapes")
    p.add_argument("--levers", nargs="?", const=",".join(levers.LEVERS), metavar="LIST",
                   help="instead: time the one-token step and v(5) with each overhead lever alone against none, "
                        f"interleaved ({', '.join(levers.LEVERS)}; default all): static-cache = KV written in place "
                        "into preallocated storage, compile = torch.compile of the forward (dynamic shapes), "
                        "sdpa-math = SDPA's math backend; also checks the greedy output is unchanged")
    p.add_argument("--repeats", type=int, default=15, help="--levers: timed repeats per lever (medians)")
    p.add_argument("--compile-mode", default=levers.COMPILE_MODE,
                   help="--levers: torch.compile mode (default, reduce-overhead, max-autotune-no-cudagraphs)")
    p.add_argument("--breakdown", action="store_true",
                   help="instead: torch.profiler over one-token steps and a 5-token verification, CPU time per "
                        "forward by group (GEMM, attention, norms/elementwise, cache ops, other) and top ops")
    p.add_argument("--forwards", type=int, default=5, help="--breakdown: profiled forwards of each kind")
    p.add_argument("--paths", action="store_true",
                   help="instead: every weight format's path, target and drafts in it, with random weights of the "
                        "real architecture: the bytes a one-token step reads, the floor they set at this machine's "
                        "read speed, the step, v(2..9) and each draft's c")
    p.set_defaults(func=run)


def run(args) -> int:
    if args.save and (args.levers or args.breakdown or args.paths):
        raise ValueError("--save writes the cost curve and the drafts' costs: not with --levers, --breakdown or "
                         "--paths")
    if args.paths:
        print_paths(*paths.measure_paths(args.target, args.draft, recalibrate=args.recalibrate))
        return 0
    target = (load_random(args.target, dtype="int8" if args.quant == "int8" else args.dtype)
              if args.random_weights else load_model(args.target, dtype=args.dtype, quant=args.quant))
    weights = " with random weights" if args.random_weights else ""
    if args.levers or args.breakdown:
        print(f"{target.name} ({target.dtype}, {torch.get_num_threads()} threads){weights}")
        if args.levers:
            print_levers(target.model, args.levers.split(","), args.repeats, args.compile_mode)
        if args.breakdown:
            print_breakdowns(target.model, args.forwards)
        return 0
    drafts = {spec: _draft(spec, target, args.draft_dtype, args.random_weights) for spec in args.draft}
    costs = calibrate_drafts(target, drafts, recalibrate=args.recalibrate)
    measured = list(costs.values()) or [calibrate(target, None, recalibrate=args.recalibrate)]
    curve = measured[0].target
    source = "measured now" if any(c.measured_now for c in measured) else "cached; --recalibrate measures again"
    print(f"{target.name} ({target.dtype}, {target.device}, {torch.get_num_threads()} threads){weights}, {source}")
    _print_formats(args, target, drafts)
    print(f"one-token target step: {curve.step_s * 1000:.1f} ms")
    print("n new tokens | ms   | v(n)")
    for n, v in enumerate(curve.verify, start=1):
        print(f"{n:12d} | {v * curve.step_s * 1000:6.1f} | {v:.2f}")
    for spec, pair in costs.items():
        print(f"draft {spec}: c = {pair.draft_cost:.3f} target steps per draft forward")
        print("predicted speedup E/(v(k+1)+k·c):  k = " + " ".join(f"{k:5d}" for k in range(1, K_AUTO_MAX + 1)))
        for alpha in ALPHAS:
            print(f"  α = {alpha:.1f}" + " " * 26 + " ".join(f"{pair.predicted_speedup(alpha, k):5.2f}"
                                                          for k in range(1, K_AUTO_MAX + 1)))
    if args.kernels:
        print_kernels(target)
    if args.save:
        profile = measured_profile(target, curve, {spec: pair.draft_cost for spec, pair in costs.items()},
                                   "random" if args.random_weights else "loaded")
        save_profile(profile, args.save)
        print(f"wrote the cost profile of {profile.label} to {args.save}")
    return 0


def _print_formats(args, target: LoadedModel, drafts: dict) -> None:
    """Where a format was chosen by measurement (--dtype / --draft-dtype auto): the choice, every candidate's
    timings and why; and what is known of the target formats' quality against the float model."""
    if args.random_weights:
        return
    if args.dtype == "auto" and args.quant == "none":
        print(format_choice(args.target, "target").describe())
    print("\n".join(quality_lines(target.name, target.dtype)))
    for spec, draft in drafts.items():
        if args.draft_dtype == "auto" and isinstance(draft, LoadedModel):
            print(format_choice(spec, "draft").describe())


def _draft(spec: str, target, dtype: str, random_weights: bool):
    """The draft `spec` for `target` in `dtype` (--draft-dtype): loaded as usual, or with random weights."""
    return paths.random_draft(spec, target, dtype) if random_weights else load_draft(spec, target, dtype=dtype)


def print_paths(bandwidth: float, rows: list[paths.PathRow]) -> None:
    """The table of `paths.measure_paths`: a row per format, the target's bytes, floor, step, the rate its step
    reads weights at and v(2..9), then each draft's bytes and c."""
    print(f"every format's path, random weights of the real architecture (bytes, v(n) and c depend on shapes); "
          f"memory read here: {bandwidth / 1e9:.1f} GB/s")
    drafts = list(rows[0].drafts) if rows else []
    print("format       | kind          | MB/step | floor ms | step ms | GB/s | v(2..9)" + " " * 34
          + "".join(f" | {spec} MB/step, c" for spec in drafts))
    for row in rows:
        kind = ("row-invariant" if row.format in formats.ROW_INVARIANT
                else "draft only" if row.format in formats.DRAFT_ONLY else "")
        cells = "".join(f" | {'—' if d.bytes is None else f'{d.bytes / 1e6:7.0f}'}, {d.cost:.3f}"
                        for d in row.drafts.values())
        print(f"{row.format:12s} | {kind:13s} | {row.bytes / 1e6:7.0f} | {row.floor_s(bandwidth) * 1e3:8.1f} | "
              f"{row.step_s * 1e3:7.1f} | {row.bytes / row.step_s / 1e9:4.1f} | "
              f"{' '.join(f'{v:4.2f}' for v in row.verify[1:])}{cells}")


def print_levers(model, names: list[str], repeats: int, compile_mode: str) -> None:
    """The lever table: medians, change against no lever, warm-up, output check; a line per lever that failed."""
    unknown = sorted(set(names) - set(levers.LEVERS))
    if unknown:
        raise ValueError(f"unknown lever(s) {', '.join(unknown)}; choose from {', '.join(levers.LEVERS)}")
    table = {**levers.LEVERS, "compile": functools.partial(levers.compiled_forward, mode=compile_mode)}
    rows, failures = levers.compare_levers(model, names, repeats, table)
    none = rows[0]
    n = levers.VERIFY_TOKENS
    print(f"lever        | step ms | v({n}) ms | Δ step  | Δ v({n})  | warm-up s | output "
          f"({repeats} repeats, interleaved)")
    for row in rows:
        print(f"{row.name:12s} | {row.step_s * 1000:7.2f} | {row.verify_s * 1000:7.2f} | "
              f"{_change(row.step_s, none.step_s)} | {_change(row.verify_s, none.verify_s)} | "
              f"{row.warmup_s:9.1f} | {row.identity}")
    for line in failures:
        print(line)


def _change(value: float, reference: float) -> str:
    return f"{(value / reference - 1) * 100:+6.1f}%"


def print_breakdowns(model, forwards: int) -> None:
    for title, new_tokens in (("one-token step", 1), (f"verification, {levers.VERIFY_TOKENS} new tokens",
                                                      levers.VERIFY_TOKENS)):
        breakdown.print_breakdown(title, breakdown.profile_forwards(model, new_tokens, forwards))
    weights = breakdown.weight_bytes_per_step(model)
    bandwidth = breakdown.read_bandwidth(weights)
    floor_s = weights / bandwidth
    print(f"memory floor: a one-token step reads {weights / 1e6:.0f} MB of weights; this machine reads "
          f"{bandwidth / 1e9:.1f} GB/s (the faster of a matrix-vector product and a sum over a large buffer), "
          f"so the weights alone take {floor_s * 1000:.1f} ms: at most {1 / floor_s:.1f} tokens/s for this target "
          "in this format")


def print_kernels(target) -> None:
    """Median ms of each kernel on the target's widest layer's and LM head's shapes, by rows (random float weights of
    those shapes: a product's time depends on its shape, and the target's own may be int8 or 4-bit)."""
    model, _ = unwrap(target, None)
    head = model.get_output_embeddings()
    in_head = {id(m) for m in head.modules()}  # the head and any layer it holds (a rescored head's 4-bit one)
    layers = [m for m in model.modules()
              if id(m) not in in_head and hasattr(m, "in_features") and hasattr(m, "out_features")]
    widest = [("MLP", max(layers, key=lambda m: m.out_features))] if layers else []
    for name, layer in (*widest, ("LM head", head)):
        w32 = torch.randn(layer.out_features, layer.in_features)  # the CPU's kernels, wherever the model lives
        w16 = w32.to(torch.bfloat16)
        for rows in KERNEL_ROWS:
            x = torch.randn(rows, w32.shape[1])
            times = [_median_ms(lambda: torch.nn.functional.linear(x, w32)), _median_ms(lambda: (w32 @ x.T).T),
                     _median_ms(lambda: torch.nn.functional.linear(x.to(torch.bfloat16), w16))]
            print(f"{name:8s} {list(w32.shape)} rows={rows}: float32 F.linear {times[0]:6.1f} ms | "
                  f"float32 W @ x.T {times[1]:6.1f} ms | bfloat16 F.linear {times[2]:6.1f} ms")


def _median_ms(run, repeats: int = 7) -> float:
    warm_up(run)
    return time_median(run, repeats, "cpu")[1] * 1000
