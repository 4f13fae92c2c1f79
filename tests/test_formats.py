"""The weight format chosen by measurement on this machine (specdec.models.formats), and the draft's precision
apart from the target's: greedy output and the sampling law stay the target's."""
import pytest
import torch

from specdec import autoregressive_generate, speculative_generate
from specdec.core import hardware
from specdec.models import formats, loading, native, quant, quant4
from specdec.models.formats import FormatTiming
from specdec.testing import perturbed_copy, tiny_config, tiny_folder, tiny_model
from test_quant import OTHER_LIMIT
from test_sampling import PROMPT, assert_the_target_law

TIMINGS = [FormatTiming("float32", 0.30, 0.90), FormatTiming("bfloat16", 0.10, 0.11),
           FormatTiming("int8", 0.15, 0.16), FormatTiming("int8-dynamic", 0.05, 0.12)]


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def measured(monkeypatch):
    """time_formats replaced by TIMINGS (for the candidates asked), counting its calls."""
    calls = []

    def timed(config, candidates, **kwargs):
        calls.append(list(candidates))
        return [t for t in TIMINGS if t.format in candidates]

    monkeypatch.setattr(formats, "time_formats", timed)
    return calls


def test_a_target_takes_the_fastest_row_invariant_format_and_a_draft_the_fastest(measured):
    config = tiny_config("qwen2")
    target = formats.choose_format(config, "target")
    assert measured == [["int8", "int4"]]  # a target's candidates only: the row-invariant formats
    assert target.chosen == "int8" and "one-token steps" in target.reason  # bfloat16 is faster, but not exact
    draft = formats.choose_format(config, "draft")
    assert measured[1] == list(formats.FORMATS) and len(measured) == 2
    assert draft.chosen == "int8-dynamic" and "never changes the output" in draft.reason
    assert "int8      " not in draft.describe().split("\n")[1]  # fastest first, marked
    assert draft.describe().split("\n")[1].startswith(" * int8-dynamic")


def test_a_target_reads_a_draft_calibration_of_the_same_architecture(measured):
    config = tiny_config("llama")
    formats.choose_format(config, "draft")
    target = formats.choose_format(config, "target")
    assert len(measured) == 1 and not target.measured_now and target.chosen == "int8"
    assert [t.format for t in target.timings] == ["int8"]  # of the draft's timings, a target's candidates only


def test_on_a_gpu_the_cpu_only_formats_are_not_candidates(measured):
    choice = formats.choose_format(tiny_config("llama"), "target", device="cuda")
    assert measured[0] == ["float32", "bfloat16"] and choice.chosen == "bfloat16"
    assert "no row-invariant format" in choice.reason


def test_a_choice_is_cached_per_machine_kernel_path_and_shape_and_measured_again_on_request(measured, monkeypatch):
    config = tiny_config("llama")
    first = formats.choose_format(config, "target")
    again = formats.choose_format(config, "target")
    assert len(measured) == 1 and first.measured_now and not again.measured_now and again.chosen == first.chosen
    formats.choose_format(config, "target", recalibrate=True)
    assert len(measured) == 2
    formats.choose_format(tiny_config("llama", hidden=32), "target")  # other shapes
    assert len(measured) == 3
    monkeypatch.setattr(quant, "weight_limit", lambda: OTHER_LIMIT)  # another int8 kernel path
    formats.choose_format(config, "target")
    assert len(measured) == 4
    about = hardware.describe()
    monkeypatch.setattr(hardware, "describe", lambda device="cpu": {**about, "cpu": "another CPU"})
    formats.choose_format(config, "target")
    assert len(measured) == 5


def test_a_cached_choice_is_read_without_measuring(measured):
    config = tiny_config("llama")
    assert formats.cached_choice(config, "draft") is None and measured == []  # nothing cached: nothing timed
    chosen = formats.choose_format(config, "draft")
    cached = formats.cached_choice(config, "draft")
    assert len(measured) == 1 and not cached.measured_now
    assert (cached.chosen, cached.timings, cached.key) == (chosen.chosen, chosen.timings, chosen.key)
    assert formats.cached_choice(config, "target").chosen == "int8" and len(measured) == 1
    with pytest.raises(ValueError, match="role must be one of target, draft"):
        formats.cached_choice(config, "teacher")


def test_every_format_is_timed_on_the_architecture_with_random_weights():
    timings = formats.time_formats(tiny_config("qwen2", hidden=32, layers=6), formats.FORMATS, repeats=2)
    assert [t.format for t in timings] == list(formats.FORMATS)
    assert all(t.step_s > 0 and t.verify_s > 0 for t in timings)


def test_load_model_auto_loads_the_measured_choice_for_its_role(tmp_path, measured):
    folder = str(tiny_folder(tmp_path / "model", seed=0, arch="qwen2"))
    target = loading.load_model(folder)
    draft = loading.load_model(folder, role="draft")
    assert target.dtype == "int8" and formats.format_of(target.model) == "int8"
    assert draft.dtype == "int8-dynamic"
    assert all(m.coupled is not None for m in draft.model.modules() if isinstance(m, quant.Int8Linear))
    assert loading.load_model(folder, role="train").dtype == "float32"  # what training computes in
    assert loading.load_model(folder, dtype="bfloat16").dtype == "bfloat16"  # an explicit format is kept


@pytest.mark.parametrize("draft_format", ["bfloat16", "int8", "int8-dynamic", "int4-dynamic"])
def test_a_draft_in_another_format_than_the_target_keeps_greedy_output(draft_format):
    target = tiny_model("qwen2", seed=0)
    draft = formats.to_format(perturbed_copy(target, noise=0.05), draft_format)
    if draft_format == "bfloat16":
        draft = draft.to(torch.bfloat16)
    alone = autoregressive_generate(target, PROMPT, max_new_tokens=24, eos_token_id=[])
    result = speculative_generate(target, draft, PROMPT, k=4, max_new_tokens=24, eos_token_id=[])
    assert result.token_ids == alone.token_ids
    assert sum(r.num_accepted for r in result.rounds) > 0  # the quantized draft still proposes what the target keeps


@pytest.mark.parametrize("draft_format", ["int8-dynamic", "int4-dynamic"])
def test_a_quantized_draft_keeps_the_targets_sampling_law(draft_format):
    target = tiny_model("llama", seed=3, vocab_size=48)
    assert_the_target_law(target, formats.to_format(perturbed_copy(target, noise=0.6, seed=5), draft_format))


def test_a_target_format_with_a_fast_step_but_a_costly_verification_does_not_win(monkeypatch):
    """int4's one-token step beats int8's, its 5-token verification costs far more: the target keeps int8."""
    timings = TIMINGS + [FormatTiming("int4", 0.12, 0.40)]
    monkeypatch.setattr(formats, "time_formats", lambda config, candidates, **kw: [
        t for t in timings if t.format in candidates])
    assert "int4" in formats.candidates("cpu") and "int4" not in formats.candidates("cuda")
    assert formats.choose_format(tiny_config("qwen2"), "target").chosen == "int8"
    monkeypatch.setattr(formats, "time_formats", lambda config, candidates, **kw: [
        t if t.format != "int4" else FormatTiming("int4", 0.12, 0.14) for t in timings if t.format in candidates])
    assert formats.choose_format(tiny_config("qwen2"), "target", recalibrate=True).chosen == "int4"


def test_a_draft_is_chosen_by_its_round_its_steps_weighing_as_many_times_as_it_drafts(monkeypatch):
    """A draft steps VERIFY_ROWS - 1 times for each forward over several tokens: a format with the faster step but
    the costlier multi-token forward (one pair measured on an AVX2 CPU: int8 51.1 / 80.7 ms, int8-dynamic 63.8 /
    67.0 ms) is the draft's, while step plus that forward, a target's price, would rank it second."""
    timings = [FormatTiming("int8", 0.0511, 0.0807), FormatTiming("int8-dynamic", 0.0638, 0.0670)]
    monkeypatch.setattr(formats, "time_formats", lambda config, candidates, **kw: [
        t for t in timings if t.format in candidates])
    draft = formats.choose_format(tiny_config("qwen2"), "draft")
    assert draft.chosen == "int8" and [t.format for t in draft.ranked()] == ["int8", "int8-dynamic"]
    assert min(timings, key=lambda t: t.score_s).format == "int8-dynamic"  # the target's price ranks them the other way
    assert f"{formats.VERIFY_ROWS - 1} steps plus a {formats.VERIFY_ROWS}-token forward" in draft.reason


@pytest.mark.parametrize("family", ["qwen2", "llama"])
def test_a_shallow_view_runs_the_first_layers_of_the_deep_model_and_shares_its_weights(family):
    """The calibration times its shallower depth on a view of the deeper model (`formats.at_depth`): the same
    logits as that model with its later layers cut off, and not one weight copied."""
    deep = formats.random_model(tiny_config(family, layers=4), 4)
    view = formats.at_depth(deep, 2)
    cut = formats.random_model(tiny_config(family, layers=4), 4)
    del cut.model.layers[2:]
    cut.config.num_hidden_layers = 2
    ids = torch.tensor([[3, 1, 4, 1, 5, 9]])
    with torch.no_grad():
        assert torch.equal(view(ids).logits, cut(ids).logits)
        assert not torch.equal(view(ids).logits, deep(ids).logits)
    assert deep.config.num_hidden_layers == 4 and len(deep.model.layers) == 4  # the deep model is untouched
    assert {p.data_ptr() for p in view.parameters()} <= {p.data_ptr() for p in deep.parameters()}


@pytest.mark.parametrize("family", ["qwen2", "llama"])
@pytest.mark.parametrize("format_", ["int8", "int8-dynamic", "int4"])
def test_calibration_models_draw_their_codes_and_quantizing_afterwards_is_unchanged(format_, family):
    """A format is timed on codes drawn for each weight's shape (`quant.random_codes`) on a model whose float
    matrices were never filled: all levels used, no float matrix left, finite outputs; outside the block a weight is
    quantized from its values."""
    config = tiny_config(family, hidden=64, layers=2)
    drawn = formats.build(config, format_, 2)
    codes = [m.int8_weight() for m in drawn.modules() if isinstance(m, quant.Int8Linear)]
    codes4 = [native.unpack4(m.packed)[0] for m in drawn.modules() if isinstance(m, quant4.Int4DynamicLinear)]
    limit = quant.weight_limit()
    assert codes or codes4  # int4 on the compiled product: every layer 4-bit, the head requantized from its codes
    assert all(int(c.min()) == -limit and int(c.max()) == limit for c in codes if c.numel() > 10_000)
    assert all(int(c.min()) == 0 and int(c.max()) == quant4.CODE_MAX for c in codes4 if c.numel() > 10_000)
    assert not [name for name, p in drawn.named_parameters() if p.dim() > 1 and p.is_floating_point()]
    with torch.inference_mode():
        assert torch.isfinite(drawn(torch.tensor([[1, 2, 3]])).logits).all()
    weight = torch.randn(8, 64)
    assert torch.equal(quant.quantize_weight(weight)[0], torch.round(weight / (weight.abs().amax(1, keepdim=True)
                                                                             / limit)).to(torch.int8))


def test_a_format_that_cannot_win_keeps_its_screening_repeats(monkeypatch):
    """`_timed` times SCREEN_REPEATS repeats of each (depth, rows) and the rest only while the format scores under
    the bar (SCREEN_MARGIN times the fastest timed so far): forwards counted, warm-ups included."""
    calls = []
    real = formats.forward_seconds
    monkeypatch.setattr(formats, "forward_seconds", lambda *a: calls.append(a[-1]) or real(*a))
    model = formats.build(tiny_config("qwen2", hidden=32, layers=6), "float32", max(formats.LAYERS))
    forwards = len(formats.LAYERS) * 2  # (depth, rows) pairs timed
    warm_up = len(formats.LAYERS)
    formats._timed(model, 6, "float32", repeats=5, bar=0.0)
    assert len(calls) == warm_up + forwards * formats.SCREEN_REPEATS
    calls.clear()
    timing = formats._timed(model, 6, "float32", repeats=5)
    assert len(calls) == warm_up + forwards * 5 and timing.format == "float32"
