"""The live tab's step-through: one engine round at a time, and one position's sampling rule up close.

- Step-through: `teach.Stepper` resumes the engine's own decode (a generator paused after every round) once
  per click, so "Next round" costs exactly one engine round. `step_html` shows that round: the draft's
  proposals with p_draft, the target's top-1 at each of the k+1 rows of its one forward, the comparison,
  and what is kept.
- One position: `specdec.lab.position.position_view` recomputes p_draft and p_target there;
  `position_figure` draws them with the rule (sampling: u < min(1, p_target/p_draft), residual on
  rejection; greedy: the argmax).
"""
from __future__ import annotations

import html
from functools import partial

import gradio as gr

from specdec.core.trace import GenerationResult, Round
from specdec.lab import plots as figures
from specdec.lab.position import PositionView, position_view

from specdec.dashboard.chips import chips_html, token_label
from specdec.dashboard.events import DECODE, private
from specdec.dashboard.handlers import check_prompt, user_errors
from specdec.dashboard.hub import ModelHub
from specdec.dashboard.runs import DecodeRequest
from specdec.dashboard.teach import IDLE_S, Stepper

CSS = """
.step-table { border-collapse: collapse; font-family: ui-monospace, SFMono-Regular, Menlo, monospace; }
.step-table th, .step-table td { border: 1px solid #e3e3e3; padding: 3px 8px; text-align: center; }
.step-table th { background: #f6f6f6; font-weight: 600; text-align: left; }
.step-table .kept { background: #c6f0c2; } .step-table .rejected { background: #f8c9c4; }
.step-table .unreached { color: #8a8a8a; } .step-table .target { background: #bcd7ff; }
.step-table .correction { background: #ffd98a; }
"""
INTRO = ("Uses the pair, prompt and settings above. **Next round** runs exactly one more round of the engine and "
         "shows what the draft proposed, what the target's one forward predicted at each of the k+1 positions, how "
         "they compare and what is kept.")


def build(hub: ModelHub, settings) -> None:
    """The section's components and events, decoding with the live tab's `settings` (a `live.Settings`)."""
    session = gr.State(StepSession, time_to_live=IDLE_S,  # per browser session: the paused step-through decode,
                       delete_callback=StepSession.close)  # let go IDLE_S after the last click
    with gr.Accordion("Step through: one round at a time, one position up close", open=True):
        gr.Markdown(INTRO)
        with gr.Row():
            start = gr.Button("Start step-through", elem_id="step-start")
            next_button = gr.Button("Next round", variant="primary", elem_id="step-next")
        status = gr.Markdown(elem_id="step-status")
        panel = gr.HTML(elem_id="step-panel")
        chips = gr.HTML(elem_id="step-chips")
        with gr.Row():
            round_index = gr.Number(1, precision=0, minimum=1, label="round", elem_id="position-round")
            position = gr.Number(1, precision=0, minimum=1, label="position (1..k+1)", elem_id="position-index")
            show = gr.Button("Show this position", elem_id="position-show")
        text = gr.Markdown(elem_id="position-text")
        plot = gr.Plot(label="one position: p_draft, p_target and the rule", elem_id="position-plot")

    shown = [panel, chips, status, round_index]
    for clicked in (private(start.click, partial(step_start, hub), [*settings, session], shown, concurrency_id=DECODE),
                    private(next_button.click, step_next, session, shown, concurrency_id=DECODE)):
        private(clicked.then, touch, session, session, queue=False)  # its time to live counts again from now
    private(show.click, show_position, [session, round_index, position], [plot, text], concurrency_id=DECODE)


class StepSession:
    """A browser session's step-through (lives in a gr.State; a plain class, as gr.State copies dataclasses)."""

    def __init__(self):
        self.stepper: Stepper | None = None  # the paused decode
        self.request: DecodeRequest | None = None  # what it decodes
        self.target = None  # the loaded target (a LoadedModel)
        self.draft = None  # the draft as the engine got it

    def close(self) -> None:
        """End the paused decode (its thread returns, and the KV cache with it) and let go of the models."""
        if self.stepper is not None:
            self.stepper.close()
        self.stepper = self.request = self.target = self.draft = None


def touch(session: StepSession) -> StepSession:
    """A session's state handed back to Gradio as it is: its time to live counts again from now."""
    return session


@user_errors
def step_start(hub, target, draft, bridge, prompt, k, max_new_tokens, sampling, temperature, top_p, seed,
               session: StepSession, progress=gr.Progress(track_tqdm=True)):
    """Load the pair, start a paused decode and show its first round."""
    request = DecodeRequest.from_inputs(target, draft, prompt, k, max_new_tokens, temperature if sampling else 0.0,
                                        top_p, 0 if seed in (None, "") else seed).checked(hub.config)
    session.close()
    budget = hub.config.request_budget()  # loading, calibration and the prefill (the rounds wait for clicks)
    target_model, draft_model = hub.pair(request.target, request.draft, bridge, progress=progress, budget=budget)
    check_prompt(target_model, request, budget)
    costs = hub.costs(target_model, draft_model, progress=progress, budget=budget)
    session.request, session.target, session.draft = request, target_model, draft_model
    session.stepper = Stepper(request.rounds(target_model, draft_model, costs, budget))
    return step_next(session)


@user_errors
def step_next(session: StepSession):
    """One more engine round: (step panel HTML, chips HTML, status, round number for the position picker)."""
    stepper = session.stepper
    if stepper is None:
        return "", "", "press **Start step-through** first", gr.skip()
    round_ = stepper.next_round()
    tokenizer = session.target.tokenizer
    chips = chips_html(stepper.rounds, tokenizer, session.request.prompt)
    if round_ is None:
        emitted = sum(len(r.emitted_token_ids) for r in stepper.rounds)
        return gr.skip(), chips, f"finished: {emitted} tokens in {len(stepper.rounds)} rounds", gr.skip()
    index = len(stepper.rounds)
    status = (f"round {index}: {round_.num_accepted} of {len(round_.draft_token_ids)} drafts kept, "
              f"{len(round_.emitted_token_ids)} tokens from one target forward — **Next round** continues")
    return step_html(index, round_, tokenizer, session.request.temperature == 0), chips, status, index


def step_html(index: int, r: Round, tokenizer, greedy: bool) -> str:
    """One round as a table: per position the draft token and p_draft, the target's top-1 from its one
    forward, p_target of the draft token, the verdict, and what the round keeps."""
    n = len(r.draft_token_ids)
    top1 = [row[0] for row in r.target_top_ids] if r.target_top_ids else [None] * (n + 1)
    label = lambda t: html.escape(token_label(tokenizer, t)) if t is not None else ""  # noqa: E731
    header = "".join(f"<th>{i}</th>" for i in range(1, n + 1)) + f"<th>{n + 1} (target's own)</th>"
    drafts = "".join(f'<td class="draft-token" data-token-id="{t}">{label(t)}</td>' for t in r.draft_token_ids)
    p_draft = "".join(f'<td class="p-draft" data-value="{p:.6f}">{p:.3f}</td>' for p in r.draft_probs)
    p_target = "".join(f'<td class="p-target" data-value="{p:.6f}">{p:.3f}</td>' for p in r.target_probs)
    target_row = "".join(f'<td class="target-top1" data-token-id="{t}">{label(t)}</td>' for t in top1[:n + 1])
    verdicts, kinds = [], []
    for i in range(n):
        kind = "kept" if i < r.num_accepted else "rejected" if i == r.num_accepted else "unreached"
        kinds.append(kind)
        if kind == "unreached":
            verdicts.append("not checked (after a rejection)")
        elif greedy:
            verdicts.append(("✓ = target's top-1" if kind == "kept" else "✗ ≠ target's top-1"))
        else:
            accept = min(1.0, r.target_probs[i] / r.draft_probs[i]) if r.draft_probs[i] > 0 else 1.0
            u = f"u = {r.uniforms[i]:.3f}" if i < len(r.uniforms) else "u"
            verdicts.append(f"{u} {'<' if kind == 'kept' else '≥'} min(1, p_t/p_d) = {accept:.3f} "
                            f"{'✓' if kind == 'kept' else '✗'}")
    final = "bonus" if r.is_bonus else "correction"
    verdict_cells = "".join(f'<td class="verdict {k}" data-kind="{k}">{v}</td>' for k, v in zip(kinds, verdicts))
    verdict_cells += f'<td class="verdict target" data-kind="{final}">{final}</td>'
    kept = [f'<td class="{k}">{label(t) if k == "kept" else "—"}</td>' for k, t in zip(kinds, r.draft_token_ids)]
    kept.append(f'<td class="{"target" if r.is_bonus else "correction"}" data-token-id="{r.target_token_id}">'
                f'{label(r.target_token_id)}</td>')
    blank = "<td></td>"
    rule = ("greedy: a draft token is kept while it equals the target's top-1 at its row" if greedy else
            "sampling: kept while u < min(1, p_target/p_draft); the first rejection draws the correction from "
            "norm(max(0, p_target − p_draft)) (Leviathan et al. 2023; Chen et al. 2023)")
    return (f'<div id="step-round" data-round="{index}" data-drafted="{n}" data-accepted="{r.num_accepted}" '
            f'data-target-token="{r.target_token_id}" data-emitted="{",".join(map(str, r.emitted_token_ids))}">'
            f"<p><b>Round {index}</b> — drafted by {html.escape(r.draft_source or 'nobody')}, k = {r.k}. {rule}.</p>"
            f'<table class="step-table"><tr><th>position</th>{header}</tr>'
            f"<tr><th>1. draft proposes</th>{drafts}{blank}</tr>"
            f"<tr><th>p_draft</th>{p_draft}{blank}</tr>"
            f"<tr><th>2. target's top-1 (one forward, k+1 rows)</th>{target_row}</tr>"
            f"<tr><th>p_target of the draft token</th>{p_target}{blank}</tr>"
            f"<tr><th>3. comparison</th>{verdict_cells}</tr>"
            f"<tr><th>4. kept</th>{''.join(kept)}</tr></table>"
            f"<p>kept {r.num_accepted} draft token(s) + the target's {final}: "
            f"{len(r.emitted_token_ids)} token(s) for one target forward.</p>{leaves_html(r, label)}</div>")


def leaves_html(r: Round, label) -> str:
    """The round's leaves (the draft's second choices verified as rows of their own), and the one that passed."""
    if not r.leaf_token_ids:
        return ""
    listed = ", ".join(f"position {p + 1}: {label(t)}" for p, t in zip(r.leaf_positions, r.leaf_token_ids))
    passed = (f" The correction was the leaf at position {r.num_accepted + 1}: its own row gave the target's next "
              f"token too, {label(r.emitted_token_ids[-1])}." if r.leaf_passed else " None passed.")
    return f'<p class="step-leaves">Also verified, as leaves (the draft\'s second choice, a row each): {listed}.{passed}</p>'


# --- one position ----------------------------------------------------------------------------------

@user_errors
def show_position(session: StepSession, round_index, position):
    """The one-position figure and a line of numbers for `position` of round `round_index` of the step-through."""
    stepper = session.stepper
    if stepper is None or not stepper.rounds:
        raise ValueError("start the step-through and run at least one round first")
    result = GenerationResult([t for r in stepper.rounds for t in r.emitted_token_ids], list(stepper.rounds), None)
    request = session.request
    view = position_view(session.target, session.draft, request.prompt, result, int(round_index or 1),
                         int(position or 1), temperature=request.temperature, top_p=request.top_p)
    tokenizer = session.target.tokenizer
    return position_figure(view, tokenizer), position_text(view, tokenizer)


def position_text(view: PositionView, tokenizer) -> str:
    """The rule at this position, in numbers (Markdown)."""
    name = lambda t: f"`{token_label(tokenizer, t)}`"  # noqa: E731
    head = f"**Round {view.round_index}, position {view.position}** — {view.outcome}. "
    if view.drafted_token is None:
        return head + (f"The target's own token {name(view.target_token)} drawn from p_target (bonus: every draft "
                       "was kept)." if view.outcome == "bonus" else "Never reached: an earlier draft was rejected.")
    if view.greedy:
        return head + (f"Greedy: the draft's {name(view.drafted_token)} is kept iff it is the target's argmax "
                       f"{name(view.target_argmax)} — the ranking decides, not the probabilities "
                       f"(p_draft = {view.p_draft_token:.3f}, p_target = {view.p_target_token:.3f}).")
    u = "not recorded" if view.uniform is None else f"{view.uniform:.3f}"
    text = (head + f"Draft token {name(view.drafted_token)}: p_draft = {view.p_draft_token:.3f}, "
            f"p_target = {view.p_target_token:.3f}, acceptance min(1, p_target/p_draft) = {view.acceptance:.3f}, "
            f"uniform draw u = {u}.")
    if view.outcome == "rejected":
        text += (f" Rejected, so the correction {name(view.target_token)} was drawn from the residual "
                 "norm(max(0, p_target − p_draft)) (orange bars).")
    return text


def position_figure(view: PositionView, tokenizer):
    """Bars of p_draft and p_target over the top tokens (and the residual on a rejection)."""
    labels = [f"{token_label(tokenizer, t)} #{t}" for t in view.token_ids]
    series = [figures.Series("p_draft", labels, view.p_draft, kind="bar"),
              figures.Series("p_target", labels, view.p_target, kind="bar")]
    if any(view.residual):
        series.append(figures.Series("residual norm(max(0, p_target − p_draft))", labels, view.residual, kind="bar"))
    if view.greedy or view.drafted_token is None:
        title = f"round {view.round_index}, position {view.position}: argmax rule" if view.greedy else \
            f"round {view.round_index}, position {view.position}: the target's own token"
    else:
        u = "—" if view.uniform is None else f"{view.uniform:.3f}"
        title = (f"round {view.round_index}, position {view.position}: min(1, p_t/p_d) = {view.acceptance:.3f}, "
                 f"u = {u} → {view.outcome}")
    return figures.figure(title, "token", "probability", series, y_range=(0, 1.05))


