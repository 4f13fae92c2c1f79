"""The drafter factory and the hybrid drafter (prompt lookup first, the model otherwise)."""
import math
from dataclasses import replace

import pytest
import torch

from specdec import autoregressive_generate, speculative_generate
from specdec.drafters import (HybridDrafter, ModelDrafter, NaiveCrossVocabDrafter, PromptLookupDraft, Proposal,
                              SamplingPolicy, SelfSpeculativeDraft, TextBridgeDrafter, DraftSpec, Vocabulary, from_spec)
from specdec.models import LoadedModel
from specdec.testing import perturbed_copy, tiny_model
from test_sampling import TEMPERATURE, TOP_P, chi_square_p_value, draw_first_two, exact_law_of_two_tokens

REPEATING = [5, 6, 7, 8, 9, 5, 6, 7, 10, 11, 5, 6, 7]  # lookup finds continuations of [5, 6, 7]


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
    assert copied.source == "lookup" and copied.token_ids == [10, 11, 5] and copied.forwards == 0
    fresh = [20, 21, 22, 23]
    modelled = hybrid.propose(fresh, 3, policy)
    assert modelled.source == "model" and modelled.forwards == 3 and len(modelled.token_ids) == 3


def test_hybrid_copies_only_where_the_model_has_just_missed(pair):
    target, draft = pair
    hybrid = HybridDrafter(ModelDrafter(draft))
    policy = SamplingPolicy(0.0, 1.0, torch.Generator(), 128)
    fresh = [20, 21, 22, 23]
    drafted = hybrid.propose(fresh, 2, policy).token_ids
    passed = fresh + drafted + [5, 6, 7, 8, 5, 6, 7]  # the model's proposal passed whole; then [5, 6, 7] repeats
    assert hybrid.propose(passed, 3, policy).source == "model"  # on track: no copy, though lookup finds one
    hybrid.propose(fresh, 2, policy)
    missed = fresh + [(drafted[0] + 1) % 128] + [5, 6, 7, 8, 5, 6, 7]  # the model's first token was not the next one
    copied = hybrid.propose(missed, 3, policy)
    assert copied.source == "lookup" and copied.token_ids == [8, 5, 6]


class Scripted:
    """A model drafter's stand-in that proposes the first n tokens of its script, whatever the context."""

    model, cost_key, forwards = None, "scripted", 0

    def __init__(self, script):
        self.script = script

    def reset(self):
        pass

    def prefill(self, prompt_ids):
        return 0.0

    def propose(self, context_ids, n, policy):
        return Proposal(self.script[:n], None, 0.0, min(n, len(self.script)))


@pytest.mark.parametrize("script, expected, source, forwards", [
    ([30, 31, 32, 33], [30, 31, 40, 41], "model+lookup", 2),  # the model starts the copy: the copy takes over
    ([30, 99, 32, 33], [30, 99, 30, 99], "model", 4)])  # it does not: the model drafts on
def test_a_model_on_track_is_copied_after_only_where_it_starts_the_copy_itself(script, expected, source, forwards):
    policy = SamplingPolicy(0.0, 1.0, torch.Generator(), 128)
    hybrid = HybridDrafter(Scripted(script))
    start = [5, 6, 7, 30, 31, 40, 41, 9]
    assert hybrid.propose(start, 2, policy).source == "model"  # no earlier occurrence of [41, 9]... yet
    on_track = start + script[:2] + [50, 5, 6, 7]  # its 2 tokens passed; later [5, 6, 7] repeats the start
    proposal = hybrid.propose(on_track, 4, policy)
    assert (proposal.token_ids, proposal.source, proposal.forwards) == (expected, source, forwards)
    assert proposal.draft_distributions(128).shape == (4, 128)


def test_a_copy_that_passed_whole_goes_on_without_the_models_tokens_first_until_it_misses():
    policy = SamplingPolicy(0.0, 1.0, torch.Generator(), 128)
    hybrid = HybridDrafter(Scripted([30, 31, 32, 33]))
    start = [5, 6, 7, 30, 31, 40, 41, 9]
    hybrid.propose(start, 2, policy)  # the model's [30, 31]
    on_track = start + [30, 31, 50, 5, 6, 7]
    assert hybrid.propose(on_track, 4, policy).source == "model+lookup"  # the model starts the copy [30, 31, 40, 41]
    passed = on_track + [30, 31, 40, 41, 9]  # it passed whole; [40, 41, 9] occurred before, followed by [30, 31, ...]
    going_on = hybrid.propose(passed, 4, policy)
    assert (going_on.token_ids, going_on.source, going_on.forwards) == ([30, 31, 50, 5], "lookup", 0)
    missed = passed + [30, 99, 5, 6, 7]  # that copy missed at its second token; [5, 6, 7] repeats again
    assert hybrid.propose(missed, 4, policy).source == "model+lookup"  # the model's tokens first again
    again = HybridDrafter(Scripted([30, 31, 32, 33]))
    again.propose(start, 2, policy)
    again.propose(on_track, 4, policy)  # the model starts the copy [30, 31, 40, 41], and it passes whole ...
    later = passed + [5, 6, 7]  # ... but plain steps follow before the next copy: its run has ended
    assert again.propose(later, 4, policy).source == "model+lookup"


@pytest.mark.parametrize("noise, sources", [(0.3, {"lookup", "model"}), (0.0, {"model+lookup", "model"})])
def test_hybrid_greedy_output_is_the_target_alone(pair, noise, sources):
    """A draft that misses (copies proposed as they are) and one on track (copies it starts itself)."""
    target = pair[0]
    draft = perturbed_copy(target, noise=noise, seed=2)
    alone = autoregressive_generate(target, REPEATING, max_new_tokens=40, eos_token_id=[])
    result = speculative_generate(target, HybridDrafter(ModelDrafter(draft)), REPEATING, k=4, max_new_tokens=40,
                                  eos_token_id=[])
    assert result.token_ids == alone.token_ids
    assert {r.draft_source for r in result.rounds} >= sources


def test_k_auto_verifies_free_copies_in_rounds_it_gives_the_model_none(pair):
    """A draft that never passes sends k = "auto" to plain steps; where the output repeats, the hybrid's prompt lookup
    still proposes copies there (copy rounds: no model forward), and the output is the target alone's."""
    target = pair[0]
    useless = tiny_model("llama", seed=9)
    loop = [5, 6, 7, 8, 9, 10, 11, 12] * 3
    alone = autoregressive_generate(target, loop, max_new_tokens=40, eos_token_id=[])
    result = speculative_generate(target, HybridDrafter(ModelDrafter(useless)), loop, k="auto", max_new_tokens=40,
                                  eos_token_id=[])
    assert result.token_ids == alone.token_ids
    copies = [r for r in result.rounds if r.draft_source == "copy"]
    assert copies and all(r.draft_forwards == 0 and r.k == len(r.draft_token_ids) > 0 for r in copies)
    fixed = speculative_generate(target, HybridDrafter(ModelDrafter(useless)), loop, k=2, max_new_tokens=40,
                                 eos_token_id=[])
    assert "copy" not in {r.draft_source for r in fixed.rounds}  # a fixed k never adds copy rounds


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
    assert isinstance(from_spec("o", target, load=load, vocabulary=Vocabulary.NAIVE), NaiveCrossVocabDrafter)
    assert isinstance(from_spec("d", target, load=load, vocabulary=Vocabulary.BRIDGE), TextBridgeDrafter)
    with pytest.raises(ValueError, match="vocabulary mode"):
        from_spec("d", target, load=load, vocabulary="magic")
    with pytest.raises(ValueError, match="self:8"):
        from_spec("self:x", target, load=load)


# --- the protocol every drafter declares, and the spec grammar parsed once -----------------------------------

def every_drafter(pair):
    """One of each drafter in specdec/drafters (and the core's), with the model it wraps (None: model-free)."""
    from specdec.drafters import NoDraft, PrunedVocabularyDrafter
    from specdec.testing import tiny_tokenizer
    target, draft = pair
    tokenizer = tiny_tokenizer()
    model_drafter = ModelDrafter(draft)
    self_spec = SelfSpeculativeDraft(target, 1)
    bridge = TextBridgeDrafter(loaded(draft, tokenizer, "d"), tokenizer)
    naive = NaiveCrossVocabDrafter(draft)
    pruned = PrunedVocabularyDrafter(draft, range(64))
    return [(NoDraft(), None), (PromptLookupDraft(), None), (model_drafter, draft), (self_spec, self_spec.lm.model),
            (bridge, draft), (naive, draft), (pruned, pruned.lm.model), (HybridDrafter(model_drafter), draft),
            (HybridDrafter(PromptLookupDraft()), None)]


def test_every_drafter_declares_forwards_model_and_cost_key(pair):
    from specdec.drafters import Drafter
    drafters = every_drafter(pair)
    for drafter, model in drafters:
        assert isinstance(drafter, Drafter), type(drafter).__name__
        assert drafter.model is model and drafter.forwards == 0 and isinstance(drafter.cost_key, str)
    keys = [d.cost_key for d, _ in drafters] + [SelfSpeculativeDraft(pair[0], 2).cost_key,
                                                 PromptLookupDraft(max_ngram=4).cost_key]
    assert len(set(keys)) == len(keys)  # every kind and setting prices its own c
    hybrid = drafters[-2][0]
    hybrid.prefill([20, 21, 22])
    assert hybrid.forwards == hybrid.model_drafter.forwards > 0


def test_a_drafter_that_declares_nothing_is_refused_with_one_line(pair):
    class Bare:  # the two methods alone: its forwards would count as 0 and its model would go unpriced
        def prefill(self, prompt_ids):
            return 0.0

        def propose(self, context_ids, n, policy):
            return PromptLookupDraft().propose(context_ids, n, policy)

    with pytest.raises(ValueError, match="a causal LM or a Drafter, got Bare"):
        speculative_generate(pair[0], Bare(), REPEATING, k=2, max_new_tokens=4)


@pytest.mark.parametrize("text, spec", [
    ("lookup", DraftSpec("lookup")),
    (" self:8 ", DraftSpec("self", layers=8)),
    ("self:2+lookup", DraftSpec("self", layers=2, hybrid=True)),
    ("runs/d", DraftSpec("model", "runs/d")),
    ("aligned:x+lookup", DraftSpec("model", "aligned:x", hybrid=True)),
    ("runs/d@vocab=v.json", DraftSpec("pruned", "runs/d", vocabulary_file="v.json")),
    ("m@vocab=v.json+lookup", DraftSpec("pruned", "m", vocabulary_file="v.json", hybrid=True)),
    ("m@vocab=all", DraftSpec("model", "m", whole_vocabulary=True)),
    ("m@vocab=all+lookup", DraftSpec("model", "m", whole_vocabulary=True, hybrid=True)),
    ("lookup+lookup", DraftSpec("lookup", hybrid=True)),
])
def test_the_draft_grammar_is_parsed_once_into_a_spec(text, spec):
    assert DraftSpec.parse(text) == spec


@pytest.mark.parametrize("text, message", [
    ("", "non-empty"), ("self:x", "self:8"), ("self:0", "positive"), ("+lookup", "follows one draft"),
    ("d+lookup+lookup", "follows one draft, once"), ("lookup" + "+lookup" * 1500, "at most 4096 characters"),
    ("@vocab=v.json", "MODEL@vocab=FILE"), ("self:" + "9" * 5000, "at most 4096"),
])
def test_a_bad_draft_spec_is_one_clear_line(text, message, pair):
    with pytest.raises(ValueError, match=message) as refused:
        from_spec(text, loaded(pair[0], None, "t"), load=lambda name: pytest.fail("nothing loads"))
    assert "\n" not in str(refused.value) and len(str(refused.value)) < 200


def test_one_vocabulary_type_for_the_factory_the_loader_and_the_app(pair):
    from specdec.dashboard.hub import VOCABULARIES
    from specdec.testing import WORDS, tiny_tokenizer
    target = loaded(pair[0], tiny_tokenizer(), "t")
    other = loaded(tiny_model("llama", seed=4, vocab_size=len(WORDS) + 8), tiny_tokenizer(WORDS[::-1] + ["x"]), "o")
    built = {label: type(from_spec("o", target, load={"o": other}.__getitem__, vocabulary=label)).__name__
             for label in VOCABULARIES}  # the app's labels are the factory's values
    assert built == {"auto": "TextBridgeDrafter", "as is": "LoadedModel", "text bridge": "TextBridgeDrafter",
                     "naive ids": "NaiveCrossVocabDrafter"}
    assert [str(mode) for mode in Vocabulary] == list(VOCABULARIES)


def test_one_more_draft_token_pays_where_it_raises_the_rounds_tokens_per_second():
    """SamplingPolicy.pays, by hand: rounds of 0, 1, 2 drafts priced 1.0, 1.3, 1.6 s; after a token the draft gave
    q = 0.5, a round of one draft yields 1.5 tokens (1.154/s) and of two 1.75 (1.094/s): it does not pay; after
    q = 0.9, 1.9 (1.462/s) against 2.71 (1.694/s): it does. Nothing pays past the prices given; without prices, or
    sampling, everything does."""
    priced = SamplingPolicy(0.0, 1.0, torch.Generator(), 128, round_times=(1.0, 1.3, 1.6))
    assert not priced.pays([0.5]) and priced.pays([0.9])
    assert not priced.pays([0.9, 0.99])  # a third draft has no price: never drafted
    assert priced.after([0.9]).pays([]) is priced.pays([0.9]) is True  # a proposal in parts: the head's counted
    assert not priced.after([0.9]).pays([0.99])
    assert SamplingPolicy(0.0, 1.0, torch.Generator(), 128).pays([0.01])
    assert SamplingPolicy(0.8, 1.0, torch.Generator(), 128, round_times=(1.0, 1.3, 1.6)).pays([0.01])


def _rule_stop(confidences: list[float], round_times: tuple[float, ...]) -> int:
    """Tokens a greedy draft with these confidences drafts under `round_times` (the rule written out again)."""
    for drafted in range(1, len(confidences) + 1):
        passes = math.prod(confidences[:drafted])
        expected = 1.0 + sum(math.prod(confidences[:i]) for i in range(1, drafted + 1))
        if drafted + 1 >= len(round_times):
            return drafted
        if (expected + passes * confidences[drafted - 1]) / round_times[drafted + 1] <= expected / round_times[drafted]:
            return drafted
    return len(confidences)


def test_a_greedy_model_draft_ends_where_one_more_token_is_priced_not_to_pay(pair):
    """SamplingPolicy.round_times (k = "auto" sets it each round): greedy, the proposal ends at the first token after
    which one more is predicted to lower the round's tokens per second; the tokens drafted are the ones an unpriced
    proposal begins with. Free drafting drafts all n, dear drafting one; sampling always all n."""
    target, draft = pair
    context = [1, 5, 9, 13]
    vocab = target.get_output_embeddings().weight.shape[0]
    free, dear = (1.0,) * 8, tuple(1.0 + 100.0 * j for j in range(8))
    for round_times, temperature, expected in ((free, 0.0, 6), (dear, 0.0, 1), (dear, 0.8, 6)):
        policy = SamplingPolicy(temperature, 1.0, torch.Generator().manual_seed(0), vocab, round_times=round_times)
        proposal = ModelDrafter(draft).propose(context, 6, policy)
        assert len(proposal.token_ids) == proposal.forwards == len(proposal.p_draft) == expected
    longest = ModelDrafter(draft).propose(context, 6, SamplingPolicy(0.0, 1.0, torch.Generator(), vocab))
    confidences = longest.p_draft.max(-1).values.tolist()  # [6]: greedy takes each row's argmax
    stops = set()
    for step in (1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 0.1):  # a draft token's price (the tiny draft is far from sure)
        round_times = tuple(1.0 + step * j for j in range(8))
        policy = SamplingPolicy(0.0, 1.0, torch.Generator(), vocab, round_times=round_times)
        priced = ModelDrafter(draft).propose(context, 6, policy)
        assert len(priced.token_ids) == _rule_stop(confidences, round_times)
        assert priced.token_ids == longest.token_ids[:len(priced.token_ids)]
        stops.add(len(priced.token_ids))
    assert len(stops) > 1  # the prices, not a threshold, moved the stop


def test_the_hybrids_model_proposal_made_in_parts_is_priced_as_the_model_alone(pair):
    """Where a copy is at hand but the model's first tokens do not start it, the hybrid drafts the model's proposal in
    two parts (the head, then the rest after it); priced, it ends where the model alone's would: the head's
    confidences count in the rest's price (`SamplingPolicy.after`)."""
    target, draft = pair
    vocab = target.get_output_embeddings().weight.shape[0]
    start = [1, 5, 9, 13]
    lengths = set()
    for step in (0.0, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2):
        policy = SamplingPolicy(0.0, 1.0, torch.Generator(), vocab, round_times=tuple(1.0 + step * j for j in range(9)))
        hybrid = HybridDrafter(ModelDrafter(draft))
        first = hybrid.propose(start, 2, policy)  # nothing to copy yet: the model's, which then passes
        context = start + first.token_ids + [1, 5, 9]  # [1, 5, 9] repeats: a copy of [13, ...] is at hand
        ours = hybrid.propose(context, 6, policy)
        alone = ModelDrafter(draft).propose(context, 6, policy)
        assert ours.source == "model" and ours.token_ids[:2] != [13, *first.token_ids][:2]
        assert ours.token_ids == alone.token_ids
        lengths.add(len(ours.token_ids))
    assert max(lengths) > 2 and min(lengths) < 6  # the rest was drafted, and a price ended a proposal


def test_a_sure_greedy_model_draft_goes_on_past_n_up_to_most(pair):
    """SamplingPolicy.go_on_above: greedy, past the n asked a draft goes on while each token it drafted got more
    probability, up to `most` (k = "auto" sets both, `schedule.GO_ON_ABOVE`); never past `most`, never when
    sampling, and the tokens drafted are the ones a longer n would have drafted."""
    target, draft = pair
    context = [1, 5, 9, 13]
    vocab = target.get_output_embeddings().weight.shape[0]
    longest = ModelDrafter(draft).propose(context, 6, SamplingPolicy(0.0, 1.0, torch.Generator(), vocab))
    chosen = longest.p_draft.max(-1).values.tolist()  # [6]: the probability of each greedy token
    for go_on_above, temperature, most, expected in ((math.inf, 0.0, 6, 2), (-1.0, 0.0, 6, 6), (-1.0, 0.0, 4, 4),
                                                     (-1.0, 0.8, 6, 2), (-1.0, 0.0, 0, 2)):
        policy = SamplingPolicy(temperature, 1.0, torch.Generator().manual_seed(0), vocab, go_on_above, most)
        proposal = ModelDrafter(draft).propose(context, 2, policy)
        assert len(proposal.token_ids) == proposal.forwards == len(proposal.p_draft) == expected
    threshold = sorted(chosen[1:5])[1]  # a token past the second is drafted while the one before got more than this
    policy = SamplingPolicy(0.0, 1.0, torch.Generator(), vocab, threshold).capped(6)
    extended = ModelDrafter(draft).propose(context, 2, policy)
    assert len(extended.token_ids) == next((i for i in range(2, 6) if chosen[i - 1] <= threshold), 6)
    assert extended.token_ids == longest.token_ids[:len(extended.token_ids)]


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_a_model_draft_proposes_nothing_after_an_end_of_sequence(pair, temperature):
    """SamplingPolicy.ends (the engine sets the target's EOS ids): a token after an end is never emitted, so a model
    draft stops there (greedy or sampled, asked for n or going on when sure) and the hybrid returns that head."""
    target, draft = pair
    context = [1, 5, 9, 13]
    vocab = target.get_output_embeddings().weight.shape[0]
    policy = SamplingPolicy(temperature, 1.0, torch.Generator().manual_seed(0), vocab, -1.0, 6)
    drafted = ModelDrafter(draft).propose(context, 6, policy).token_ids
    end = drafted[2]
    cut = drafted[:drafted.index(end) + 1]  # up to its first occurrence
    ended = replace(policy, generator=torch.Generator().manual_seed(0), ends=frozenset({end}))
    proposal = ModelDrafter(draft).propose(context, 6, ended)
    assert proposal.token_ids == cut and proposal.forwards == len(cut) == len(proposal.p_draft)
    if temperature == 0:  # going on past n when sure (greedy only) stops there too
        assert ModelDrafter(draft).propose(context, 2, replace(ended, generator=torch.Generator())).token_ids == cut
    hybrid = HybridDrafter(ModelDrafter(draft))
    assert hybrid.propose(context, 6, replace(ended, generator=torch.Generator().manual_seed(0))).token_ids == cut
