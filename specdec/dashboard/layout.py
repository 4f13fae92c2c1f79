"""The dashboard's Blocks: layout first (three tabs), event wiring at the bottom of `build_demo`."""
from __future__ import annotations

from functools import partial

import gradio as gr

from specdec.core.limits import K_UI_MAX

from specdec.core.suites import available_suites
from specdec.dashboard import handlers, teach
from specdec.dashboard.chips import CSS as CHIPS_CSS, legend_html
from specdec.dashboard.config import AppConfig, K_RANGE, PROMPTS
from specdec.dashboard.handlers import SWEEP_KS

from specdec.dashboard.hub import VOCABULARIES, ModelHub
from specdec.dashboard.panels import CSS as PANELS_CSS
from specdec.dashboard.runs import RunControl

K_CHOICES = ["auto", *range(K_RANGE[0], K_RANGE[1] + 1)]  # the k dropdowns' options

CSS = CHIPS_CSS + PANELS_CSS + teach.CSS + ".compare-error { color: #8a1c12; }\n"
INTRO = """# specdec — watch speculative decoding, round by round
A small **draft** proposes *k* tokens, the **target** checks them all in one forward and keeps the longest
prefix it agrees with, plus one token of its own. Greedy output is exactly the target's; the question is how
many tokens each target forward yields, and whether that beats the target alone on this machine.
"""
PREPARE_MD = """A draft of another family speaks other token ids. **Prepare** gives it the target's tokenizer: the
embedding rows are copied by token string, and a token it lacks starts as the mean of its pieces (vocabulary
transfer, Gee et al. 2022); no training, a few seconds. **Distil it** then trains it on the target's
continuations of the domain's prompts (DistillSpec, Zhou et al. 2023) in the background, with checkpoints; the
distilled draft joins the draft lists when done, with its held-out α̂."""
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


def build_demo(config: AppConfig, hub: ModelHub | None = None) -> gr.Blocks:
    """The whole app for `config`; `hub` defaults to one over specdec.models' shared pool."""
    hub = hub or ModelHub(config)
    custom = config.allow_custom_models
    model_box = partial(gr.Dropdown, allow_custom_value=custom, filterable=True)

    with gr.Blocks(title="specdec — speculative decoding lab") as demo:
        control = gr.State(RunControl)  # per browser session: the Stop button's handle on its own decode
        sweep_points = gr.State(dict)  # per session: the theory tab's last sweep (points, measured v(n))
        stepping = gr.State(teach.StepSession)  # per session: the paused step-through decode
        gr.Markdown(INTRO)
        gr.Markdown(hub.memory, elem_id="memory")  # a callable: read again on every page load
        with gr.Tabs():
            with gr.Tab("Live decode", id="live"):
                with gr.Row():
                    with gr.Column(scale=1, min_width=320):
                        target = model_box(hub.choices("target"), value=hub.default("target"), label="target model",
                                           info="any folder / .gguf / hub id also works" if custom else None)
                        draft = model_box(hub.choices("draft"), value=hub.default("draft"), label="draft",
                                          info="a model, `lookup` (prompt lookup) or `self:L` (first L target layers)")
                        bridge = gr.Radio(list(VOCABULARIES), value="auto", label="draft vocabulary",
                                          info="auto: through the text bridge when the tokenizers differ")
                        preset = gr.Dropdown(list(PROMPTS), value=next(iter(PROMPTS)), label="prompt preset")
                        classroom = gr.Button("Classroom preset: quick enough to watch on a laptop CPU", size="sm",
                                              elem_id="classroom")
                        prompt = gr.Textbox(next(iter(PROMPTS.values())), label="prompt", lines=4, elem_id="prompt",
                                            info=f"at most {config.max_prompt_chars} characters on this host")
                        k = gr.Dropdown(K_CHOICES, value="auto", label="k: draft tokens per round", elem_id="k",
                                        info="auto: chosen each round (0 = a plain target step) from the measured "
                                             "acceptance and what verification costs on this machine")
                        max_new = gr.Slider(1, config.max_new_tokens_cap, value=min(48, config.max_new_tokens_cap),
                                            step=1, label="max new tokens")
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
                with gr.Accordion("Step through: one round at a time, one position up close", open=True):
                    gr.Markdown("Uses the pair, prompt and settings above. **Next round** runs exactly one more round "
                                "of the engine and shows what the draft proposed, what the target's one forward "
                                "predicted at each of the k+1 positions, how they compare and what is kept.")
                    with gr.Row():
                        step_start = gr.Button("Start step-through", elem_id="step-start")
                        step_next = gr.Button("Next round", variant="primary", elem_id="step-next")
                    step_status = gr.Markdown(elem_id="step-status")
                    step_panel = gr.HTML(elem_id="step-panel")
                    step_chips = gr.HTML(elem_id="step-chips")
                    with gr.Row():
                        position_round = gr.Number(1, precision=0, minimum=1, label="round", elem_id="position-round")
                        position_index = gr.Number(1, precision=0, minimum=1, label="position (1..k+1)",
                                                   elem_id="position-index")
                        position_show = gr.Button("Show this position", elem_id="position-show")
                    position_text = gr.Markdown(elem_id="position-text")
                    position_plot = gr.Plot(label="one position: p_draft, p_target and the rule", elem_id="position-plot")

            with gr.Tab("Aligned vs unaligned", id="compare"):
                gr.Markdown(
                    "Same target, same prompt, up to three drafts. A draft with another tokenizer runs **naive** "
                    "(its ids read as the target's ids, so acceptance collapses: the draft proposes tokens the target "
                    "never meant) or through the **text bridge** (draft text re-tokenized for the target); an "
                    "**aligned** draft was moved onto the target's tokenizer (vocabulary transplant, then "
                    "distillation; prepare one at the bottom of this tab)."
    )
                with gr.Row():
                    compare_target = model_box(hub.choices("target"), value=hub.default("target"), label="target")
                    compare_prompt = gr.Textbox(next(iter(PROMPTS.values())), label="prompt", lines=2,
                                                elem_id="compare-prompt")
                    compare_k = gr.Dropdown(K_CHOICES, value="auto", label="k")
                    compare_new = gr.Slider(1, config.max_new_tokens_cap, value=min(32, config.max_new_tokens_cap),
                                            step=1, label="max new tokens")
                compare_inputs, compare_panels = [], []
                with gr.Row():
                    for column, (name, mode) in enumerate(hub.compare_defaults()):
                        with gr.Column():
                            compare_inputs.append(model_box(hub.choices("draft") + [("(none)", "")], value=name,
                                                            label=f"draft {column + 1}"))
                            compare_inputs.append(gr.Radio(list(VOCABULARIES), value=mode, label="vocabulary"))
                            compare_panels.append(gr.HTML(elem_id=f"compare-chips-{column + 1}"))
                compare_run = gr.Button("Compare", variant="primary", elem_id="compare-run")
                compare_status = gr.Markdown(elem_id="compare-status")
                compare_chart = gr.Plot(label="α̂, mean accepted length, measured speedup", elem_id="compare-plot")
                compare_table = gr.DataFrame(label="metrics per draft", elem_id="compare-table")
                with gr.Accordion("Prepare an aligned draft: vocabulary transplant, then distillation", open=False,
                                  elem_id="prepare-aligned"):
                    gr.Markdown(PREPARE_MD if config.allow_training else
                                "Preparing and distilling aligned drafts is off on this host (SPECDEC_ALLOW_TRAINING).")
                    with gr.Row():
                        prepare_source = gr.Dropdown(hub.sources(), value=hub.default("unaligned-draft") or None,
                                                     label="draft of another family", allow_custom_value=custom)
                        prepare_domain = gr.Dropdown(available_suites(), value="code", label="domain (prompt suite)")
                        prepare_name = gr.Textbox(label="name", placeholder="default: draft-domain",
                                                  elem_id="prepare-name")
                        prepare_run = gr.Button("Prepare (transplant, no training)", elem_id="prepare-run",
                                                interactive=config.allow_training)
                    with gr.Row():
                        distil_choice = gr.Dropdown(handlers.distillable(hub), label="aligned draft to distil",
                                                    elem_id="distil-choice")
                        distil_steps = gr.Number(min(50, config.max_distill_steps), precision=0, minimum=1,
                                                 maximum=config.max_distill_steps, label="optimizer steps")
                        distil_run = gr.Button("Distil it (in the background)", elem_id="distil-run",
                                               interactive=config.allow_training)
                    prepare_status = gr.Markdown(elem_id="prepare-status")
                    jobs_status = gr.Markdown(elem_id="distil-jobs")
                    aligned_known = gr.State(list)  # per session: the aligned drafts its dropdowns list
                    jobs_timer = gr.Timer(2.0, active=config.allow_training)

            with gr.Tab("Theory vs measurement", id="theory"):
                with gr.Row():
                    with gr.Column(scale=1, min_width=300):
                        alpha = gr.Slider(0.0, 1.0, value=0.7, step=0.01, label="α (acceptance rate)")
                        cost = gr.Slider(0.0, 1.0, value=0.3, step=0.01, label="c (one draft step / one target step)")
                        slope = gr.Slider(0.0, 1.0, value=0.0, step=0.01, elem_id="v-slope",
                                          label="verification cost per extra token: v(k+1) = 1 + slope·k",
                                          info="0 = Leviathan's assumption; a sweep sets the measured slope")
                        k_max = gr.Slider(2, K_UI_MAX, value=K_UI_MAX, step=1, label="largest k shown (and swept)",
                                          elem_id="k-max")
                        sweep_run = gr.Button(f"Measure a k sweep (k in {', '.join(map(str, SWEEP_KS))}, up to the "
                                              "largest k) with the live tab's pair and prompt", elem_id="sweep-run")
                        gr.Markdown(THEORY_MD, latex_delimiters=[{"left": "$", "right": "$", "display": False}])
                    with gr.Column(scale=2):
                        theory_plot = gr.Plot(handlers.theory_figure(0.7, 0.3, 0.0, K_UI_MAX, {}), elem_id="theory-plot")
                        waterfall_k = gr.Slider(1, K_UI_MAX, value=4, step=1, label="k of the waterfall",
                                                elem_id="waterfall-k")
                        theory_waterfall = gr.Plot(teach.theory_waterfall(0.7, 0.3, 0.0, 4),
                                                   elem_id="theory-waterfall")
                        sweep_status = gr.Markdown(elem_id="sweep-status")
                        sweep_table = gr.DataFrame(label="k sweep", elem_id="sweep-table")

        # --- events -------------------------------------------------------------------------------
        live_outputs = [chips, table, acceptance_plot, histogram_plot, positions_plot, stats, status]
        preset.change(handlers.preset_prompt, preset, prompt, api_visibility="private")
        classroom.click(partial(teach.classroom, config.max_new_tokens_cap), None, [target, draft, preset, prompt, k, max_new], api_visibility="private",
                        queue=False)
        queued = run.click(RunControl.queued, control, None, api_visibility="private", queue=False)  # Stop keeps
        decoded = queued.then(partial(handlers.live_decode, hub),  # working while the decode waits in the queue
                              [target, draft, bridge, prompt, k, max_new, sampling, temperature, top_p, seed, baseline,
                               control], live_outputs, api_visibility="private", concurrency_id="decode")
        decoded.then(teach.after_live, control, [waterfall_plot, export_json, export_csv], api_visibility="private")
        step_outputs = [step_panel, step_chips, step_status, position_round]
        step_start.click(partial(teach.step_start, hub),
                         [target, draft, bridge, prompt, k, max_new, sampling, temperature, top_p, seed, stepping],
                         step_outputs, api_visibility="private", concurrency_id="decode")
        step_next.click(teach.step_next, stepping, step_outputs, api_visibility="private", concurrency_id="decode")
        position_show.click(teach.show_position, [stepping, position_round, position_index],
                            [position_plot, position_text], api_visibility="private", concurrency_id="decode")
        stop_button.click(handlers.stop, control, status, api_visibility="private", concurrency_limit=None)
        compared = compare_run.click(partial(handlers.compare, hub),
                                     [compare_target, compare_prompt, compare_k, compare_new, *compare_inputs],
                                     [*compare_panels, compare_table, compare_chart, compare_status],
                                     api_visibility="private", concurrency_id="decode")
        for slider in (alpha, cost, slope, k_max):
            slider.change(handlers.theory_figure, [alpha, cost, slope, k_max, sweep_points], theory_plot,
                          api_visibility="private", concurrency_limit=None)
        for slider in (alpha, cost, slope, waterfall_k):
            slider.change(teach.theory_waterfall, [alpha, cost, slope, waterfall_k], theory_waterfall,
                          api_visibility="private", concurrency_limit=None)
        swept = sweep_run.click(partial(handlers.k_sweep, hub), [target, draft, bridge, prompt, max_new, k_max],
                                [theory_plot, alpha, cost, slope, sweep_table, sweep_points, sweep_status],
                                api_visibility="private", concurrency_id="decode")

        def speculate(target: str, draft: str, prompt: str, k: int, max_new_tokens: int, temperature: float,
                      seed: int) -> dict:
            """One speculative decode; returns GenerationResult.to_dict(): token_ids, text, rounds, stats."""
            return handlers.speculate(hub, target, draft, prompt, k, max_new_tokens, temperature, seed)

        gr.api(speculate, api_name="speculate", concurrency_id="decode")
        dropdowns = [target, draft, compare_target, *compare_inputs[::2]]  # labels say whether a model is ready
        refresh = partial(handlers.model_choices, hub, len(compare_inputs) // 2)
        demo.load(refresh, None, dropdowns, api_visibility="private", queue=False)
        for finished in (decoded, compared, swept):
            finished.then(refresh, None, dropdowns, api_visibility="private", queue=False)
        compare_defaults = partial(handlers.compare_columns, hub)
        demo.load(compare_defaults, compare_target, compare_inputs, api_visibility="private", queue=False)
        compare_target.input(compare_defaults, compare_target, compare_inputs, api_visibility="private", queue=False)
        prepared = prepare_run.click(partial(handlers.prepare_aligned, hub),
                                     [compare_target, prepare_source, prepare_domain, prepare_name],
                                     [prepare_status, distil_choice], api_visibility="private", concurrency_id="decode")
        prepared.then(refresh, None, dropdowns, api_visibility="private", queue=False)
        distil_run.click(partial(handlers.start_distill, hub), [distil_choice, distil_steps], prepare_status,
                         api_visibility="private", concurrency_id="decode")
        watch = partial(handlers.training_status, hub, compare_columns=len(compare_inputs) // 2)
        watched = [jobs_status, aligned_known, draft, *compare_inputs[::2], distil_choice]
        jobs_timer.tick(watch, aligned_known, watched, api_visibility="private", queue=False)
        demo.load(watch, aligned_known, watched, api_visibility="private", queue=False)
    demo.queue(default_concurrency_limit=config.concurrency, max_size=config.queue_size)
    return demo


def launch_options(config: AppConfig) -> dict:
    """Keyword arguments of demo.launch() for `config` (CSS and theme are launch options in Gradio 6)."""
    return dict(server_name=config.host, server_port=config.port, css=CSS, theme=gr.themes.Soft())

