"""The Aligned vs unaligned tab: the same target and prompt with up to three drafts side by side (a draft of
another tokenizer naive, through the text bridge, or aligned), each with the speedup measured here and, when a
bundled cost profile is chosen, the speedup predicted on its hardware; and preparing an aligned draft: vocabulary
transplant, then distillation in a background job."""
from __future__ import annotations

import html
from functools import partial
from pathlib import Path
from typing import NamedTuple

import gradio as gr
import pandas as pd

from specdec.core.suites import available_suites
from specdec.core.trace import GenerationResult, measured_speedup
from specdec.costs.profile import CostProfile, Prediction, predict_for
from specdec.lab import plots as figures
from specdec.lab.report import STAT_LINES
from specdec.models import aligned
from specdec.training import service

from specdec.dashboard import jobs
from specdec.dashboard.chips import chips_html
from specdec.dashboard.config import AppConfig, K_CHOICES, PROMPTS
from specdec.dashboard.events import DECODE, on_gpu, private
from specdec.dashboard.handlers import NO_DRAFT, check_prompt, run_baseline, run_speculative, user_errors
from specdec.dashboard.hub import VOCABULARIES, ModelHub, stages
from specdec.dashboard.profiles import chosen_profile, hardware_dropdown
from specdec.dashboard.runs import DecodeRequest, StopToken

CSS = ".compare-error { color: #8a1c12; }\n"
INTRO = ("Same target, same prompt, up to three drafts. A draft with another tokenizer runs **naive** (its ids read "
         "as the target's ids, so acceptance collapses: the draft proposes tokens the target never meant) or through "
         "the **text bridge** (draft text re-tokenized for the target); an **aligned** draft was moved onto the "
         "target's tokenizer (vocabulary transplant, then distillation; prepare one at the bottom of this tab).")
PREPARE_MD = """A draft of another family speaks other token ids. **Prepare** gives it the target's tokenizer: the
embedding rows are copied by token string, and a token it lacks starts as the mean of its pieces (vocabulary
transfer, Gee et al. 2022); no training, a few seconds. **Distil it** then trains it on the target's
continuations of the domain's prompts (DistillSpec, Zhou et al. 2023) in the background, with checkpoints; the
distilled draft joins the draft lists when done, with its held-out α̂."""


class CompareTab(NamedTuple):
    target: gr.Dropdown  # the compared target
    drafts: list  # one draft dropdown per column
    finished: list  # events after which the model lists are read again


def build(config: AppConfig, hub: ModelHub, demo: gr.Blocks, model_box, live_draft: gr.Dropdown,
          profiles: dict[str, CostProfile]) -> CompareTab:
    """The tab's components and events; `live_draft` is the live tab's draft list, which a newly distilled
    draft joins too; `profiles` the bundled cost profiles the "predict on hardware" list offers."""
    custom = config.allow_custom_models
    with gr.Tab("Aligned vs unaligned", id="compare"):
        known = gr.State(list)  # per session: the aligned drafts its dropdowns list
        gr.Markdown(INTRO)
        with gr.Row():
            target = model_box(hub.choices("target"), value=hub.default("target"), label="target")
            prompt = gr.Textbox(next(iter(PROMPTS.values())), label="prompt", lines=2, elem_id="compare-prompt")
            k = gr.Dropdown(K_CHOICES, value="auto", label="k")
            max_new = gr.Slider(1, config.max_new_tokens_cap, value=min(32, config.max_new_tokens_cap), step=1,
                                label="max new tokens")
            hardware = hardware_dropdown(profiles, "compare-hardware")
        columns, panels = [], []  # columns: draft, vocabulary, draft, vocabulary, ...
        with gr.Row():
            for column, (name, mode) in enumerate(hub.compare_defaults()):
                with gr.Column():
                    columns.append(model_box(hub.choices("draft") + [NO_DRAFT], value=name,
                                             label=f"draft {column + 1}"))
                    columns.append(gr.Radio(list(VOCABULARIES), value=mode, label="vocabulary"))
                    panels.append(gr.HTML(elem_id=f"compare-chips-{column + 1}"))
        run = gr.Button("Compare", variant="primary", elem_id="compare-run")
        status = gr.Markdown(elem_id="compare-status")
        chart = gr.Plot(label="α̂, mean accepted length, measured speedup", elem_id="compare-plot")
        table = gr.DataFrame(label="metrics per draft", elem_id="compare-table")
        with gr.Accordion("Prepare an aligned draft: vocabulary transplant, then distillation", open=False,
                          elem_id="prepare-aligned"):
            gr.Markdown(PREPARE_MD if config.allow_training else
                        "Preparing and distilling aligned drafts is off on this host (SPECDEC_ALLOW_TRAINING).")
            with gr.Row():
                source = gr.Dropdown(hub.sources(), value=hub.default("unaligned-draft") or None,
                                     label="draft of another family", allow_custom_value=custom)
                domain = gr.Dropdown(available_suites(), value="code", label="domain (prompt suite)")
                name = gr.Textbox(label="name", placeholder="default: draft-domain", elem_id="prepare-name")
                prepare_run = gr.Button("Prepare (transplant, no training)", elem_id="prepare-run",
                                        interactive=config.allow_training)
            with gr.Row():
                distil_choice = gr.Dropdown(distillable(hub), label="aligned draft to distil", elem_id="distil-choice")
                distil_steps = gr.Number(min(50, config.max_distill_steps), precision=0, minimum=1,
                                         maximum=config.max_distill_steps, label="optimizer steps")
                distil_run = gr.Button("Distil it (in the background)", elem_id="distil-run",
                                       interactive=config.allow_training)
                distil_cancel = gr.Button("Cancel its distillation", elem_id="distil-cancel", size="sm",
                                          interactive=config.allow_training)
            prepare_status = gr.Markdown(elem_id="prepare-status")
            jobs_status = gr.Markdown(elem_id="distil-jobs")
            jobs_timer = gr.Timer(2.0, active=config.allow_training)

    drafts = columns[::2]
    compared = private(run.click, on_gpu(partial(compare, hub, profiles), config),
                       [target, prompt, k, max_new, hardware, *columns],
                       [*panels, table, chart, status], concurrency_id=DECODE)
    defaults = partial(compare_columns, hub)
    private(demo.load, defaults, target, columns, queue=False)
    private(target.input, defaults, target, columns, queue=False)
    prepared = private(prepare_run.click, on_gpu(partial(prepare_aligned, hub), config),
                       [target, source, domain, name], [prepare_status, distil_choice], concurrency_id=DECODE)
    private(distil_run.click, partial(start_distill, hub), [distil_choice, distil_steps], prepare_status,
            concurrency_id=DECODE)
    private(distil_cancel.click, partial(cancel_distill, hub), distil_choice, prepare_status, queue=False)
    watch = partial(training_status, hub, compare_columns=len(drafts))
    watched = [jobs_status, known, live_draft, *drafts, distil_choice]
    private(jobs_timer.tick, watch, known, watched, queue=False)
    private(demo.load, watch, known, watched, queue=False)
    return CompareTab(target, drafts, [compared, prepared])


@user_errors
def compare(hub: ModelHub, profiles: dict[str, CostProfile], target, prompt, k, max_new_tokens, hardware,
            *drafts_and_bridges, progress=gr.Progress(track_tqdm=True)):
    """Decode the same prompt with each chosen draft, then the target alone; yield columns as they finish.

    hardware: "this machine" or the file name of one of `profiles`, whose costs price each draft's α̂ per position.
    drafts_and_bridges: draft name, bridge mode, draft name, bridge mode, ... (blank names are skipped).
    Yields ([chips HTML per column], stats table, bar chart, status).
    """
    pairs = list(zip(drafts_and_bridges[::2], drafts_and_bridges[1::2]))
    columns = len(pairs)
    chosen = [(i, name, bridge) for i, (name, bridge) in enumerate(pairs) if name]
    if not chosen:
        raise ValueError("pick at least one draft to compare")
    profile = chosen_profile(profiles, hardware)
    request = DecodeRequest.from_inputs(target, chosen[0][1], prompt, k, max_new_tokens).checked(hub.config)
    token = StopToken(hub.config.request_budget())
    target_model = hub.target(request.target, progress=progress, budget=token.budget)
    check_prompt(target_model, request, token.budget)
    panels = ["<em>not run</em>"] * columns
    results: dict[str, GenerationResult] = {}
    there: dict[str, Prediction | str] = {}  # per column run: the speedup predicted on the profile's hardware
    for i, name, bridge in chosen:
        if not token.running():  # the time limit passed: the columns left are not run, nor the baseline
            yield (*panels, None, None, f"{token.reason}: {len(results)} of {len(chosen)} draft(s) ran, the "
                                        "target alone was not measured")
            return
        yield (*panels, None, None, f"decoding with draft {i + 1}: {name} ({bridge})…")
        try:
            draft = hub.draft(name, target_model, bridge=bridge, budget=token.budget)
            result = run_speculative(target_model, draft, DecodeRequest(**{**request.__dict__, "draft": name}),
                                     token.running, hub.costs(target_model, draft, budget=token.budget), token.budget)
        except ValueError as error:  # one draft that cannot run says why; the others still run
            panels[i] = f'<div class="compare-error">⚠ {html.escape(f"{name} ({bridge}): {error}")}</div>'
            continue
        column = f"{i + 1}: {Path(name).name} ({bridge})"  # a folder's last part keeps columns narrow
        results[column] = result
        if profile is not None:
            there[column] = predict_for(profile, target_model.name, name, result.stats.per_position_acceptance,
                                        result.stats.k)
        panels[i] = chips_html(result.rounds, target_model.tokenizer, request.prompt)
    if not results:
        yield (*panels, None, None, "no draft could run: see the messages above")
        return
    if not token.running():
        yield (*panels, None, None, f"{token.reason}: the target alone was not measured")
        return
    yield (*panels, None, None, "measuring the target alone…")
    longest = max(len(r.token_ids) for r in results.values())
    baseline = run_baseline(target_model, request, longest, token)
    note = f"{token.reason} while measuring the target alone" if token.stopped else "done"
    yield (*panels, comparison_table(results, baseline, profile, there),
           comparison_chart(results, baseline, profile, there),
           f"{note}: {len(results)} draft(s) and the target alone ({baseline.stats.tokens_per_s:.2f} tokens/s)")


def comparison_table(results: dict[str, GenerationResult], baseline: GenerationResult,
                     profile: CostProfile | None = None, there: dict[str, Prediction | str] | None = None
                     ) -> pd.DataFrame:
    """One row per STAT_LINES metric plus the measured speedup, one column per draft; with a profile, then the
    speedup predicted on its hardware (`there`: per column, `predict_for`'s prediction or why there is none)."""
    rows = [{"metric": label, **{name: fmt.format(getattr(r.stats, field)) for name, r in results.items()}}
            for field, label, fmt in STAT_LINES]
    rows.append({"metric": "measured speedup (tokens/s ÷ target alone)",
                 **{name: f"{measured_speedup(r.stats, baseline.stats):.2f}" for name, r in results.items()}})
    if profile is not None:
        rows.append({"metric": f"speedup predicted on {profile.title} from the α̂ per position measured here, "
                               "at this run's k (the k to use there)",
                     **{name: predicted_cell(there[name]) for name in results}})
    return pd.DataFrame(rows)


def predicted_cell(prediction: Prediction | str) -> str:
    """A prediction there in a few characters, or the few words saying why there is none."""
    if isinstance(prediction, str):
        return prediction
    return f"{prediction.speedup:.2f} (k={prediction.k}; k={prediction.best_k} there: {prediction.best_speedup:.2f})"


def comparison_chart(results: dict[str, GenerationResult], baseline: GenerationResult,
                     profile: CostProfile | None = None, there: dict[str, Prediction | str] | None = None):
    """Bars per draft: α̂, mean accepted length, measured speedup and, with a profile, the speedup predicted on its
    hardware (no bar where it has none)."""
    metrics = ["α̂", "mean accepted length", "measured speedup"] + (["predicted there"] if profile else [])
    series = [figures.Series(name, metrics, [r.stats.acceptance_rate, r.stats.mean_accepted_length,
                                             measured_speedup(r.stats, baseline.stats),
                                             *([_speedup(there[name])] if profile else [])], kind="bar")
              for name, r in results.items()]
    title = "aligned vs unaligned drafts" + (f"; predicted there: on {profile.title}" if profile else "")
    return figures.figure(title, "", "value", series)


def _speedup(prediction: Prediction | str) -> float | None:
    return None if isinstance(prediction, str) else prediction.speedup


def compare_columns(hub: ModelHub, target: str) -> list:
    """The draft and vocabulary values for `target` (`ModelHub.compare_defaults`)."""
    return [gr.update(value=value) for column in hub.compare_defaults(target or None) for value in column]


def distillable(hub: ModelHub) -> list[tuple[str, str]]:
    """(label, spec) of the aligned drafts not trained yet: what "Distil it" offers."""
    return [(aligned.label(c), c.spec) for c in hub.aligned_drafts() if c.method == "transplant"]


@user_errors
def prepare_aligned(hub: ModelHub, target, source, domain, name, progress=gr.Progress()):
    """Transplant `source` onto `target`'s tokenizer (no training) and register it; (status, distil dropdown)."""
    _training_allowed(hub)
    if domain not in available_suites():
        raise ValueError(f"domain must be one of the prompt suites: {', '.join(available_suites())}")
    room = aligned.NAME_CHARS - len(service.DISTILLED_SUFFIX)  # its distilled copy adds the suffix
    name = (name or "").strip() or aligned.name_for(f"{Path(source or '').name}-{domain}")[:room]
    service.distilled_name(name)  # refused now when its distilled copy could not be registered later
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
    service.distilled_name(card.name)  # a name too long for its result fails now, not after the training
    target_model = hub.target(card.target, progress=progress)
    jobs.start(card.name, steps, lambda on_step: service.distil(target_model, card.name, steps=steps,
                                                               progress=on_step).spec, hub.config.max_distill_jobs)
    return f"distilling {card.name} for {steps} steps in the background: progress below (it survives a reload)"


@user_errors
def cancel_distill(hub: ModelHub, spec) -> str:
    """Stop the background distillation of the aligned draft `spec` after its current step."""
    _training_allowed(hub)
    card = aligned.find(spec or "")
    if card is None:
        raise ValueError("pick the aligned draft whose distillation to cancel")
    jobs.cancel(card.name)
    return f"cancelling {card.name} after its current step (its checkpoints stay: distilling it again resumes)"


def training_status(hub: ModelHub, known: list[str] | None, compare_columns: int) -> tuple:
    """The job list, the aligned drafts now registered, and fresh draft lists when those changed (else skips)."""
    lines = [job.line() for job in jobs.jobs()] or ["no distillation jobs yet"]
    names = [card.spec for card in hub.aligned_drafts()]
    if names == (known or []):
        return ("\n".join(lines), names, *[gr.skip()] * (compare_columns + 2))
    drafts = hub.choices("draft")
    return ("\n".join(lines), names, gr.update(choices=drafts),
            *[gr.update(choices=drafts + [NO_DRAFT]) for _ in range(compare_columns)],
            gr.update(choices=distillable(hub)))


def _training_allowed(hub: ModelHub) -> None:
    if not hub.allows("allow_training"):
        raise ValueError("preparing and distilling aligned drafts is off on this host (SPECDEC_ALLOW_TRAINING=0)")
