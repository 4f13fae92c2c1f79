"""The Theory vs measurement tab: Leviathan's formulas for any α, c and verification cost v(k+1), the cost
waterfall at one k, and a measured k sweep with the live tab's pair and prompt. "Predict on hardware" prices
them with a bundled cost profile's v(n) and c instead: the acceptance measured here, the costs measured there."""
from __future__ import annotations

from functools import partial

import gradio as gr
import pandas as pd

from specdec.core.limits import K_UI_MAX
from specdec.core.trace import measured_speedup
from specdec.costs.profile import CostProfile, predict_for
from specdec.costs.waterfall import theory_steps
from specdec.lab import plots as figures

from specdec.dashboard.config import AppConfig
from specdec.dashboard.events import DECODE, on_gpu, private
from specdec.dashboard.handlers import check_prompt, run_baseline, run_speculative, user_errors, waterfall_figure
from specdec.dashboard.hub import ModelHub
from specdec.dashboard.profiles import chosen_profile, hardware_dropdown
from specdec.dashboard.runs import DecodeRequest, StopToken, partial_result

SWEEP_KS = (1, 2, 3, 4, 6, 8, 10)  # k values of the sweep

THEORY_MD = r"""
### The formulas (Leviathan, Kalman & Matias 2023)
- **α** — per-token acceptance rate: the chance the target keeps a draft token (estimated by
  α̂ = accepted / (accepted + rejections)).
- **k** — draft tokens proposed per round (the papers' γ).
- **c** — cost ratio: one draft step ÷ one target step, both reading one token.
- **v(k+1)** — what verifying k+1 tokens in one forward costs, in one-token target steps (1 in the paper;
  more where the hardware cannot read k+1 tokens for the price of one, e.g. float32 on a CPU: the slider above).
- **Tokens per target forward**: $\frac{1-\alpha^{k+1}}{1-\alpha}$ (→ k+1 as α → 1). This is the speedup
  if drafting and verification were free.
- **Leviathan's bound** on wall-time speedup: $\frac{1-\alpha^{k+1}}{(1-\alpha)(kc+1)}$. Each round pays k
  draft steps (kc) plus one verification assumed to cost one step. If α > c, already k = 1 gains
  ((1+α)/(1+c) > 1); the best k is the argmax over k, often larger.
- **Predicted speedup**: $\frac{1-\alpha^{k+1}}{(1-\alpha)(v(k+1)+kc)}$ — verification priced as measured.
- **Measured speedup**: tokens/s speculative ÷ tokens/s of the target alone, same prompt and length. The
  waterfall (below, and in the live tab after a run) walks from tokens per forward to it one cost at a time:
  drafting, verification, the rounds as they ran, prefill, and the remaining per-round overhead.
"""


def build(config: AppConfig, hub: ModelHub, live, profiles: dict[str, CostProfile]) -> list:
    """The tab's components and events; the sweep decodes with the live tab's settings `live` (a
    `live.Settings`); `profiles` are the bundled cost profiles "predict on hardware" offers. Returns the events
    after which the model lists are read again."""
    with gr.Tab("Theory vs measurement", id="theory"):
        sweep_points = gr.State(dict)  # per session: the last sweep (points, measured v(n))
        with gr.Row():
            with gr.Column(scale=1, min_width=300):
                alpha = gr.Slider(0.0, 1.0, value=0.7, step=0.01, label="α (acceptance rate)")
                cost = gr.Slider(0.0, 1.0, value=0.3, step=0.01, label="c (one draft step / one target step)")
                slope = gr.Slider(0.0, 1.0, value=0.0, step=0.01, elem_id="v-slope",
                                  label="verification cost per extra token: v(k+1) = 1 + slope·k",
                                  info="0 = Leviathan's assumption; a sweep sets the measured slope")
                k_max = gr.Slider(2, K_UI_MAX, value=K_UI_MAX, step=1, label="largest k shown (and swept)",
                                  elem_id="k-max")
                hardware = hardware_dropdown(profiles, "theory-hardware")
                hardware_status = gr.Markdown(elem_id="theory-hardware-status")
                sweep_run = gr.Button(f"Measure a k sweep (k in {', '.join(map(str, SWEEP_KS))}, up to the "
                                      "largest k) with the live tab's pair and prompt", elem_id="sweep-run")
                gr.Markdown(THEORY_MD, latex_delimiters=[{"left": "$", "right": "$", "display": False}])
            with gr.Column(scale=2):
                plot = gr.Plot(theory_figure(0.7, 0.3, 0.0, K_UI_MAX, {}), elem_id="theory-plot")
                waterfall_k = gr.Slider(1, K_UI_MAX, value=4, step=1, label="k of the waterfall",
                                        elem_id="waterfall-k")
                waterfall = gr.Plot(theory_waterfall(0.7, 0.3, 0.0, 4), elem_id="theory-waterfall")
                status = gr.Markdown(elem_id="sweep-status")
                table = gr.DataFrame(label="k sweep", elem_id="sweep-table")

    for slider in (alpha, cost, slope, k_max):
        private(slider.change, theory_figure, [alpha, cost, slope, k_max, sweep_points], plot, concurrency_limit=None)
    for slider in (alpha, cost, slope, waterfall_k):
        private(slider.change, theory_waterfall, [alpha, cost, slope, waterfall_k], waterfall, concurrency_limit=None)
    private(hardware.change, partial(hardware_costs, profiles), [hardware, live.draft],
            [cost, slope, hardware_status], queue=False)
    swept = private(sweep_run.click, on_gpu(partial(k_sweep, hub, profiles), config),
                    [live.target, live.draft, live.bridge, live.prompt, live.max_new, k_max, hardware],
                    [plot, alpha, cost, slope, table, sweep_points, status], concurrency_id=DECODE)
    return [swept]


def theory_figure(alpha, c, slope, k_max, sweep: dict | None):
    """The chart for slider values α, c, v slope and the last sweep's measurements."""
    sweep = sweep or {}
    return figures.speedup_curves(float(alpha), float(c), int(k_max), [tuple(p) for p in sweep.get("points", [])],
                                  float(slope), sweep.get("verify"))


@user_errors
def hardware_costs(profiles: dict[str, CostProfile], hardware, draft) -> tuple:
    """(c, v slope, status) of the chosen hardware for the live tab's draft: the profile's, or the sliders left as
    they are (this machine, or a profile without a c for that draft)."""
    profile = chosen_profile(profiles, hardware)
    if profile is None:
        return gr.skip(), gr.skip(), "costs of this machine: the sliders, or what a k sweep measures here"
    if draft not in profile.drafts:
        return gr.skip(), gr.skip(), f"{profile.title}: no c for draft {draft} there, the sliders are left as they are"
    costs = profile.costs(draft)
    return (round(costs.draft_cost, 3), round(costs.verify_slope(), 3),
            f"c and v(n) of {profile.title} (target {profile.target}, draft {draft}); a k sweep prices the α̂ "
            "measured here with them")


@user_errors
def k_sweep(hub: ModelHub, profiles: dict[str, CostProfile], target, draft, bridge, prompt, max_new_tokens, k_max,
            hardware, progress=gr.Progress(track_tqdm=True)):
    """Measure speedup at several k on one pair and prompt; yield (figure, α, c, v slope, table, sweep, status).

    α and c are pooled over all rounds of the sweep; v(n) is the pair's calibration (`specdec.costs.calibration`).
    With a profile chosen (`hardware`), c and the v slope are the profile's, and each k's row adds the speedup
    predicted there from that k's α̂ per position (or why the profile cannot say).
    """
    ks = [k for k in SWEEP_KS if k <= int(k_max)]
    profile = chosen_profile(profiles, hardware)
    request = DecodeRequest.from_inputs(target, draft, prompt, ks[-1], max_new_tokens).checked(hub.config)
    token = StopToken(hub.config.request_budget())
    target_model, draft_model = hub.pair(request.target, request.draft, bridge, progress=progress, budget=token.budget)
    check_prompt(target_model, request, token.budget)
    costs = hub.costs(target_model, draft_model, progress=progress, budget=token.budget)
    unpriced = profile.unpriced(target_model.name, request.draft) if profile is not None else None
    priced = profile.costs(request.draft) if profile is not None and not unpriced else costs  # the curves' costs
    slope = round(priced.verify_slope(), 3)
    baseline = run_baseline(target_model, request, request.max_new_tokens, token)
    sweep, rows, rounds = {"points": [], "verify": costs.target.verify}, [], []
    for k in ks:
        result = run_speculative(target_model, draft_model, DecodeRequest(**{**request.__dict__, "k": k}),
                                 token.running, costs, token.budget)
        rounds.extend(result.rounds)
        sweep["points"].append((k, measured_speedup(result.stats, baseline.stats)))
        rows.append({"k": k, "α̂": round(result.stats.acceptance_rate, 3), "c": round(result.stats.cost_ratio, 3),
                     "v(k+1)": round(costs.v(k + 1), 2), "tokens/s": round(result.stats.tokens_per_s, 2),
                     "measured speedup": round(sweep["points"][-1][1], 2),
                     "predicted": round(result.stats.predicted_speedup, 2),
                     "Leviathan bound": round(result.stats.leviathan_bound, 2)})
        if profile is not None:
            there = predict_for(profile, target_model.name, request.draft, result.stats.per_position_acceptance, k)
            rows[-1][f"predicted on {profile.label}"] = there if isinstance(there, str) else round(there.speedup, 2)
        pooled = partial_result(rounds, max(ks), costs).stats
        alpha, c = round(pooled.acceptance_rate, 3), round(priced.draft_cost, 3)
        status = "done" if k == ks[-1] else f"measured k = {k} ({len(sweep['points'])}/{len(ks)})…"
        status = token.reason if token.stopped else status
        if profile is not None:
            status += (f"; {profile.title}: {unpriced}, the curves price this machine's costs" if unpriced else
                       f"; the curves price c and v(n) of {profile.title}, the points are measured here")
        yield theory_figure(alpha, c, slope, k_max, sweep), alpha, c, slope, pd.DataFrame(rows), sweep, status
        if token.stopped:
            return


def theory_waterfall(alpha: float, c: float, slope: float, k: int):
    """The waterfall at k: Eq. 1 -> Leviathan's bound -> verification at v(k+1) = 1 + slope·k."""
    k = int(k)
    return waterfall_figure(theory_steps(float(alpha), k, float(c), 1.0 + float(slope) * k),
                            f"at k = {k}: tokens per forward → drafting → verification")
