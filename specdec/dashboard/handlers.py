"""Event handlers: plain functions from input values to output values (testable without a browser).

The first parameter of each model handler is the `ModelHub` (bound with functools.partial in
`specdec.dashboard.layout`). Bad input raises ValueError inside; `user_errors` turns it into a visible gr.Error.
"""
from __future__ import annotations

import functools
import html
import inspect
from pathlib import Path
from typing import NamedTuple

import gradio as gr
import pandas as pd

from specdec.core.engine import autoregressive_generate, speculative_generate
from specdec.core.limits import K_AUTO_MAX
from specdec.core.suites import available_suites
from specdec.core.trace import GenerationResult, measured_speedup
from specdec.lab.report import STAT_LINES, baseline_lines
from specdec.models import aligned
from specdec.training import service

from specdec.dashboard import jobs, teach
from specdec.dashboard.chips import chips_html
from specdec.dashboard.config import PROMPTS
from specdec.dashboard.hub import ModelHub, stages
from specdec.dashboard.panels import round_table, stats_html
from specdec.dashboard.runs import AUTO, DecodeRequest, RunControl, StopToken, partial_result, stream
from specdec.lab import plots as figures

SWEEP_KS = (1, 2, 3, 4, 6, 8, 10)  # k values of the theory tab's sweep


def user_errors(handler):
    """Show a ValueError (bad input, with the engine's message) as a gr.Error; the app keeps serving."""
    if inspect.isgeneratorfunction(handler):
        @functools.wraps(handler)
        def generator(*args, **kwargs):
            try:
                yield from handler(*args, **kwargs)
            except ValueError as error:
                raise gr.Error(str(error), print_exception=False) from error
        return generator

    @functools.wraps(handler)
    def plain(*args, **kwargs):
        try:
            return handler(*args, **kwargs)
        except ValueError as error:
            raise gr.Error(str(error), print_exception=False) from error
    return plain


class LiveView(NamedTuple):
    """Outputs of the live decode tab, in wiring order."""

    chips: str  # HTML chips of every round so far
    table: pd.DataFrame  # the round table (one row per round)
    acceptance: object  # plotly figure: running α̂
    histogram: object  # plotly figure: accepted tokens per round
    positions: object  # plotly figure: per-position acceptance
    stats: str  # HTML stat cards
    status: str  # one Markdown line: what is happening


def model_choices(hub: ModelHub, compare_columns: int):
    """Fresh dropdown choices (each label says ready / needs assembly / needs download as it is now)."""
    targets, drafts = hub.choices("target"), hub.choices("draft")
    return (gr.update(choices=targets), gr.update(choices=drafts), gr.update(choices=targets),
            *[gr.update(choices=drafts + [("(none)", "")]) for _ in range(compare_columns)])


def compare_columns(hub: ModelHub, target: str) -> list:
    """The compare tab's draft and vocabulary values for `target` (`ModelHub.compare_defaults`)."""
    return [gr.update(value=value) for column in hub.compare_defaults(target or None) for value in column]


def preset_prompt(name: str) -> str:
    return PROMPTS.get(name, "")


def stop(control: RunControl) -> str:
    control.stop()
    return "stopping after the current round…"


@user_errors
def live_decode(hub: ModelHub, target, draft, bridge, prompt, k, max_new_tokens, sampling, temperature, top_p, seed,
                measure_baseline, control: RunControl, progress=gr.Progress(track_tqdm=True)):
    """Stream a speculative decode round by round, then (optionally) the target-alone baseline.

    While the decode runs only the chips and the status line are redrawn (cheap), so rendering takes
    as little CPU from the decode as possible; figures, table and stats are drawn once it is done.
    The engine times itself and leaves its callback's time out, so page updates never enter the figures.
    """
    request = DecodeRequest.from_inputs(target, draft, prompt, k, max_new_tokens,
                                        temperature if sampling else 0.0, top_p, seed).checked(hub.config)
    token = control.start(hub.config.time_limit_s)
    if token.stopped:  # Stop was pressed while this request waited in the queue
        yield LiveView(*[gr.skip()] * 6, token.reason)
        return
    target_model, draft_model = hub.pair(request.target, request.draft, bridge, progress=progress)
    costs = hub.costs(target_model, draft_model, progress=progress)
    tokenizer = target_model.tokenizer
    result = None
    for update in stream(lambda on_round: _speculate(target_model, draft_model, request, on_round, costs), token):
        if isinstance(update, GenerationResult):
            result = update
            break
        partial = partial_result(update, request.k, costs)
        yield live_view(partial, tokenizer, request, f"decoding… {len(partial.rounds)} rounds, "
                                                     f"{len(partial.token_ids)} tokens", light=True)
    if result.stopped_early or not measure_baseline:
        note = token.reason if result.stopped_early else "done"
        teach.remember(control, result, None, tokenizer)  # for the waterfall and the downloads
        yield live_view(result, tokenizer, request, f"{note}: {len(result.token_ids)} tokens in {len(result.rounds)} "
                                                    f"rounds, {result.stats.wall_time_s:.2f} s")
        return
    yield live_view(result, tokenizer, request, "measuring the target alone on the same prompt and length…",
                    light=True)
    baseline = _baseline(target_model, request, len(result.token_ids), token.running)
    summary = "; ".join(baseline_lines(result, baseline, request.temperature == 0, target_model.dtype, tokenizer))
    teach.remember(control, result, baseline, tokenizer)
    yield live_view(result, tokenizer, request, f"done: {len(result.token_ids)} tokens in {len(result.rounds)} "
                                                f"rounds; {summary}", baseline)


def live_view(result: GenerationResult, tokenizer, request: DecodeRequest, status: str,
              baseline: GenerationResult | None = None, light: bool = False) -> LiveView:
    """Everything the live tab shows for `result` (complete or partial); `light`: chips and status only."""
    if light:
        skip = gr.skip()
        return LiveView(chips_html(result.rounds, tokenizer, request.prompt), skip, skip, skip, skip, skip, status)
    span = _k_span(request)
    return LiveView(
        chips=chips_html(result.rounds, tokenizer, request.prompt),
        table=round_table(result, tokenizer),
        acceptance=figures.running_acceptance(result.rounds, span),
        histogram=figures.accepted_length_histogram(result.rounds, span),
        positions=figures.per_position_acceptance(result.stats),
        stats=stats_html(result.stats, baseline.stats if baseline else None),
        status=status,
    )


@user_errors
def speculate(hub: ModelHub, target, draft, prompt, k, max_new_tokens, temperature, seed) -> dict:
    """API `speculate`: one speculative decode as JSON (GenerationResult.to_dict(): token ids, text, rounds, stats)."""
    request = DecodeRequest.from_inputs(target, draft, prompt, k, max_new_tokens, temperature, 1.0,
                                        seed).checked(hub.config)
    target_model, draft_model = hub.pair(request.target, request.draft)
    token = StopToken(hub.config.time_limit_s)
    costs = hub.costs(target_model, draft_model)
    return _speculate(target_model, draft_model, request, token.running, costs).to_dict()


@user_errors
def compare(hub: ModelHub, target, prompt, k, max_new_tokens, *drafts_and_bridges, progress=gr.Progress(track_tqdm=True)):
    """Decode the same prompt with each chosen draft, then the target alone; yield columns as they finish.

    drafts_and_bridges: draft name, bridge mode, draft name, bridge mode, ... (blank names are skipped).
    Yields ([chips HTML per column], stats table, bar chart, status).
    """
    pairs = list(zip(drafts_and_bridges[::2], drafts_and_bridges[1::2]))
    columns = len(pairs)
    chosen = [(i, name, bridge) for i, (name, bridge) in enumerate(pairs) if name]
    if not chosen:
        raise ValueError("pick at least one draft to compare")
    request = DecodeRequest.from_inputs(target, chosen[0][1], prompt, k, max_new_tokens).checked(hub.config)
    target_model = hub.target(request.target, progress=progress)
    token = StopToken(hub.config.time_limit_s)
    panels = ["<em>not run</em>"] * columns
    results: dict[str, GenerationResult] = {}
    for i, name, bridge in chosen:
        yield (*panels, None, None, f"decoding with draft {i + 1}: {name} ({bridge})…")
        try:
            draft = hub.draft(name, target_model, bridge=bridge)
            result = _speculate(target_model, draft, DecodeRequest(**{**request.__dict__, "draft": name}),
                                token.running, hub.costs(target_model, draft))
        except ValueError as error:  # one draft that cannot run says why; the others still run
            panels[i] = f'<div class="compare-error">⚠ {html.escape(f"{name} ({bridge}): {error}")}</div>'
            continue
        results[f"{i + 1}: {Path(name).name} ({bridge})"] = result  # a folder's last part keeps columns narrow
        panels[i] = chips_html(result.rounds, target_model.tokenizer, request.prompt)
    if not results:
        yield (*panels, None, None, "no draft could run: see the messages above")
        return
    yield (*panels, None, None, "measuring the target alone…")
    longest = max(len(r.token_ids) for r in results.values())
    baseline = _baseline(target_model, request, longest, token.running)
    yield (*panels, comparison_table(results, baseline), comparison_chart(results, baseline),
           f"done: {len(results)} draft(s) and the target alone ({baseline.stats.tokens_per_s:.2f} tokens/s)")


def comparison_table(results: dict[str, GenerationResult], baseline: GenerationResult) -> pd.DataFrame:
    """One row per STAT_LINES metric plus the measured speedup, one column per draft."""
    rows = [{"metric": label, **{name: fmt.format(getattr(r.stats, field)) for name, r in results.items()}}
            for field, label, fmt in STAT_LINES]
    rows.append({"metric": "measured speedup (tokens/s ÷ target alone)",
                 **{name: f"{measured_speedup(r.stats, baseline.stats):.2f}" for name, r in results.items()}})
    return pd.DataFrame(rows)


def comparison_chart(results: dict[str, GenerationResult], baseline: GenerationResult):
    metrics = ["α̂", "mean accepted length", "measured speedup"]
    series = [figures.Series(name, metrics, [r.stats.acceptance_rate, r.stats.mean_accepted_length,
                                             measured_speedup(r.stats, baseline.stats)], kind="bar")
              for name, r in results.items()]
    return figures.figure("aligned vs unaligned drafts", "", "value", series)


def theory_figure(alpha, c, slope, k_max, sweep: dict | None):
    """The theory tab's chart for slider values α, c, v slope and the last sweep's measurements."""
    sweep = sweep or {}
    return figures.speedup_curves(float(alpha), float(c), int(k_max), [tuple(p) for p in sweep.get("points", [])],
                                  float(slope), sweep.get("verify"))


@user_errors
def k_sweep(hub: ModelHub, target, draft, bridge, prompt, max_new_tokens, k_max, progress=gr.Progress(track_tqdm=True)):
    """Measure speedup at several k on one pair and prompt; yield (figure, α, c, v slope, table, sweep, status).

    α and c are pooled over all rounds of the sweep; v(n) is the pair's calibration (`specdec.costs.calibration`).
    """
    ks = [k for k in SWEEP_KS if k <= int(k_max)]
    request = DecodeRequest.from_inputs(target, draft, prompt, ks[-1], max_new_tokens).checked(hub.config)
    target_model, draft_model = hub.pair(request.target, request.draft, bridge, progress=progress)
    costs = hub.costs(target_model, draft_model, progress=progress)
    slope = round(costs.verify_slope(), 3)
    token = StopToken(hub.config.time_limit_s)
    baseline = _baseline(target_model, request, request.max_new_tokens, token.running)
    sweep, rows, rounds = {"points": [], "verify": costs.target.verify}, [], []
    for k in ks:
        result = _speculate(target_model, draft_model, DecodeRequest(**{**request.__dict__, "k": k}), token.running,
                            costs)
        rounds.extend(result.rounds)
        sweep["points"].append((k, measured_speedup(result.stats, baseline.stats)))
        rows.append({"k": k, "α̂": round(result.stats.acceptance_rate, 3), "c": round(result.stats.cost_ratio, 3),
                     "v(k+1)": round(costs.v(k + 1), 2), "tokens/s": round(result.stats.tokens_per_s, 2),
                     "measured speedup": round(sweep["points"][-1][1], 2),
                     "predicted": round(result.stats.predicted_speedup, 2),
                     "Leviathan bound": round(result.stats.leviathan_bound, 2)})
        pooled = partial_result(rounds, max(ks), costs).stats
        alpha, c = round(pooled.acceptance_rate, 3), round(costs.draft_cost, 3)
        status = "done" if k == ks[-1] else f"measured k = {k} ({len(sweep['points'])}/{len(ks)})…"
        status = token.reason if token.stopped else status
        yield theory_figure(alpha, c, slope, k_max, sweep), alpha, c, slope, pd.DataFrame(rows), sweep, status
        if token.stopped:
            return


def _speculate(target_model, draft_model, request: DecodeRequest, on_round=None, costs=None) -> GenerationResult:
    return speculative_generate(target_model, draft_model, request.prompt, k=request.k,
                                max_new_tokens=request.max_new_tokens, temperature=request.temperature,
                                top_p=request.top_p, seed=request.seed, on_round=on_round, costs=costs)


def _k_span(request: DecodeRequest) -> int:
    """Draft positions the charts show: k, or the controller's largest k for "auto"."""
    return K_AUTO_MAX if request.k == AUTO else request.k


def _baseline(target_model, request: DecodeRequest, new_tokens: int, on_round=None) -> GenerationResult:
    """The target alone on the same prompt and settings, for `new_tokens` tokens."""
    return autoregressive_generate(target_model, request.prompt, max_new_tokens=max(1, new_tokens),
                                   temperature=request.temperature, top_p=request.top_p, seed=request.seed,
                                   on_round=on_round)


# --- aligned drafts: prepare (transplant) and distil ----------------------------------------------------------

def distillable(hub: ModelHub) -> list[tuple[str, str]]:
    """(label, spec) of the aligned drafts not trained yet: what "Distil it" offers."""
    return [(aligned.label(c), c.spec) for c in hub.aligned_drafts() if c.method == "transplant"]


@user_errors
def prepare_aligned(hub: ModelHub, target, source, domain, name, progress=gr.Progress()):
    """Transplant `source` onto `target`'s tokenizer (no training) and register it; (status, distil dropdown)."""
    _training_allowed(hub)
    if domain not in available_suites():
        raise ValueError(f"domain must be one of the prompt suites: {', '.join(available_suites())}")
    name = aligned.check_name((name or "").strip() or aligned.name_for(f"{Path(source or '').name}-{domain}"))
    target_model = hub.target(target, progress=progress)
    source_model = hub.model(source, "draft", progress=progress, load_as="train")
    card = service.transplant(target_model, source_model, name=name, domain=domain, progress=stages(progress))
    return (f"prepared **{aligned.label(card)}**: pick `{card.spec}` in a draft list, or distil it below",
            gr.update(choices=distillable(hub), value=card.spec))


@user_errors
def start_distill(hub: ModelHub, spec, steps, progress=gr.Progress()) -> str:
    """Start distilling the aligned draft `spec` in the background; the job list shows its progress."""
    _training_allowed(hub)
    card = aligned.find(spec or "")
    if card is None:
        raise ValueError("pick an aligned draft to distil (prepare one first)")
    cap = hub.config.max_distill_steps
    steps = int(steps or 0)
    if not 1 <= steps <= cap:
        raise ValueError(f"steps must be an integer in 1..{cap} on this host (SPECDEC_MAX_DISTILL_STEPS)")
    target_model = hub.target(card.target, progress=progress)
    jobs.start(card.name, steps, lambda on_step: service.distil(target_model, card.name, steps=steps,
                                                               progress=on_step).spec)
    return f"distilling {card.name} for {steps} steps in the background: progress below (it survives a reload)"


def training_status(hub: ModelHub, known: list[str] | None, compare_columns: int) -> tuple:
    """The job list, the aligned drafts now registered, and fresh draft lists when those changed (else skips)."""
    lines = [job.line() for job in jobs.jobs()] or ["no distillation started since the app started"]
    names = [card.spec for card in hub.aligned_drafts()]
    if names == (known or []):
        return ("\n".join(lines), names, *[gr.skip()] * (compare_columns + 2))
    drafts = hub.choices("draft")
    return ("\n".join(lines), names, gr.update(choices=drafts),
            *[gr.update(choices=drafts + [("(none)", "")]) for _ in range(compare_columns)],
            gr.update(choices=distillable(hub)))


def _training_allowed(hub: ModelHub) -> None:
    if not hub.config.allow_training:
        raise ValueError("preparing and distilling aligned drafts is off on this host (SPECDEC_ALLOW_TRAINING=0)")
