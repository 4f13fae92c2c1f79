"""The Live decode tab: a speculative decode streamed round by round as chips, then the target alone for the
measured speedup; stats cards, figures, the cost waterfall and the run's downloads (`step` adds the
step-through under it). Until a run of its own, the page shows the preset's recording when there is one
(`specdec.lab.recording`, made by `python -m specdec record`), labelled with the machine and date it was measured
on: a first look with no model loaded."""
from __future__ import annotations

import csv
import json
import shutil
import tempfile
import weakref
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import NamedTuple

import gradio as gr
import pandas as pd

from specdec.core.limits import K_AUTO_MAX
from specdec.core.trace import GenerationResult
from specdec.costs.waterfall import cost_waterfall
from specdec.core.hardware import REPOSITORY
from specdec.lab import plots as figures
from specdec.lab import presets, recording
from specdec.lab.report import baseline_lines, round_rows

from specdec.dashboard.chips import chips_html, legend_html
from specdec.dashboard.config import AppConfig, K_CHOICES
from specdec.dashboard.events import DECODE, on_gpu, private
from specdec.dashboard.handlers import check_prompt, run_baseline, user_errors, waterfall_figure
from specdec.dashboard.hub import VOCABULARIES, ModelHub
from specdec.dashboard.panels import round_table, stats_html
from specdec.dashboard.runs import AUTO, DecodeRequest, RunControl, partial_result, stream
from specdec.dashboard.tabs import step

CLASSROOM = {  # a run quick enough to watch live on a laptop CPU, chosen by measurement (docs/performance.md):
    # on a shared 2-core CPU (contended) 32 tokens took 8.8 s, 3.6 tokens/s vs 1.2 for the target alone (2.9x),
    # where the 0.5B model draft on the code preset ran at 0.45 tokens/s vs 0.52 (0.88x, 70 s)
    "target": "qwen2.5-coder-1.5b-instruct",
    "draft": "lookup",  # prompt lookup: no draft model to run, drafts copied from the prompt
    "preset": "summarise (prompt lookup copies from it)",
    "k": "auto",
    "max_new_tokens": 32,
}


class Settings(NamedTuple):
    """The tab's decode settings: the step-through and the theory tab's sweep decode with them too."""

    target: gr.Dropdown
    draft: gr.Dropdown
    bridge: gr.Radio
    prompt: gr.Textbox
    k: gr.Dropdown
    max_new: gr.Slider
    sampling: gr.Radio
    temperature: gr.Slider
    top_p: gr.Slider
    seed: gr.Number


class LiveTab(NamedTuple):
    settings: Settings  # what the other tabs read
    finished: list  # events after which the model lists are read again (a first load changes a label)


class LiveView(NamedTuple):
    """Outputs of the live decode tab, in wiring order."""

    chips: str  # HTML chips of every round so far
    table: pd.DataFrame  # the round table (one row per round)
    acceptance: object  # plotly figure: running α̂
    histogram: object  # plotly figure: accepted tokens per round
    positions: object  # plotly figure: per-position acceptance
    stats: str  # HTML stat cards
    status: str  # one Markdown line: what is happening
    recorded: object  # the "Recorded on ..." line: shown for a recording, hidden by a run of this machine


def build(config: AppConfig, hub: ModelHub, demo: gr.Blocks, model_box) -> LiveTab:
    """The tab's components and events (inside `gr.Tabs` of `demo`); `model_box` makes a model dropdown."""
    custom = config.allow_custom_models
    with gr.Tab("Live decode", id="live"):  # a State too sits inside its tab: gr.Tabs numbers its children as tabs
        control = gr.State(RunControl, delete_callback=forget)  # per browser session: the Stop button's handle on
        # its own decode (and its downloads, removed with the session)
        with gr.Row():
            with gr.Column(scale=1, min_width=320):
                target = model_box(hub.choices("target"), value=hub.default("target"), label="target model",
                                   info="any folder / .gguf / hub id also works" if custom else None)
                draft = model_box(hub.choices("draft"), value=hub.default_drafter(), label="draft",
                                  info="a model, `lookup` (prompt lookup) or `self:L` (first L target layers)")
                bridge = gr.Radio(list(VOCABULARIES), value="auto", label="draft vocabulary",
                                  info="auto: through the text bridge when the tokenizers differ")
                preset = gr.Dropdown(list(presets.PROMPTS), value=next(iter(presets.PROMPTS)), label="prompt preset")
                classroom_button = gr.Button("Classroom preset: quick enough to watch on a laptop CPU", size="sm",
                                             elem_id="classroom")
                prompt = gr.Textbox(next(iter(presets.PROMPTS.values())), label="prompt", lines=4, elem_id="prompt",
                                    info=f"at most {config.max_prompt_tokens} tokens "
                                         f"({config.max_prompt_chars} characters) on this host")
                k = gr.Dropdown(K_CHOICES, value=presets.LIVE_K, label="k: draft tokens per round", elem_id="k",
                                info="auto: chosen each round (0 = a plain target step) from the measured "
                                     "acceptance and what verification costs on this machine")
                max_new = gr.Slider(1, config.max_new_tokens_cap, step=1, label="max new tokens",
                                    value=min(presets.LIVE_MAX_NEW_TOKENS, config.max_new_tokens_cap))
                sampling = gr.Radio([("greedy", False), ("sampling", True)], value=False, label="decoding")
                with gr.Row():
                    temperature = gr.Slider(0.05, 2.0, value=0.8, step=0.05, label="temperature")
                    top_p = gr.Slider(0.05, 1.0, value=1.0, step=0.05, label="top-p")
                    seed = gr.Number(0, precision=0, label="seed")
                baseline = gr.Checkbox(True, label="also run the target alone (measured speedup)")
                with gr.Row():
                    run = gr.Button("Run", variant="primary", elem_id="run")
                    stop_button = gr.Button("Stop", variant="stop", elem_id="stop")
            with gr.Column(scale=2):
                recorded = gr.Markdown(visible=False, elem_id="recorded")  # "Recorded on ...": shown by a replay
                status = gr.Markdown("pick a pair and a prompt, then **Run**", elem_id="status")
                gr.HTML(legend_html())
                chips = gr.HTML(elem_id="chips-box")
                stats = gr.HTML(elem_id="stats-box")
        with gr.Row():
            acceptance_plot = gr.Plot(label="running α̂", elem_id="alpha-plot")
            histogram_plot = gr.Plot(label="accepted draft tokens per round", elem_id="histogram-plot")
            positions_plot = gr.Plot(label="per-position acceptance", elem_id="positions-plot")
        table = gr.DataFrame(label="round table: per-position match flags, accepted, produced",
                             elem_id="round-table", wrap=True, max_height=400)
        with gr.Row():
            waterfall_plot = gr.Plot(label="from the bound to the measurement", elem_id="waterfall-plot")
            with gr.Column(scale=0, min_width=220):
                export_json = gr.DownloadButton("download the run (JSON)", elem_id="export-json")
                export_csv = gr.DownloadButton("download the round table (CSV)", elem_id="export-csv")
        settings = Settings(target, draft, bridge, prompt, k, max_new, sampling, temperature, top_p, seed)
        step.build(hub, settings)

    private(preset.change, preset_prompt, preset, prompt)
    views = [chips, table, acceptance_plot, histogram_plot, positions_plot, stats, status, recorded]
    for shown in (demo.load, preset.change):  # reads a file and renders it: no model, no queue
        private(shown, replay, preset, [*views, waterfall_plot, export_json, export_csv], queue=False)
    private(classroom_button.click, partial(classroom, config.max_new_tokens_cap), None,
            [target, draft, preset, prompt, k, max_new], queue=False)
    queued = private(run.click, RunControl.queued, control, control, queue=False)  # Stop works while it waits
    decoded = private(queued.then, on_gpu(partial(live_decode, hub), config), [*settings, baseline, control],
                      views, concurrency_id=DECODE)
    private(decoded.then, after_live, control, [waterfall_plot, export_json, export_csv])
    private(stop_button.click, stop, control, status, concurrency_limit=None)
    return LiveTab(settings, [decoded])


def preset_prompt(name: str) -> str:
    return presets.PROMPTS.get(name, "")


def classroom(max_new_tokens_cap: int = 256):
    """(target, draft, preset, prompt, k, max new tokens) of the classroom preset (within this host's cap)."""
    c = CLASSROOM
    return (c["target"], c["draft"], c["preset"], presets.PROMPTS[c["preset"]], c["k"],
            min(c["max_new_tokens"], max_new_tokens_cap))


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
    token = control.start(hub.config.request_budget())
    if token.stopped:  # Stop was pressed while this request waited in the queue
        yield LiveView(*[gr.skip()] * 6, token.reason, gr.skip())
        return
    target_model, draft_model = hub.pair(request.target, request.draft, bridge, progress=progress, budget=token.budget)
    check_prompt(target_model, request, token.budget)
    costs = hub.costs(target_model, draft_model, progress=progress, budget=token.budget)
    tokenizer = target_model.tokenizer
    result = None
    for update in stream(request.rounds(target_model, draft_model, costs, token.budget), token):
        if isinstance(update, GenerationResult):
            result = update
            break
        partial_run = partial_result(update, request.k, costs)
        yield live_view(partial_run, tokenizer, request, f"decoding… {len(partial_run.rounds)} rounds, "
                                                         f"{len(partial_run.token_ids)} tokens", light=True)
    if result.stopped_early or not measure_baseline:
        note = token.reason if result.stopped_early else "done"
        remember(control, result, None, tokenizer)  # for the waterfall and the downloads
        yield live_view(result, tokenizer, request, f"{note}: {len(result.token_ids)} tokens in {len(result.rounds)} "
                                                    f"rounds, {result.stats.wall_time_s:.2f} s")
        return
    yield live_view(result, tokenizer, request, "measuring the target alone on the same prompt and length…",
                    light=True)
    baseline = run_baseline(target_model, request, len(result.token_ids), token)
    remember(control, result, baseline, tokenizer)
    yield live_view(result, tokenizer, request, finished(result, baseline, request, target_model.dtype, tokenizer),
                    baseline)


def finished(result: GenerationResult, baseline: GenerationResult, request: DecodeRequest, dtype: str,
             tokenizer) -> str:
    """The status line of a run done with its baseline: its length, the measured speedup, the output check."""
    summary = "; ".join(baseline_lines(result, baseline, request.temperature == 0, dtype, tokenizer))
    return f"done: {len(result.token_ids)} tokens in {len(result.rounds)} rounds; {summary}"


def live_view(result: GenerationResult, tokenizer, request: DecodeRequest, status: str,
              baseline: GenerationResult | None = None, light: bool = False) -> LiveView:
    """Everything the live tab shows for `result` (complete or partial); `light`: chips and status only."""
    unrecorded = gr.update(value="", visible=False)  # what this machine measures replaces a recording
    if light:
        skip = gr.skip()
        return LiveView(chips_html(result.rounds, tokenizer, request.prompt), skip, skip, skip, skip, skip, status,
                        unrecorded)
    span = K_AUTO_MAX if request.k == AUTO else request.k  # draft positions the charts show
    return LiveView(
        chips=chips_html(result.rounds, tokenizer, request.prompt),
        table=round_table(result, tokenizer),
        acceptance=figures.running_acceptance(result.rounds, span),
        histogram=figures.accepted_length_histogram(result.rounds, span),
        positions=figures.per_position_acceptance(result.stats),
        stats=stats_html(result.stats, baseline.stats if baseline else None),
        status=status,
        recorded=unrecorded,
    )


# --- a recorded run: the first look, before any model loads -------------------------------------------------

def replay(preset: str, folder: str | Path = recording.FOLDER):
    """(*LiveView, waterfall, JSON, CSV) of `preset`'s recording in `folder`, labelled with the machine and date it
    ran on; skips when there is none, and the refusal's line when the file is not one this version reads."""
    skip = gr.skip()
    try:
        made = recording.recorded(preset, folder)
    except ValueError as error:
        line = str(error).replace(f"{REPOSITORY}/", "")  # names the file, not where the app is installed
        refused = LiveView(*[skip] * 6, f"the recorded run is not shown: {line}", gr.update(visible=False))
        return *refused, skip, skip, skip
    if made is None:
        return *LiveView(*[skip] * 8), skip, skip, skip
    request = DecodeRequest(made.target, made.draft, made.prompt, made.k, made.max_new_tokens, made.temperature)
    tokenizer = made.tokenizer
    view = live_view(made.result, tokenizer, request, finished(made.result, made.baseline, request,
                                                               made.formats.get(made.target, ""), tokenizer),
                     made.baseline)
    nothing = gr.update(value=None)  # the downloads are a run of this session's own
    return (*view._replace(recorded=gr.update(value=recorded_label(made), visible=True)),
            waterfall_figure(cost_waterfall(made.result, made.baseline)), nothing, nothing)


def recorded_label(made: recording.Recording) -> str:
    """The line over a replay: where and when it was measured, with which pair, and how to measure here."""
    formats = ", ".join(f"{name} {form}" for name, form in made.formats.items())
    return (f"**Recorded on {made.machine}, {made.date[:10]}** — press Run to measure on this machine "
            f"(`{made.target}` + `{made.draft}`, k = {made.k}; {formats})")


# --- the last live run: waterfall and export --------------------------------------------------------

@dataclass
class LiveRun:
    result: GenerationResult  # the speculative run
    baseline: GenerationResult | None  # the target alone, when measured
    tokenizer: object  # the target's tokenizer


_LAST: "weakref.WeakKeyDictionary[object, LiveRun]" = weakref.WeakKeyDictionary()  # per session's RunControl
_EXPORTS: "weakref.WeakKeyDictionary[object, tuple[Path, weakref.finalize]]" = weakref.WeakKeyDictionary()  # its
# download folder and what removes it


def remember(control, result: GenerationResult, baseline: GenerationResult | None, tokenizer) -> None:
    """Keep a session's finished live run for the waterfall and the downloads (`after_live`)."""
    _LAST[control] = LiveRun(result, baseline, tokenizer)


def after_live(control):
    """(waterfall figure, JSON file, CSV file) of the session's last live run; skips when there is none."""
    run = _LAST.get(control)
    if run is None:
        return gr.skip(), gr.skip(), gr.skip()
    json_path, csv_path = export_files(run.result, run.tokenizer, export_folder(control))
    return waterfall_figure(cost_waterfall(run.result, run.baseline)), json_path, csv_path


def export_folder(control) -> Path:
    """A session's download folder: made at its first run, written again by the next ones, removed with the
    session (`forget`, or once its RunControl is garbage-collected)."""
    if control not in _EXPORTS:
        folder = Path(tempfile.mkdtemp(prefix="specdec-export-"))
        _EXPORTS[control] = folder, weakref.finalize(control, shutil.rmtree, folder, True)
    return _EXPORTS[control][0]


def forget(control) -> None:
    """A session's RunControl is deleted (Gradio's state deletion, after its tab closed): its last run and its
    downloads go."""
    _LAST.pop(control, None)
    folder = _EXPORTS.pop(control, None)
    if folder is not None:
        folder[1]()  # removes the folder now (a finalizer runs once)


def export_files(result: GenerationResult, tokenizer, folder: str | Path) -> tuple[str, str]:
    """Write the run as specdec-run.json (`to_dict()`, the API's schema) and specdec-rounds.csv (the round table)."""
    folder = Path(folder)
    json_path, csv_path = folder / "specdec-run.json", folder / "specdec-rounds.csv"
    json_path.write_text(json.dumps(result.to_dict(), ensure_ascii=False, indent=1), encoding="utf-8")
    rows = round_rows(result, tokenizer)
    with csv_path.open("w", newline="", encoding="utf-8") as handle:
        if rows:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    return str(json_path), str(csv_path)
