"""The Hardware tab: why a decode is faster or slower on this machine, as `specdec.costs.machine` reports it (the
device, each model in memory with its weight format and why, every format measured for it, and the live tab's pair's
v(n) and c). Opening the tab reads what is in memory and in the caches; only **Measure** loads the pair (as a decode
does) and calibrates it, in the decode queue and within the request's time limit."""
from __future__ import annotations

from functools import partial

import gradio as gr
import pandas as pd

from specdec.costs.machine import MachineReport, machine_report
from specdec.lab.quality import quality_lines
from specdec.models import cache
from specdec.models.pool import NotLoaded

from specdec.dashboard.config import AppConfig
from specdec.dashboard.events import DECODE, on_gpu, private
from specdec.dashboard.handlers import user_errors
from specdec.dashboard.hub import ModelHub

INTRO = """### Why it is faster or slower here
A round pays off when the tokens it yields outnumber what it costs in target steps: verifying k+1 tokens costs
v(k+1) steps and each draft forward c steps, and both depend on this machine and each model's weight format.
"""
NOT_LOADED = ("the live tab's pair is not in memory yet: **Measure** loads it and measures v(n) and c "
              "(a decode loads it too)")


def build(config: AppConfig, hub: ModelHub, live) -> list:
    """The tab's components and events, for the live tab's pair `live` (a `live.Settings`). Returns the events
    after which the model lists are read again."""
    with gr.Tab("Hardware", id="hardware") as tab:
        gr.Markdown(INTRO)
        device = gr.Markdown(elem_id="hardware-device")
        models_line = gr.Markdown(elem_id="hardware-models-line")
        models = gr.DataFrame(label="each model in memory: its weight format and why", elem_id="hardware-models",
                              wrap=True)
        quality = gr.Markdown(elem_id="hardware-quality")
        candidates = gr.DataFrame(label="every format measured for it, fastest first (✓ the chosen one)",
                                  elem_id="hardware-formats", wrap=True)
        costs_line = gr.Markdown(elem_id="hardware-costs")
        curve = gr.DataFrame(label="v(n): a target forward over n new tokens, in one-token steps",
                             elem_id="hardware-curve")
        with gr.Row():
            refresh = gr.Button("Refresh", elem_id="hardware-refresh")
            measure = gr.Button("Measure v(n) and c for the live tab's pair", variant="primary",
                                elem_id="hardware-measure")

    pair = [live.target, live.draft, live.bridge]
    outputs = [device, models_line, models, candidates, costs_line, curve, quality]
    for trigger in (tab.select, refresh.click):
        private(trigger, partial(hardware_view, hub), pair, outputs, concurrency_limit=None)
    measured = private(measure.click, on_gpu(partial(measure_costs, hub), config), pair, outputs,
                       concurrency_id=DECODE)
    return [measured]


def hardware_view(hub: ModelHub, target, draft, bridge) -> tuple:
    """The panel for the pair (target, draft, bridge) from what is in memory and cached: nothing loads or is timed."""
    try:
        pair, missing = hub.loaded_pair(target, draft, bridge), ""
    except NotLoaded:
        pair, missing = (None, None), NOT_LOADED
    except ValueError as error:  # a name this host does not offer, a draft that does not fit the target
        pair, missing = (None, None), cache.redact(str(error))
    name, format_ = (pair[0].name, pair[0].dtype) if pair[0] is not None else (target, None)
    return render(machine_report(hub.pool.held(), *pair, draft_name=draft, missing=missing)) + (
        "  \n".join(quality_lines(name, format_)),)


@user_errors
def measure_costs(hub: ModelHub, target, draft, bridge, progress=gr.Progress(track_tqdm=True)) -> tuple:
    """Load the pair as a decode does and calibrate it (cached: read back), within the request's time limit."""
    budget = hub.config.request_budget()
    target_model, draft_model = hub.pair(target, draft, bridge, progress=progress, budget=budget)
    hub.costs(target_model, draft_model, progress=progress, budget=budget)
    return hardware_view(hub, target, draft, bridge)


def render(report: MachineReport) -> tuple:
    """The report as the tab's outputs: device lines, models line and table, candidates, costs line, v(n) table
    (`hardware_view` adds the target's measured quality against its float model)."""
    return ("  \n".join(report.device.lines()), report.models_line(), pd.DataFrame(report.model_rows()),
            pd.DataFrame(report.candidate_rows()), report.costs_line(), pd.DataFrame(report.curve_rows()))
