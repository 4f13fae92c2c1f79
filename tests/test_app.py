"""Dashboard handlers on tiny in-code models (no browser, no downloads)."""
from __future__ import annotations

import html

import gradio as gr
import pytest

from specdec import DecodeStats, Round, autoregressive_generate
from specdec.core import theory
from specdec.dashboard import handlers
from specdec.dashboard.chips import chips_html
from specdec.dashboard.config import AppConfig
from specdec.dashboard.hub import ModelHub
from specdec.dashboard.panels import definitions, stats_html
from specdec.dashboard.profiles import THIS_MACHINE
from specdec.dashboard.runs import DecodeRequest, RunControl
from specdec.dashboard.tabs import compare, live, theory as theory_tab
from specdec.lab import plots as figures
from specdec.lab.report import STAT_LINES
from specdec.models import ModelPool, load_model
from tiny_models import Progress

PROMPT = "今天天气"


def decode(hub, paths, control=None, **overrides):
    """All views yielded by live_decode for the tiny pair (greedy, k=3, 24 tokens unless overridden)."""
    inputs = dict(target=paths["target"], draft=paths["draft"], bridge="auto", prompt=PROMPT, k=3,
                  max_new_tokens=24, sampling=False, temperature=0.8, top_p=1.0, seed=0, measure_baseline=True)
    inputs.update(overrides)
    return list(live.live_decode(hub, *inputs.values(), control or RunControl(), progress=Progress()))


def test_config_honours_gradio_host_and_port_and_ours_win():
    gradio = {"GRADIO_SERVER_NAME": "0.0.0.0", "GRADIO_SERVER_PORT": "7861"}
    assert (AppConfig.from_env(gradio).host, AppConfig.from_env(gradio).port) == ("0.0.0.0", 7861)
    both = AppConfig.from_env(gradio | {"SPECDEC_HOST": "127.0.0.2", "SPECDEC_PORT": "8000"})
    assert (both.host, both.port) == ("127.0.0.2", 8000)
    with pytest.raises(ValueError, match="GRADIO_SERVER_PORT"):
        AppConfig.from_env({"GRADIO_SERVER_PORT": "http"})


def test_config_from_env_reads_every_variable_and_names_bad_ones():
    config = AppConfig.from_env({"SPECDEC_PORT": "8000", "SPECDEC_ALLOWED_MODELS": "a, b", "SPECDEC_CONCURRENCY": "3",
                                 "SPECDEC_ALLOW_CUSTOM_MODELS": "0", "SPECDEC_MAX_NEW_TOKENS": "32"})
    assert (config.port, config.allowed_models, config.concurrency) == (8000, ("a", "b"), 3)
    assert not config.allow_custom_models and config.max_new_tokens_cap == 32
    assert AppConfig.from_env({"SPACE_ID": "x/y"}).host == "0.0.0.0"
    assert not AppConfig.from_env({"SPACE_ID": "x/y"}).allow_custom_models
    with pytest.raises(ValueError, match="SPECDEC_PORT"):
        AppConfig.from_env({"SPECDEC_PORT": "http"})
    with pytest.raises(ValueError, match="SPECDEC_ALLOW_CUSTOM_MODELS"):
        AppConfig.from_env({"SPECDEC_ALLOW_CUSTOM_MODELS": "maybe"})


@pytest.mark.parametrize("change, message", [
    (dict(prompt="  "), "empty prompt"),
    (dict(k=11), "k must be 'auto' or an integer in 1..10"),
    (dict(k=0), "k must be 'auto' or an integer in 1..10"),
    (dict(k="often"), "k must be an integer"),
    (dict(max_new_tokens=65), "max new tokens must be an integer in 1..64"),
    (dict(k=2.5), "k must be an integer"),
])
def test_request_checks_say_which_input_to_change(change, message):
    values = dict(target="t", draft="d", prompt="hi", k=3, max_new_tokens=8) | change
    with pytest.raises(ValueError, match=message):
        DecodeRequest.from_inputs(**values).checked(AppConfig(max_new_tokens_cap=64))


def test_allow_list_and_custom_models(paths):
    locked = ModelHub(AppConfig(allowed_models=("qwen2.5-coder-1.5b-instruct",), allow_custom_models=False),
                      pool=ModelPool())
    with pytest.raises(ValueError, match="not offered on this host"):
        locked.check("qwen2.5-coder-0.5b-instruct", "target")
    with pytest.raises(ValueError, match="custom model paths and ids are disabled"):
        locked.check(paths["target"], "target")
    assert locked.check("lookup", "draft") == "lookup"
    assert [value for _, value in locked.choices("target")] == ["qwen2.5-coder-1.5b-instruct"]


def test_the_allow_list_reads_drafts_with_the_factorys_grammar(paths):
    locked = ModelHub(AppConfig(allowed_models=("qwen2.5-coder-1.5b-instruct",), allow_custom_models=False),
                      pool=ModelPool())
    assert locked.check("qwen2.5-coder-1.5b-instruct+lookup", "draft") == "qwen2.5-coder-1.5b-instruct+lookup"
    assert locked.check("self:3+lookup", "draft") == "self:3+lookup"
    with pytest.raises(ValueError, match="not offered on this host"):
        locked.check("qwen2.5-coder-0.5b-instruct+lookup", "draft")
    with pytest.raises(ValueError, match="custom path, disabled"):
        locked.check("qwen2.5-coder-1.5b-instruct@vocab=/etc/passwd", "draft")
    with pytest.raises(ValueError, match="custom model paths and ids are disabled"):
        locked.check(f"{paths['draft']}+lookup", "draft")
    for bad, message in (("self:x", "self:8"), ("lookup" + "+lookup" * 1500, "at most 4096 characters")):
        with pytest.raises(ValueError, match=message):
            locked.check(bad, "draft")


def test_live_decode_streams_rounds_and_greedy_equals_target_alone(hub, paths):
    views = decode(hub, paths)
    final = views[-1]
    assert len(views) >= 3  # at least one streamed update, the "measuring" step and the final view
    assert "identical to the target alone" in final.status
    result = handlers.speculate(hub, paths["target"], paths["draft"], PROMPT, 3, 24, 0.0, 0)
    target = load_model(paths["target"])
    alone = autoregressive_generate(target, PROMPT, max_new_tokens=24)
    assert result["token_ids"] == alone.token_ids
    assert len(final.table) == len(result["rounds"])
    assert list(final.table.columns) == ["round", "k", "drafted by", "matches", "accepted", "target token", "kind",
                                         "produced"]
    assert 'class="chip chip-accepted"' in final.chips or 'class="chip chip-rejected"' in final.chips
    assert "measured speedup" in final.stats and "tokens/s, target alone" in final.stats
    for _, label, _ in STAT_LINES:
        assert html.escape(label) in final.stats


def test_stop_ends_the_run_after_the_current_round_and_only_for_its_session(hub, paths):
    mine, other = RunControl(), RunControl()
    updates = live.live_decode(hub, paths["target"], paths["draft"], "auto", PROMPT, 1, 64, False, 0.8, 1.0, 0,
                                   True, mine, progress=Progress())
    other.start()
    first = next(updates)
    live.stop(mine)
    views = [first, *updates]
    assert views[-1].status.startswith("stopped by you")
    assert len(views[-1].table) < 64  # k=1: at most 2 tokens a round, so 64 tokens need >= 32 rounds
    assert not other.token.stopped


def test_bad_input_is_a_visible_gr_error(hub, paths):
    with pytest.raises(gr.Error, match="empty prompt"):
        decode(hub, paths, prompt="")
    with pytest.raises(gr.Error, match="exceeds the target's context"):
        decode(hub, paths, prompt="x" * 600)
    with pytest.raises(gr.Error, match="vocabulary mismatch"):
        decode(hub, paths, draft=paths["unaligned"], bridge="as is")
    with pytest.raises(gr.Error, match="unknown model"):
        handlers.speculate(hub, "no-such-model-here", "lookup", PROMPT, 3, 8, 0.0, 0)


def test_compare_runs_each_draft_and_reports_the_one_that_cannot(hub, paths):
    *_, (aligned, naive, as_is, table, chart, status) = compare.compare(
        hub, {}, paths["target"], PROMPT, 3, 12, THIS_MACHINE, paths["draft"], "as is", paths["unaligned"],
        "naive ids", paths["unaligned"], "as is", progress=Progress())
    assert "chip-" in aligned and "chip-" in naive
    assert "vocabulary mismatch" in as_is
    assert status.startswith("done: 2 draft(s)")
    assert list(table.columns)[1:] == ["1: tiny-draft (as is)", "2: tiny-unaligned (naive ids)"]
    assert table.iloc[-1]["metric"].startswith("measured speedup")
    assert len(chart.data) == 2


def test_k_sweep_measures_each_k_and_pools_alpha(hub, paths):
    updates = list(theory_tab.k_sweep(hub, {}, paths["target"], paths["draft"], "auto", PROMPT, 12, 3, THIS_MACHINE,
                                      progress=Progress()))
    figure, alpha, c, slope, table, sweep, status = updates[-1]
    assert [k for k, _ in sweep["points"]] == [1, 2, 3] and status == "done"
    assert list(table["k"]) == [1, 2, 3] and sweep["verify"][0] == 1.0
    assert 0 <= alpha <= 1 and c > 0 and slope == pytest.approx(hub.costs(*hub.pair(
        paths["target"], paths["draft"])).verify_slope(), abs=1e-3)
    names = [trace.name for trace in figure.data]
    assert "measured speedup" in names and "v(k+1) measured" in names
    predicted = next(t for t in figure.data if t.name.startswith("predicted"))
    assert list(table["predicted"])[0] > 0 and len(predicted.y) == 3


def synthetic_rounds() -> list[Round]:
    common = dict(draft_time_s=0.01, target_time_s=0.1, draft_forwards=3)
    return [
        Round([5, 6, 7], [0.9, 0.8, 0.7], [0.95, 0.1, 0.3], [True, False, True], 1, 9, [5, 9], **common),
        Round([5, 6, 7], [0.9, 0.8, 0.7], [0.9, 0.9, 0.9], [True, True, True], 3, 4, [5, 6, 7, 4], **common),
    ]


def test_chips_mark_every_kind_and_show_both_probabilities_on_hover():
    html = chips_html(synthetic_rounds(), tokenizer=None, prompt="p")
    for kind, count in (("accepted", 4), ("rejected", 1), ("unreached", 1), ("correction", 1), ("bonus", 1)):
        assert html.count(f"chip chip-{kind}") == count
    assert "p_draft = 0.800" in html and "p_target = 0.100" in html


def test_figures_plot_the_engine_statistics():
    rounds = synthetic_rounds()
    stats = DecodeStats.from_rounds(rounds, 3)
    running = figures.running_acceptance(rounds, 3).data[0].y
    assert running[-1] == pytest.approx(stats.acceptance_rate)
    assert list(figures.accepted_length_histogram(rounds, 3).data[0].y) == [0, 1, 0, 1]
    assert list(figures.per_position_acceptance(stats).data[0].y) == stats.per_position_acceptance
    curves = figures.speedup_curves(0.8, 0.0, 10, [(5, 2.0)])
    assert curves.data[0].y[4] == pytest.approx(3.69, abs=0.01)  # Leviathan et al. Table 1: α=0.8, k=5
    priced = figures.speedup_curves(0.8, 0.1, 10, [], slope=0.25)
    predicted = next(t for t in priced.data if t.name.startswith("predicted"))
    assert predicted.y[3] == pytest.approx(theory.predicted_speedup(0.8, 4, 0.1, 1 + 0.25 * 4))


def test_every_stat_has_a_hover_definition():
    html = stats_html(DecodeStats.from_rounds(synthetic_rounds(), 3))
    assert html.count('title="') == len(STAT_LINES)
    assert "accepted / (accepted + rejections)" in definitions()["acceptance_rate"]


def test_dropdown_labels_follow_the_models_readiness(hub, monkeypatch):
    import dataclasses

    from specdec.models import entries
    state = {"status": "needs assembly"}  # what the machine holds "now"
    monkeypatch.setattr(entries, "with_status", lambda entry: dataclasses.replace(entry, status=state["status"]))
    name = entries.names()[0]
    labels = lambda: [label for label, value in handlers.model_choices(hub, 2)[0]["choices"] if value == name]  # noqa: E731
    assert labels()[0].endswith("needs assembly")
    state["status"] = "ready"  # e.g. a run just assembled and converted it
    assert labels()[0].endswith("ready")
