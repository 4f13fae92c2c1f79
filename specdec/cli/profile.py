"""`python -m specdec profile`: where a round's time goes on this machine.

Prints the verification cost curve v(n) (a target forward over n new tokens, in one-token steps),
the draft's cost c and the speedup they predict at a few acceptance rates (`specdec.costs`); with
`--kernels`, the Linear kernels behind them for the target's shapes (float32 F.linear, float32
rows-first W @ x.T, bfloat16 F.linear) by rows.
"""
from __future__ import annotations

import statistics
import time

import torch

from ..costs import calibrate
from ..inputs import unwrap
from ..limits import K_AUTO_MAX
from ..models import add_model_arguments, load_draft, load_model

ALPHAS = (0.6, 0.8, 0.9)  # acceptance rates the predicted speedup is printed for
KERNEL_ROWS = (1, 2, 5, 8)  # rows of the kernel table (tokens in one forward)


def register(subparsers) -> None:
    p = subparsers.add_parser("profile", help="measure v(n), the draft's c and the speedup they predict")
    add_model_arguments(p)
    p.add_argument("--draft", help="draft whose cost c to measure (a model, lookup, self:L, MODEL+lookup)")
    p.add_argument("--recalibrate", action="store_true", help="measure again instead of reading the cache")
    p.add_argument("--kernels", action="store_true", help="also time the Linear kernels of the target's shapes")
    p.set_defaults(func=run)


def run(args) -> int:
    target = load_model(args.target, dtype=args.dtype, quant=args.quant)
    draft = load_draft(args.draft, target) if args.draft else None
    costs = calibrate(target, draft, recalibrate=args.recalibrate)
    source = "measured now" if costs.measured_now else "cached; --recalibrate measures again"
    print(f"{target.name} ({target.dtype}, {torch.get_num_threads()} threads), {source}")
    print(f"one-token target step: {costs.target.step_s * 1000:.1f} ms")
    print("n new tokens | ms   | v(n)")
    for n, v in enumerate(costs.target.verify, start=1):
        print(f"{n:12d} | {v * costs.target.step_s * 1000:6.1f} | {v:.2f}")
    if draft is not None:
        print(f"draft {args.draft}: c = {costs.draft_cost:.3f} target steps per draft forward")
        print("predicted speedup E/(v(k+1)+k·c):  k = " + " ".join(f"{k:5d}" for k in range(1, K_AUTO_MAX + 1)))
        for alpha in ALPHAS:
            print(f"  α = {alpha:.1f}" + " " * 26 + " ".join(f"{costs.predicted_speedup(alpha, k):5.2f}"
                                                          for k in range(1, K_AUTO_MAX + 1)))
    if args.kernels:
        print_kernels(target)
    return 0


def print_kernels(target) -> None:
    """Median ms of each kernel on the target's MLP and LM-head shapes, by rows."""
    model, _ = unwrap(target, None)
    head = model.get_output_embeddings().weight
    up = next(m.weight for m in model.modules() if isinstance(m, torch.nn.Linear) and m.weight.shape[0] > head.shape[1])
    for name, weight in (("MLP", up), ("LM head", head)):
        w32 = weight.detach().float()
        w16 = w32.to(torch.bfloat16)
        for rows in KERNEL_ROWS:
            x = torch.randn(rows, w32.shape[1])
            times = [_median_ms(lambda: torch.nn.functional.linear(x, w32)), _median_ms(lambda: (w32 @ x.T).T),
                     _median_ms(lambda: torch.nn.functional.linear(x.to(torch.bfloat16), w16))]
            print(f"{name:8s} {list(w32.shape)} rows={rows}: float32 F.linear {times[0]:6.1f} ms | "
                  f"float32 W @ x.T {times[1]:6.1f} ms | bfloat16 F.linear {times[2]:6.1f} ms")


def _median_ms(run, repeats: int = 7) -> float:
    run()
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds) * 1000
