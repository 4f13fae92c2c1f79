"""The dashboard's Blocks: the tabs (`specdec.dashboard.tabs`, each wiring its own events), then what spans
them: the model lists read again after any model work, and the public API `/speculate`."""
from __future__ import annotations

from functools import partial

import gradio as gr

from specdec.costs.profile import bundled_profiles
from specdec.dashboard import handlers
from specdec.dashboard.chips import CSS as CHIPS_CSS
from specdec.dashboard.config import AppConfig
from specdec.dashboard.events import DECODE, on_gpu, private
from specdec.dashboard.hub import ModelHub
from specdec.dashboard.panels import CSS as PANELS_CSS
from specdec.dashboard.tabs import compare, hardware, live, step, theory

CSS = CHIPS_CSS + PANELS_CSS + step.CSS + compare.CSS
DELETE_CACHE = (3600, 3600)  # Gradio's copies of the downloads: every hour, those older than an hour are deleted
INTRO = """# specdec — watch speculative decoding, round by round
A small **draft** proposes *k* tokens, the **target** checks them all in one forward and keeps the longest
prefix it agrees with, plus one token of its own. Greedy output is exactly the target's; the question is how
many tokens each target forward yields, and whether that beats the target alone on this machine.
"""


def build_demo(config: AppConfig, hub: ModelHub | None = None) -> gr.Blocks:
    """The whole app for `config`; `hub` defaults to one over specdec.models' shared pool."""
    hub = hub or ModelHub(config)
    model_box = partial(gr.Dropdown, allow_custom_value=config.allow_custom_models, filterable=True)
    profiles = bundled_profiles()  # the hardware the compare and theory tabs can predict on
    with gr.Blocks(title="specdec — speculative decoding lab", delete_cache=DELETE_CACHE) as demo:
        gr.Markdown(INTRO)
        gr.Markdown(hub.memory, elem_id="memory")  # a callable: read again on every page load
        with gr.Tabs():
            live_tab = live.build(config, hub, demo, model_box)
            compare_tab = compare.build(config, hub, demo, model_box, live_tab.settings.draft, profiles)
            swept = theory.build(config, hub, live_tab.settings, profiles)
            measured = hardware.build(config, hub, live_tab.settings)

        lists = [live_tab.settings.target, live_tab.settings.draft, compare_tab.target, *compare_tab.drafts]
        refresh = partial(handlers.model_choices, hub, len(compare_tab.drafts))  # labels say whether a model is ready
        private(demo.load, refresh, None, lists, queue=False)
        for finished in (*live_tab.finished, *compare_tab.finished, *swept, *measured):
            private(finished.then, refresh, None, lists, queue=False)
        api = on_gpu(partial(handlers.speculate, hub), config)

        def speculate(target: str, draft: str, prompt: str, k: int, max_new_tokens: int, temperature: float,
                      seed: int) -> dict:
            """One speculative decode; returns GenerationResult.to_dict(): token_ids, text, rounds, stats."""
            return api(target, draft, prompt, k, max_new_tokens, temperature, seed)

        gr.api(speculate, api_name="speculate", concurrency_id=DECODE)
    demo.queue(default_concurrency_limit=config.concurrency, max_size=config.queue_size)
    return demo


def launch_options(config: AppConfig) -> dict:
    """Keyword arguments of demo.launch() for `config` (CSS and theme are launch options in Gradio 6)."""
    return dict(server_name=config.host, server_port=config.port, css=CSS, theme=gr.themes.Soft(),
                state_session_capacity=config.sessions)
