"""Teaching views of the live tab: one round at a time, one position's sampling rule, the cost waterfall, export.

- Step-through: `Stepper` runs the engine's own decode in a worker thread that pauses after every
  round (`on_round` blocks until the next click; returning False ends the decode), so "Next round"
  costs exactly one engine round. `step_html` shows that round: the draft's proposals with p_draft,
  the target's top-1 at each of the k+1 rows of its one forward, the comparison, and what is kept.
- One position: `specdec.lab.position.position_view` recomputes p_draft and p_target there;
  `position_figure` draws them with the rule (sampling: u < min(1, p_target/p_draft), residual on
  rejection; greedy: the argmax).
- Waterfall: `specdec.costs.waterfall` steps from Eq. 1 to the measured speedup; `waterfall_figure` draws them.
- Export: the run as JSON (`GenerationResult.to_dict()`, the API's schema) and CSV (the round table).

Handlers here are plain functions (bound to the hub with functools.partial in `layout`).
"""
from __future__ import annotations

import csv
import html
import json
import queue
import tempfile
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import gradio as gr

from specdec.core.engine import speculative_generate
from specdec.core.trace import GenerationResult, Round
from specdec.costs.waterfall import Step, cost_waterfall, theory_steps
from specdec.lab.position import PositionView, position_view
from specdec.lab.report import round_rows

from specdec.dashboard.chips import chips_html, token_label
from specdec.dashboard.config import PROMPTS
from specdec.dashboard.runs import DecodeRequest
from specdec.lab import plots as figures

IDLE_S = 600.0  # a paused step-through ends (its worker thread returns) after this long without a click

CSS = """
.step-table { border-collapse: collapse; font-family: ui-monospace, SFMono-Regular, Menlo, monospace; }
.step-table th, .step-table td { border: 1px solid #e3e3e3; padding: 3px 8px; text-align: center; }
.step-table th { background: #f6f6f6; font-weight: 600; text-align: left; }
.step-table .kept { background: #c6f0c2; } .step-table .rejected { background: #f8c9c4; }
.step-table .unreached { color: #8a8a8a; } .step-table .target { background: #bcd7ff; }
.step-table .correction { background: #ffd98a; }
"""


# --- classroom preset -----------------------------------------------------------------------------

CLASSROOM = {  # a run quick enough to watch live on a laptop CPU, chosen by measurement (README, "Start here"):
    # on a shared 2-core CPU (contended) 32 tokens took 8.8 s, 3.6 tokens/s vs 1.2 for the target alone (2.9x),
    # where the 0.5B model draft on the code preset ran at 0.45 tokens/s vs 0.52 (0.88x, 70 s)
    "target": "qwen2.5-coder-1.5b-instruct",
    "draft": "lookup",  # prompt lookup: no draft model to run, drafts copied from the prompt
    "preset": "summarise (prompt lookup copies from it)",
    "k": "auto",
    "max_new_tokens": 32,
}


def classroom(max_new_tokens_cap: int = 256):
    """(target, draft, preset, prompt, k, max new tokens) of the classroom preset (within this host's cap)."""

    c = CLASSROOM
    return (c["target"], c["draft"], c["preset"], PROMPTS[c["preset"]], c["k"],
            min(c["max_new_tokens"], max_new_tokens_cap))


# --- step-through ---------------------------------------------------------------------------------

class Stepper:
    """A decode that advances one engine round per `next_round` call.

    run(on_round) starts the decode (e.g. `speculative_generate(..., on_round=on_round)`); it runs in a
    worker thread that blocks inside on_round after every round until the next call (or `close`).
    """

    def __init__(self, run: Callable[[Callable[[Round], bool]], GenerationResult], idle_s: float = IDLE_S):
        self._run = run
        self._events: queue.Queue = queue.Queue()  # rounds, then the GenerationResult (or an exception)
        self._go = threading.Semaphore(0)  # one permit per "next round"
        self._thread: threading.Thread | None = None
        self.idle_s = idle_s
        self.closed = False
        self.rounds: list[Round] = []  # rounds so far, in order
        self.result: GenerationResult | None = None  # set once the engine returned

    def next_round(self) -> Round | None:
        """Run one more round and return it; None once the decode has ended (then `result` is set)."""
        if self.result is not None or self.closed:
            return None
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, daemon=True, name="specdec-step")
            self._thread.start()
        else:
            self._go.release()
        item = self._events.get()
        if isinstance(item, BaseException):
            self.closed = True
            raise item
        if isinstance(item, GenerationResult):
            self.result = item
            return None
        self.rounds.append(item)
        return item

    def close(self) -> None:
        """End the decode after the round it is paused on."""
        self.closed = True
        self._go.release()

    def _on_round(self, round_: Round) -> bool:
        self._events.put(round_)
        return self._go.acquire(timeout=self.idle_s) and not self.closed

    def _work(self) -> None:
        try:
            self._events.put(self._run(self._on_round))
        except BaseException as error:  # noqa: BLE001 - handed to the caller's thread, which re-raises it
            self._events.put(error)


class StepSession:
    """A browser session's step-through (lives in a gr.State; a plain class, as gr.State copies dataclasses)."""

    def __init__(self):
        self.stepper: Stepper | None = None  # the paused decode
        self.request: DecodeRequest | None = None  # what it decodes
        self.target = None  # the loaded target (a LoadedModel)
        self.draft = None  # the draft as the engine got it

    def close(self) -> None:
        if self.stepper is not None:
            self.stepper.close()
        self.stepper = None


def step_start(hub, target, draft, bridge, prompt, k, max_new_tokens, sampling, temperature, top_p, seed,
               session: StepSession, progress=gr.Progress(track_tqdm=True)):
    """Load the pair, start a paused decode and show its first round."""
    try:
        request = DecodeRequest.from_inputs(target, draft, prompt, k, max_new_tokens,
                                            temperature if sampling else 0.0, top_p,
                                            0 if seed in (None, "") else seed).checked(hub.config)
        session.close()
        target_model, draft_model = hub.pair(request.target, request.draft, bridge, progress=progress)
        costs = hub.costs(target_model, draft_model, progress=progress)
    except ValueError as error:
        raise gr.Error(str(error), print_exception=False) from error
    session.request, session.target, session.draft = request, target_model, draft_model
    session.stepper = Stepper(lambda on_round: speculative_generate(
        target_model, draft_model, request.prompt, k=request.k, max_new_tokens=request.max_new_tokens,
        temperature=request.temperature, top_p=request.top_p, seed=request.seed, on_round=on_round, costs=costs))
    return step_next(session)


def step_next(session: StepSession):
    """One more engine round: (step panel HTML, chips HTML, status, round number for the position picker)."""
    stepper = session.stepper
    if stepper is None:
        return "", "", "press **Start step-through** first", gr.skip()
    try:
        round_ = stepper.next_round()
    except ValueError as error:
        raise gr.Error(str(error), print_exception=False) from error
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
            f"{len(r.emitted_token_ids)} token(s) for one target forward.</p></div>")


# --- one position ----------------------------------------------------------------------------------

def show_position(session: StepSession, round_index, position):
    """The one-position figure and a line of numbers for `position` of round `round_index` of the step-through."""
    stepper = session.stepper
    if stepper is None or not stepper.rounds:
        raise gr.Error("start the step-through and run at least one round first", print_exception=False)
    result = GenerationResult([t for r in stepper.rounds for t in r.emitted_token_ids], list(stepper.rounds), None)
    request = session.request
    try:
        view = position_view(session.target, session.draft, request.prompt, result, int(round_index or 1),
                             int(position or 1), temperature=request.temperature, top_p=request.top_p)
    except ValueError as error:
        raise gr.Error(str(error), print_exception=False) from error
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


# --- waterfall ------------------------------------------------------------------------------------

def waterfall_figure(steps: list[Step], title: str = "from the bound to the measurement"):
    """The steps as a waterfall: the first bar absolute, then each step's change, the last a total."""
    top = max([s.value for s in steps] + [1.0])
    return figures.figure(title, "", "speedup over the target alone",
                          [figures.Series("speedup", [s.label for s in steps], [s.value for s in steps],
                                          kind="waterfall", text=[f"{s.value:.2f}×" for s in steps],
                                          hover=[s.formula for s in steps])], y_range=(0, top * 1.3))


def theory_waterfall(alpha: float, c: float, slope: float, k: int):
    """The theory tab's waterfall at k: Eq. 1 -> Leviathan's bound -> verification at v(k+1) = 1 + slope·k."""
    k = int(k)
    return waterfall_figure(theory_steps(float(alpha), k, float(c), 1.0 + float(slope) * k),
                            f"at k = {k}: tokens per forward → drafting → verification")


# --- the last live run: waterfall and export --------------------------------------------------------

@dataclass
class LiveRun:
    result: GenerationResult  # the speculative run
    baseline: GenerationResult | None  # the target alone, when measured
    tokenizer: object  # the target's tokenizer


_LAST: "weakref.WeakKeyDictionary[object, LiveRun]" = weakref.WeakKeyDictionary()  # per session's RunControl


def remember(control, result: GenerationResult, baseline: GenerationResult | None, tokenizer) -> None:
    """Keep a session's finished live run for the waterfall and the downloads (`after_live`)."""
    _LAST[control] = LiveRun(result, baseline, tokenizer)


def after_live(control):
    """(waterfall figure, JSON file, CSV file) of the session's last live run; skips when there is none."""
    run = _LAST.get(control)
    if run is None:
        return gr.skip(), gr.skip(), gr.skip()
    json_path, csv_path = export_files(run.result, run.tokenizer)
    return waterfall_figure(cost_waterfall(run.result, run.baseline)), json_path, csv_path


def export_files(result: GenerationResult, tokenizer, folder: str | Path | None = None) -> tuple[str, str]:
    """Write the run as specdec-run.json (`to_dict()`, the API's schema) and specdec-rounds.csv (the round table)."""
    folder = Path(folder or tempfile.mkdtemp(prefix="specdec-export-"))
    json_path, csv_path = folder / "specdec-run.json", folder / "specdec-rounds.csv"
    json_path.write_text(json.dumps(result.to_dict(), ensure_ascii=False, indent=1), encoding="utf-8")
    rows = round_rows(result, tokenizer)
    with csv_path.open("w", newline="", encoding="utf-8") as handle:
        if rows:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    return str(json_path), str(csv_path)
