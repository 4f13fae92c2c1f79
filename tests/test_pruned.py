"""The pruned-vocabulary drafter: proposals stay in the set, greedy output and the sampling law stay the target's."""
import copy
import gc
import json

import pytest
import torch

from specdec import autoregressive_generate, speculative_generate
from specdec.drafters import ModelDrafter, PrunedVocabularyDrafter, SamplingPolicy, from_spec
from specdec.drafters import DraftSpec, Vocabulary
from specdec.drafters.pruned import _PRUNED, load_vocabulary
from specdec.models import LoadedModel, entries, formats, native, quant
from specdec.models.loading import load_draft, shipped_vocabulary
from specdec.testing import perturbed_copy, tiny_model
from specdec.training.prune import CORE, build_vocabulary, frequent_vocabulary, save_vocabulary
from test_sampling import TEMPERATURE, TOP_P, chi_square_p_value, draw_first_two, exact_law_of_two_tokens

PROMPT = [1, 7, 3, 19]
KEPT = list(range(0, 128, 2))  # every even id: half the vocabulary


@pytest.fixture(scope="module")
def pair():
    target = tiny_model("llama", seed=0)
    return target, perturbed_copy(target, noise=0.3, seed=2)


def test_a_token_outside_the_set_is_never_proposed(pair):
    target, draft = pair
    drafter = PrunedVocabularyDrafter(draft, KEPT)
    policy = SamplingPolicy(1.0, 1.0, torch.Generator().manual_seed(0), 128)
    drafter.prefill(PROMPT)
    for _ in range(20):
        proposal = drafter.propose(PROMPT, 4, policy)
        assert all(t % 2 == 0 for t in proposal.token_ids)
        odd = proposal.p_draft[:, 1::2]  # [4, 64] mass outside the set
        assert odd.abs().sum() == 0 and torch.allclose(proposal.p_draft.sum(-1), torch.ones(4))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_set_distribution_is_the_draft_renormalised(pair, temperature):
    """p_draft over the set = the full head's softmax restricted to the set and renormalised: chosen over the set's
    own logits (greedy) or over the target's vocabulary (sampling), spread over the target's vocabulary either way."""
    _, draft = pair
    policy = SamplingPolicy(temperature, 1.0, torch.Generator().manual_seed(0), 128)
    full = ModelDrafter(draft)
    full.prefill(PROMPT)
    pruned = PrunedVocabularyDrafter(draft, KEPT)
    pruned.prefill(PROMPT)
    p_full = full.propose(PROMPT, 1, policy).p_draft[0]  # [V]
    p_pruned = pruned.propose(PROMPT, 1, policy).p_draft[0]
    restricted = torch.zeros_like(p_full)
    restricted[KEPT] = p_full[KEPT] / p_full[KEPT].sum()
    assert torch.allclose(p_pruned, restricted, atol=1e-5)
    if temperature == 0.0:
        assert pruned.propose(PROMPT, 1, policy).token_ids == [int(restricted.argmax())]


def test_only_the_sets_rows_of_the_head_are_computed_and_the_model_is_untouched(pair):
    _, draft = pair
    head = draft.get_output_embeddings().weight.clone()
    drafter = PrunedVocabularyDrafter(draft, KEPT)
    assert drafter.lm.model.get_output_embeddings().weight.shape == (len(KEPT), head.shape[1])
    assert draft.get_output_embeddings().weight.equal(head)  # the wrapped model keeps its full head
    assert draft(torch.tensor([PROMPT])).logits.shape[-1] == 128


@pytest.mark.parametrize("kept", [KEPT, list(range(128))])
def test_greedy_output_is_the_target_alone(pair, kept):
    target, draft = pair
    alone = autoregressive_generate(target, PROMPT, max_new_tokens=40, eos_token_id=[])
    result = speculative_generate(target, PrunedVocabularyDrafter(draft, kept), PROMPT, k=4, max_new_tokens=40,
                                  eos_token_id=[])
    assert result.token_ids == alone.token_ids
    assert result.stats.accepted_tokens > 0


def test_sampling_keeps_the_target_law():
    """Drafts never propose odd ids, yet the output has the target's law (odd ids come from the residual)."""
    target = tiny_model("llama", seed=3, vocab_size=48)
    draft = perturbed_copy(target, noise=0.6, seed=5)
    first_law, second_law = exact_law_of_two_tokens(target)
    first, second = draw_first_two(lambda seed: speculative_generate(
        target, PrunedVocabularyDrafter(draft, range(0, 48, 2)), [1, 7, 3, 19], k=2, max_new_tokens=3,
        temperature=TEMPERATURE, top_p=TOP_P, seed=seed, eos_token_id=[]).token_ids)
    assert chi_square_p_value(first, first_law) > 1e-3
    assert chi_square_p_value(second, second_law) > 1e-3


def test_build_save_and_load_the_set(tmp_path):
    ids = build_vocabulary([[5, 6, 7], [7, 8]], [[9, 9, 9, 10, 10, 11]], most_frequent=2, always=[2])
    assert ids == [2, 5, 6, 7, 8, 9, 10]
    path = save_vocabulary(tmp_path / "vocabulary.json", ids, domain="finance")
    assert load_vocabulary(path) == ids and json.loads(path.read_text())["domain"] == "finance"
    (tmp_path / "bad.json").write_text("[1, 2,")
    with pytest.raises(ValueError, match="bad.json: not a JSON draft vocabulary"):
        load_vocabulary(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="no draft vocabulary file"):
        load_vocabulary(tmp_path / "missing.json")


def test_the_factory_reads_model_at_vocab_file(pair, tmp_path):
    target, draft = pair
    loaded_target = LoadedModel("target", target, None, "test", "target", "float32")
    path = save_vocabulary(tmp_path / "vocabulary.json", KEPT)
    drafter = from_spec(f"draft@vocab={path}", loaded_target,
                        load=lambda name: LoadedModel(name, draft, None, "test", name, "float32"))
    assert isinstance(drafter, PrunedVocabularyDrafter) and drafter.token_ids.tolist() == KEPT
    with pytest.raises(ValueError, match="MODEL@vocab=FILE"):
        from_spec("@vocab=x.json", loaded_target, load=lambda name: None)
    with pytest.raises(ValueError, match="outside|ids in 0..127"):
        PrunedVocabularyDrafter(draft, [0, 500])


@pytest.mark.parametrize("form", ["int8", "int8-dynamic", "int4-dynamic"])
def test_a_quantized_draft_drafts_over_its_own_rows_of_the_set(pair, form):
    """The head's rows of the set, in the draft's form: the set's logits are the full head's, bit for bit (the
    row-invariant int8 head, the 4-bit head whose rows never meet) or within the coupled kernel's rounding (one
    activation scale), and greedy output stays the target's."""
    if form == "int4-dynamic" and native.library() is None:
        pytest.skip("the compiled product is not built here")
    target, draft = pair
    quantized = formats.to_format(copy.deepcopy(draft), "int4-dynamic") if form == "int4-dynamic" \
        else quant.quantize_int8(copy.deepcopy(draft))
    if form == "int8-dynamic":
        quant.couple_rows(quantized)
    full, pruned = ModelDrafter(quantized), PrunedVocabularyDrafter(quantized, KEPT)
    head = pruned.lm.model.get_output_embeddings()
    assert head.out_features == len(KEPT) and (getattr(head, "coupled", None) is not None) == (form == "int8-dynamic")
    assert quantized.get_output_embeddings().out_features == 128  # the wrapped model keeps its full head
    full_logits, _ = full.lm.forward(PROMPT)
    pruned_logits, _ = pruned.lm.forward(PROMPT)
    assert pruned.lm.plan is not None  # the sliced model still runs the quantized model's own forward
    if form != "int8-dynamic":
        assert pruned_logits[-1].equal(full_logits[-1, KEPT])
    else:
        assert torch.allclose(pruned_logits[-1], full_logits[-1, KEPT], atol=1e-3)
    alone = autoregressive_generate(target, PROMPT, max_new_tokens=40, eos_token_id=[])
    result = speculative_generate(target, pruned, PROMPT, k=4, max_new_tokens=40, eos_token_id=[])
    assert result.token_ids == alone.token_ids and result.stats.accepted_tokens > 0


def test_a_set_is_sliced_once_per_model_and_let_go_with_it():
    draft = tiny_model("llama", seed=4)
    first, second, other = (PrunedVocabularyDrafter(draft, ids) for ids in (KEPT, KEPT, range(64)))
    assert first.model is second.model and other.model is not first.model  # two requests, one slice
    assert len(_PRUNED[draft]) == 2
    held = len(_PRUNED)
    del first, second, other, draft
    gc.collect()
    assert len(_PRUNED) == held - 1


class CharacterTokenizer:
    """Token i is one character: the ASCII ones, then Chinese, Cyrillic and a piece of a character (U+FFFD)."""

    pieces = [chr(c) for c in range(32, 127)] + ["的", "学", "生", "я", "д", "\ufffd"]
    all_special_ids = [2]

    def __len__(self):
        return len(self.pieces)

    def decode(self, ids):
        return "".join(self.pieces[i] for i in ids)


def test_a_frequent_set_keeps_the_texts_tokens_the_first_ids_the_texts_scripts_and_the_specials():
    tokenizer = CharacterTokenizer()
    chinese, cyrillic, piece = (tokenizer.pieces.index(c) for c in ("的", "я", "\ufffd"))
    text = [tokenizer.pieces.index(c) for c in "xyz"] + [chinese]
    kept = frequent_vocabulary(tokenizer, [text], core=10)
    assert set(kept) == {*range(10), *text, 2, chinese, chinese + 1, chinese + 2}  # every Chinese token, none else
    assert cyrillic not in kept and piece not in kept and kept == sorted(kept)
    assert frequent_vocabulary(tokenizer, [[cyrillic]], core=0) == [2, cyrillic, cyrillic + 1]


def test_the_shipped_set_was_made_by_the_vocabulary_command_and_fits_the_family():
    path = entries.draft_vocabulary(entries.default_name("draft"), entries.default_name("target"))
    about = json.loads(path.read_text())
    ids = load_vocabulary(path)
    assert about["command"].startswith("python -m specdec vocabulary") and about["core"] == CORE
    assert ids == sorted(set(ids)) and 0 <= ids[0] and ids[-1] < about["vocabulary_size"]
    assert set(range(CORE)) <= set(ids) and len(ids) < about["vocabulary_size"] / 2


def test_a_catalogue_draft_drafts_over_its_familys_shipped_set_unless_told_otherwise():
    target = LoadedModel(entries.default_name("target"), None, None, "test", "target", "int4")
    draft = entries.default_name("draft")
    shipped = entries.draft_vocabulary(draft, target.name)
    for text in (draft, f"{draft}+lookup"):
        spec = shipped_vocabulary(DraftSpec.parse(text), target)
        assert spec == DraftSpec("pruned", draft, vocabulary_file=str(shipped), hybrid=text.endswith("+lookup"))
    for text, bridge in [(f"{draft}@vocab=all", "auto"), (draft, "text bridge"), ("smollm2-135m-instruct", "auto"),
                         ("runs/my-draft", "auto"), ("lookup", "auto"), (f"{draft}@vocab=v.json", "auto")]:
        spec = DraftSpec.parse(text)
        assert shipped_vocabulary(spec, target, Vocabulary.of(bridge)) == spec, text
    custom_target = LoadedModel("runs/my-target", None, None, "test", "runs/my-target", "float32")
    assert shipped_vocabulary(DraftSpec.parse(draft), custom_target) == DraftSpec.parse(draft)


def test_distillation_loads_the_catalogue_draft_itself(pair):
    """`shipped_set=False` (what `distill` asks for): the model, which training changes, not a drafter over it."""
    target, draft = pair
    loaded_target = LoadedModel(entries.default_name("target"), target, None, "test", "target", "float32")
    name = entries.default_name("draft")
    loaded = load_draft(name, loaded_target, bridge=Vocabulary.AS_IS, shipped_set=False,
                        load=lambda spec, **options: LoadedModel(spec, draft, None, "test", spec, "float32"))
    assert isinstance(loaded, LoadedModel) and loaded.name == name
