"""Aligned drafts in the model cache: the registry, loading by name, the CLIs' registration, and the compare
tab's defaults, prepare action and background distillation (tiny in-code models, a temporary cache)."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import gradio as gr
import pytest

from specdec import autoregressive_generate, speculative_generate
from specdec.cli import main
from specdec.dashboard import jobs
from specdec.dashboard.config import AppConfig
from specdec.dashboard.hub import ModelHub
from specdec.dashboard.tabs import compare
from specdec.drafters import Vocabulary, from_spec
from specdec.models import ModelPool, aligned, load_draft, load_model
from specdec.training import service
from tiny_models import Progress

PROMPT = "def add(a, b):"


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """Every test registers into its own empty model cache."""
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def make_hub(paths, **settings) -> ModelHub:
    """A hub over a fresh pool whose defaults are the tiny models."""
    config = AppConfig(max_new_tokens_cap=64, default_target=paths["target"], default_draft=paths["draft"],
                       default_unaligned=paths["unaligned"], **settings)
    return ModelHub(config, pool=ModelPool())


def card(paths, name="tiny-code", method="transplant+distill", target="target", **fields) -> aligned.Card:
    return aligned.Card(name=name, target=aligned.model_id(paths[target]), source=aligned.model_id(paths["unaligned"]),
                        method=method, **{"domain": "code", "steps": 3, **fields})


def test_registry_round_trip_lists_per_target_and_labels(paths):
    folder = aligned.register(paths["unaligned"], card(paths, held_out_acceptance=0.617))
    aligned.register(paths["unaligned"], card(paths, name="for-the-draft", method="transplant", target="draft",
                                              steps=0, domain=""))
    assert folder == aligned.root() / "tiny-code" and (folder / "card.json").is_file()
    assert [c.name for c in aligned.list_aligned(paths["target"])] == ["tiny-code"]
    assert {c.name for c in aligned.list_aligned()} == {"tiny-code", "for-the-draft"}
    read = aligned.find("aligned:tiny-code")
    assert read == card(paths, held_out_acceptance=0.617, created=read.created)
    assert aligned.label(read) == "tiny-unaligned → tiny-target · code · distilled 3 steps · held-out α̂ 0.62"
    untrained = aligned.find("aligned:for-the-draft")
    assert aligned.label(untrained) == "tiny-unaligned → tiny-draft · transplanted, not trained"
    report = {"steps_done": 7, "evals": [{"acceptance_rate": 0.1}, {"acceptance_rate": 0.5}]}  # a report.json
    aligned.register_distilled(paths["unaligned"], report, name="from-report", target=paths["target"],
                               source=paths["unaligned"], domain="finance")
    from_report = aligned.label(aligned.find("aligned:from-report"))
    assert from_report.endswith("finance · distilled 7 steps · held-out α̂ 0.50")
    aligned.register_distilled(paths["unaligned"], {"steps_done": 4}, name="measured-later", target=paths["target"],
                               source=paths["unaligned"], domain="finance")  # trained without a held-out check
    assert aligned.label(aligned.find("aligned:measured-later")).endswith("distilled 4 steps")
    aligned.set_acceptance("measured-later", 0.4321)
    assert aligned.label(aligned.find("aligned:measured-later")).endswith("distilled 4 steps · held-out α̂ 0.43")
    with pytest.raises(ValueError, match="name is 1-80 letters"):
        card(paths, name="../escape")
    with pytest.raises(ValueError, match="no \\*.safetensors"):
        aligned.register(aligned.root(), card(paths, name="empty"))
    with pytest.raises(ValueError, match="registered: "):
        load_model("aligned:missing")


def test_an_aligned_draft_loads_by_name_and_greedy_output_is_the_target_alone(paths):
    target, source = load_model(paths["target"]), load_model(paths["unaligned"], role="train")
    made = service.transplant(target, source, name="tiny-code", domain="code")
    assert (made.target, made.source, made.method) == (str(Path(paths["target"]).resolve()),
                                                        str(Path(paths["unaligned"]).resolve()), "transplant")
    assert len(source.tokenizer) != len(target.tokenizer)  # the source itself is untouched
    draft = load_draft("aligned:tiny-code", target, bridge=Vocabulary.AS_IS)
    assert draft.source == "aligned" and len(draft.tokenizer) == len(target.tokenizer)
    alone = autoregressive_generate(target, PROMPT, max_new_tokens=16)
    assert speculative_generate(target, draft, PROMPT, k=3, max_new_tokens=16).token_ids == alone.token_ids
    by_spec = from_spec("aligned:tiny-code", target, load=load_model, vocabulary="as is")
    assert speculative_generate(target, by_spec, PROMPT, k=3, max_new_tokens=16).token_ids == alone.token_ids


def test_align_and_distill_commands_register_their_outputs(paths, tmp_path, capsys):
    out = tmp_path / "aligned-out"
    assert main(["align", "--target", paths["target"], "--draft", paths["unaligned"], "--out", str(out),
                 "--name", "cli-aligned"]) == 0
    assert "registered as aligned:cli-aligned" in capsys.readouterr().out
    assert aligned.find("aligned:cli-aligned").method == "transplant"
    assert main(["distill", "--target", paths["target"], "--draft", "aligned:cli-aligned", "--prompts", "code",
                 "--train-limit", "1", "--eval-limit", "1", "--steps", "2", "--max-new-tokens", "8",
                 "--eval-max-new-tokens", "8", "--out", str(tmp_path / "distilled")]) == 0
    distilled = aligned.find("aligned:distilled")
    assert (distilled.method, distilled.steps, distilled.domain) == ("transplant+distill", 2, "code")
    assert distilled.source == str(Path(paths["unaligned"]).resolve()) and distilled.held_out_acceptance is not None


def test_compare_defaults_pick_the_aligned_draft_when_there_is_one(paths):
    hub = make_hub(paths)
    today = [(paths["draft"], "as is"), (paths["unaligned"], "naive ids"), (paths["unaligned"], "text bridge")]
    assert hub.compare_defaults() == today
    aligned.register(paths["unaligned"], card(paths, name="older", method="transplant", steps=0))
    aligned.register(paths["unaligned"], card(paths, created="2000-01-01T00:00:00Z"))
    source = aligned.model_id(paths["unaligned"])
    assert hub.compare_defaults() == [(paths["draft"], "as is"), (source, "naive ids"), ("aligned:tiny-code", "as is")]
    assert [u["value"] for u in compare.compare_columns(hub, paths["target"])][4] == "aligned:tiny-code"
    assert hub.compare_defaults(paths["draft"]) == today  # no aligned draft for that target
    shown = "aligned · " + aligned.label(aligned.find("aligned:tiny-code"))
    assert (shown, "aligned:tiny-code") in hub.choices("draft")
    locked = make_hub(paths, allow_custom_models=False)  # folders are not offered there, so neither is the draft
    assert locked.aligned_drafts() == [] and locked.compare_defaults()[2][0] != "aligned:tiny-code"
    with pytest.raises(ValueError, match="does not offer"):
        locked.check("aligned:tiny-code", "draft")


def test_prepare_creates_and_lists_an_aligned_draft_and_is_off_when_the_host_says_so(paths):
    hub = make_hub(paths)
    status, distil = compare.prepare_aligned(hub, paths["target"], paths["unaligned"], "code", "", progress=Progress())
    assert "tiny-unaligned-code" in status and distil["value"] == "aligned:tiny-unaligned-code"
    assert [c.spec for c in aligned.list_aligned(paths["target"])] == ["aligned:tiny-unaligned-code"]
    assert "aligned:tiny-unaligned-code" in [value for _, value in hub.choices("draft")]
    with pytest.raises(gr.Error, match="domain must be one of"):
        compare.prepare_aligned(hub, paths["target"], paths["unaligned"], "poetry", "", progress=Progress())
    with pytest.raises(gr.Error, match="SPECDEC_ALLOW_TRAINING"):
        compare.prepare_aligned(make_hub(paths, allow_training=False), paths["target"], paths["unaligned"], "code",
                                 "", progress=Progress())
    assert not AppConfig.from_env({"SPACE_ID": "x/y"}).allow_training and AppConfig.from_env({}).allow_training


def test_background_distillation_reports_progress_to_a_fresh_page_and_registers_the_result(paths, monkeypatch):
    reached, release = threading.Event(), threading.Event()
    monkeypatch.setattr(service, "distil", _short(service.distil, reached, release))
    hub = make_hub(paths)
    compare.prepare_aligned(hub, paths["target"], paths["unaligned"], "code", "job", progress=Progress())
    assert "background" in compare.start_distill(hub, "aligned:job", 3, progress=Progress())
    assert reached.wait(300)  # the job is paused after its second step
    assert "job**: distilling, step 2 of 3" in compare.training_status(hub, None, 3)[0]  # a reloaded page
    with pytest.raises(gr.Error, match="already being distilled"):
        compare.start_distill(hub, "aligned:job", 3, progress=Progress())
    release.set()
    deadline = time.monotonic() + 300
    while jobs.get("job").state == jobs.RUNNING and time.monotonic() < deadline:
        time.sleep(0.2)
    job = jobs.get("job")
    assert (job.state, job.done, job.steps) == (jobs.FINISHED, 3, 3), job.result
    page, known, *dropdowns = compare.training_status(hub, None, 3)  # a reloaded page asks the registry
    assert "job**: distilled (3 steps)" in page and "aligned:job-distilled" in known
    assert "aligned:job-distilled" in [value for _, value in dropdowns[0]["choices"]]
    distilled = aligned.find("aligned:job-distilled")
    assert (distilled.method, distilled.steps, distilled.domain) == ("transplant+distill", 3, "code")
    assert hub.compare_defaults()[2] == ("aligned:job-distilled", "as is")


def _short(distil, reached: threading.Event, release: threading.Event):
    """service.distil on one prompt per category with 8-token continuations, pausing after step 2 until released."""
    def short(target, name, *, progress, **settings):
        def on_step(step, steps, record):
            progress(step, steps, record)
            if step == 2:
                reached.set()
                release.wait(300)
        return distil(target, name, **settings, progress=on_step, max_new_tokens=8, train_limit=1, eval_limit=1)
    return short
