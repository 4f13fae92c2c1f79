"""The drafter factory and the hybrid drafter (prompt lookup first, the model otherwise)."""
import pytest
import torch

from specdec import autoregressive_generate, speculative_generate
from specdec.drafters import (HybridDrafter, ModelDrafter, NaiveCrossVocabDrafter, PromptLookupDraft, SamplingPolicy,
                              SelfSpeculativeDraft, TextBridgeDrafter, from_spec)
from specdec.models import LoadedModel
from specdec.testing import perturbed_copy, tiny_model
from test_sampling import TEMPERATURE, TOP_P, chi_square_p_value, draw_first_two, exact_law_of_two_tokens

REPEATING = [5, 6, 7, 8, 9, 5, 6, 7, 10, 11, 5, 6]  # lookup finds continuations of [5, 6]


@pytest.fixture(scope="module")
def pair():
    target = tiny_model("llama", seed=0)
    return target, perturbed_copy(target, noise=0.3, seed=2)


def test_hybrid_proposes_from_lookup_when_it_can_and_from_the_model_otherwise(pair):
    target, draft = pair
    hybrid = HybridDrafter(ModelDrafter(draft))
    policy = SamplingPolicy(0.0, 1.0, torch.Generator(), 128)
    hybrid.prefill(REPEATING)
    copied = hybrid.propose(REPEATING, 3, policy)
    assert copied.source == "lookup" and copied.token_ids == [7, 10, 11] and copied.forwards == 0
    fresh = [20, 21, 22, 23]
    modelled = hybrid.propose(fresh, 3, policy)
    assert modelled.source == "model" and modelled.forwards == 3 and len(modelled.token_ids) == 3


def test_hybrid_greedy_output_is_the_target_alone(pair):
    target, draft = pair
    alone = autoregressive_generate(target, REPEATING, max_new_tokens=40, eos_token_id=[])
    result = speculative_generate(target, HybridDrafter(ModelDrafter(draft)), REPEATING, k=4, max_new_tokens=40,
                                  eos_token_id=[])
    assert result.token_ids == alone.token_ids
    assert {r.draft_source for r in result.rounds} >= {"lookup", "model"}


def test_hybrid_sampling_keeps_the_target_law():
    from test_sampling import PROMPT
    target = tiny_model("llama", seed=3, vocab_size=48)
    draft = perturbed_copy(target, noise=0.6, seed=5)
    first_law, second_law = exact_law_of_two_tokens(target)
    first, second = draw_first_two(lambda seed: speculative_generate(
        target, HybridDrafter(ModelDrafter(draft), PromptLookupDraft(min_ngram=1)), PROMPT, k=2, max_new_tokens=3,
        temperature=TEMPERATURE, top_p=TOP_P, seed=seed, eos_token_id=[]).token_ids)
    assert chi_square_p_value(first, first_law) > 1e-3
    assert chi_square_p_value(second, second_law) > 1e-3


def loaded(model, tokenizer, name):
    return LoadedModel(name, model, tokenizer, "test", name, "float32")


def test_the_factory_builds_every_kind_of_draft(pair):
    from specdec.testing import WORDS, tiny_tokenizer
    target_model, draft_model = pair
    tokenizer = tiny_tokenizer()
    target, draft = loaded(target_model, tokenizer, "t"), loaded(draft_model, tokenizer, "d")
    other = loaded(tiny_model("llama", seed=4, vocab_size=len(WORDS) + 8), tiny_tokenizer(WORDS[::-1] + ["x"]), "o")
    models = {"d": draft, "o": other}
    load = models.__getitem__
    assert isinstance(from_spec("lookup", target, load=load), PromptLookupDraft)
    assert isinstance(from_spec("self:1", target, load=load), SelfSpeculativeDraft)
    assert from_spec("d", target, load=load) is draft
    hybrid = from_spec("d+lookup", target, load=load)
    assert isinstance(hybrid, HybridDrafter) and isinstance(hybrid.model_drafter, ModelDrafter)
    assert isinstance(from_spec("o", target, load=load), TextBridgeDrafter)  # other tokenizer: auto bridge
    assert from_spec("o", target, load=load, vocabulary="as is") is other
    assert isinstance(from_spec("o", target, load=load, vocabulary="naive"), NaiveCrossVocabDrafter)
    assert isinstance(from_spec("d", target, load=load, vocabulary="bridge"), TextBridgeDrafter)
    with pytest.raises(ValueError, match="vocabulary mode"):
        from_spec("d", target, load=load, vocabulary="magic")
    with pytest.raises(ValueError, match="self:8"):
        from_spec("self:x", target, load=load)
