"""Teaching views on tiny models: step-through, one position, the cost waterfall, export, special-token markers."""
from __future__ import annotations

import csv
import json
import re
import threading

import gradio as gr
import pytest
import torch

from specdec import autoregressive_generate, speculative_generate
from specdec.core import theory
from specdec.core.engine import speculative_rounds
from specdec.costs.waterfall import cost_waterfall, theory_steps
from specdec.dashboard import handlers, teach
from specdec.dashboard.chips import chips_html, token_label
from specdec.dashboard.tabs import live, step, theory as theory_tab
from specdec.lab.position import position_view
from specdec.models import load_model
from specdec.testing import perturbed_copy, tiny_model
from tiny_models import Progress

PROMPT = "def price(option, curve):"


def start(hub, paths, sampling=False, k=3, max_new_tokens=24):
    session = step.StepSession()
    first = step.step_start(hub, paths["target"], paths["draft"], "auto", PROMPT, k, max_new_tokens, sampling, 1.0,
                             1.0, 0, session, progress=Progress())
    return session, first


def engine_result(paths, sampling=False, k=3, max_new_tokens=24):
    target, draft = load_model(paths["target"]), load_model(paths["draft"], role="draft")  # as the app loads them
    return speculative_generate(target, draft, PROMPT, k=k, max_new_tokens=max_new_tokens,
                                temperature=1.0 if sampling else 0.0, seed=0)


@pytest.mark.parametrize("sampling", [False, True], ids=["greedy", "sampling"])
def test_step_through_runs_the_engines_rounds_one_at_a_time(hub, paths, sampling):
    session, first = start(hub, paths, sampling)
    views = [first] + [step.step_next(session) for _ in range(2)]
    reference = engine_result(paths, sampling)
    for index, (panel, chips, status, round_number) in enumerate(views, start=1):
        r = reference.rounds[index - 1]
        assert round_number == index and f"round {index}:" in status
        assert f'data-round="{index}"' in panel and f'data-accepted="{r.num_accepted}"' in panel
        assert f'data-target-token="{r.target_token_id}"' in panel
        shown = [int(t) for t in re.findall(r'class="draft-token" data-token-id="(\d+)"', panel)]
        assert shown == r.draft_token_ids
        top1 = [int(t) for t in re.findall(r'class="target-top1" data-token-id="(\d+)"', panel)]
        assert top1 == [row[0] for row in r.target_top_ids] and len(top1) == len(r.draft_token_ids) + 1
        p_draft = [float(p) for p in re.findall(r'class="p-draft" data-value="([\d.]+)"', panel)]
        assert p_draft == pytest.approx(r.draft_probs, abs=1e-5)
        assert chips.count("round-sep") == index
    assert [r.emitted_token_ids for r in session.stepper.rounds] == [r.emitted_token_ids for r in reference.rounds[:3]]
    while session.stepper.result is None:  # run to the end: the same tokens as one engine call
        step.step_next(session)
    assert session.stepper.result.token_ids == reference.token_ids
    assert "finished" in step.step_next(session)[2]


def test_step_next_before_start_says_what_to_do():
    assert "Start step-through" in step.step_next(step.StepSession())[2]


def test_one_position_recomputes_the_engines_probabilities_and_draws_the_rule(hub, paths):
    session, _ = start(hub, paths, sampling=True)
    for _ in range(3):
        step.step_next(session)
    checked = 0
    for index, r in enumerate(session.stepper.rounds, start=1):
        for position in range(1, len(r.draft_token_ids) + 2):
            figure, text = step.show_position(session, index, position)
            assert f"Round {index}, position {position}" in text
            if position > len(r.draft_token_ids):
                continue
            if position <= r.num_accepted + 1:  # reached: the rule's numbers are shown
                accept = min(1.0, r.target_probs[position - 1] / r.draft_probs[position - 1])
                assert f"= {accept:.3f}" in text and f"u = {r.uniforms[position - 1]:.3f}" in text
                assert (r.uniforms[position - 1] < accept) == (position <= r.num_accepted)
                checked += 1
            if position == r.num_accepted + 1:
                assert "residual" in text and any(t.name.startswith("residual") for t in figure.data)
    assert checked >= 3
    with pytest.raises(gr.Error, match="position must be in"):
        step.show_position(session, 1, 99)


def test_position_view_matches_the_round_and_greedy_uses_the_argmax():
    torch.manual_seed(0)
    target = tiny_model("llama", seed=0)
    draft = perturbed_copy(target, 0.3)
    prompt = [5, 6, 7, 8]
    for temperature in (0.0, 1.0):
        result = speculative_generate(target, draft, prompt, k=3, max_new_tokens=16, temperature=temperature, seed=1)
        for index, r in enumerate(result.rounds[:3], start=1):
            for position in range(1, len(r.draft_token_ids) + 1):
                view = position_view(target, draft, prompt, result, index, position, temperature=temperature)
                assert view.p_draft_token == pytest.approx(r.draft_probs[position - 1], abs=1e-4)
                assert view.p_target_token == pytest.approx(r.target_probs[position - 1], abs=1e-4)
                if temperature == 0 and view.outcome in ("accepted", "rejected"):
                    assert view.kept == (view.drafted_token == view.target_argmax)
                    assert view.acceptance is None and view.uniform is None
                if view.outcome == "rejected" and temperature > 0:
                    assert sum(view.residual) > 0 and view.target_token == r.target_token_id


def test_position_view_computes_the_logits_of_the_shown_row_only():
    target = tiny_model("llama", seed=0, context=512)
    prompt = list(range(4, 100)) * 4  # 384 tokens
    result = speculative_generate(target, perturbed_copy(target, 0.3), prompt, k=3, max_new_tokens=8)
    shapes = []
    hook = target.register_forward_hook(lambda module, args, output: shapes.append(tuple(output.logits.shape)))
    try:
        position_view(target, target, prompt, result, 1, 1)
    finally:
        hook.remove()
    assert shapes and all(shape[1] == 1 for shape in shapes)  # [1, 1, V], never [1, 384, V]


def test_waterfall_walks_from_eq1_through_the_bound_to_the_measurement():
    target = tiny_model("llama", seed=0)
    draft = perturbed_copy(target, 0.3)
    result = speculative_generate(target, draft, [5, 6, 7, 8], k=3, max_new_tokens=20)
    baseline = autoregressive_generate(target, [5, 6, 7, 8], max_new_tokens=len(result.token_ids))
    steps = cost_waterfall(result, baseline)
    s = result.stats
    assert [round(x.value, 9) for x in steps[:4]] == [round(v, 9) for v in (
        s.theoretical_speedup, s.leviathan_bound,
        theory.predicted_speedup(s.acceptance_rate, s.k, s.cost_ratio, s.verify_cost), s.rounds_speedup)]
    assert steps[4].value == s.predicted_speedup and "predicted" in steps[4].label
    assert steps[-1].value == pytest.approx(s.tokens_per_s / baseline.stats.tokens_per_s)
    assert len(steps) == 6 and "measured" in steps[-1].label
    assert len(cost_waterfall(result)) == 5  # without a baseline: up to the prediction
    figure = handlers.waterfall_figure(steps)
    assert figure.data[0].type == "waterfall" and list(figure.data[0].measure)[-1] == "absolute"
    assert [x.value for x in theory_steps(0.8, 5, 0.0, 1.0)][:2] == pytest.approx([3.69, 3.69], abs=0.01)
    assert theory_tab.theory_waterfall(0.7, 0.3, 0.1, 4).data[0].type == "waterfall"


def test_export_writes_the_apis_json_and_the_round_table_csv(tmp_path):
    target = tiny_model("llama", seed=0)
    result = speculative_generate(target, perturbed_copy(target, 0.3), [5, 6, 7, 8], k=3, max_new_tokens=12)
    json_path, csv_path = live.export_files(result, None, tmp_path)
    assert json.loads(open(json_path, encoding="utf-8").read()) == json.loads(json.dumps(result.to_dict()))
    rows = list(csv.DictReader(open(csv_path, encoding="utf-8")))
    assert len(rows) == len(result.rounds) and rows[0]["round"] == "1"
    assert [int(r["accepted"]) for r in rows] == [r.num_accepted for r in result.rounds]


def test_after_live_gives_waterfall_and_downloads_for_the_sessions_last_run(hub, paths):
    from specdec.dashboard.runs import RunControl

    control = RunControl()
    assert live.after_live(control) == (gr.skip(), gr.skip(), gr.skip())
    list(live.live_decode(hub, paths["target"], paths["draft"], "auto", PROMPT, 3, 16, False, 0.8, 1.0, 0, True,
                              control, progress=Progress()))
    run = live._LAST[control]
    assert len(run.baseline.token_ids) == len(run.result.token_ids)  # the baseline ran to the same length
    figure, json_path, csv_path = live.after_live(control)
    assert figure.data[0].type == "waterfall" and len(figure.data[0].x) == 6
    assert json.loads(open(json_path, encoding="utf-8").read())["stats"]["rounds"] > 0


class SpecialTokenizer:
    def decode(self, ids, skip_special_tokens=False):
        return "".join({1: "<|im_start|>", 2: "user\n", 3: "</s>"}[i] for i in ids)


def test_special_tokens_render_as_readable_markers():
    assert token_label(SpecialTokenizer(), 1) == "⟨im_start⟩" and token_label(SpecialTokenizer(), 3) == "⟨/s⟩"
    html_text = chips_html([], SpecialTokenizer(), prompt="<|im_start|>user\nhi<|im_end|>")
    assert '<span class="special-token">⟨im_start⟩</span>user⏎' in html_text and "⟨im_end⟩" in html_text
    assert "&lt;|im_start|&gt;" not in html_text


def test_classroom_preset_and_default_prompt():
    from specdec.dashboard.config import PROMPTS
    from specdec.models.entries import default_name

    target, draft, preset, prompt, k, new = live.classroom(24)
    assert prompt == PROMPTS[preset] and new == 24 and (k == "auto" or 1 <= k <= 10)
    assert draft in ("lookup", default_name("draft")) and target == default_name("target")
    assert next(iter(PROMPTS)) == "Python code" and PROMPTS["Chinese chat: 今天天气"] == "今天天气"


def test_stepper_close_ends_the_paused_decode_after_its_round():
    target = tiny_model("llama", seed=0)
    draft = perturbed_copy(target, 0.3)
    threads = threading.active_count()
    decode = speculative_rounds(target, draft, [5, 6, 7], k=2, max_new_tokens=30)
    stepper = teach.Stepper(decode)
    assert stepper.next_round() is not None and stepper.next_round() is not None
    assert threading.active_count() == threads  # the decode pauses in place: no worker thread
    stepper.close()
    assert decode.gi_frame is None and stepper.next_round() is None and len(stepper.rounds) == 2
