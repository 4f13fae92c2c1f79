"""Prompt lookup drafter: the right continuation on hand-made contexts, greedy identity with no-match rounds."""
import pytest
import torch

from specdec import autoregressive_generate, speculative_generate
from specdec.drafters import SamplingPolicy
from specdec.drafters.lookup import PromptLookupDraft, find_continuation
from specdec.testing import tiny_model

GREEDY = SamplingPolicy(0.0, 1.0, torch.Generator(), vocab_size=128)


@pytest.mark.parametrize("context, n, max_ngram, min_ngram, expected", [
    ([1, 2, 3, 9, 8, 1, 2, 3], 2, 3, 1, [9, 8]),  # 3-gram match, continuation cut at n
    ([1, 2, 3, 9, 8, 1, 2, 3], 9, 3, 1, [9, 8, 1, 2, 3]),  # continuation cut at the end of the context
    ([1, 2, 5, 1, 2, 6, 1, 2], 1, 3, 1, [6]),  # the LATEST earlier occurrence of [1, 2]
    ([7, 1, 2, 5, 3, 2, 6, 7, 1, 2], 2, 3, 1, [5, 3]),  # the longest suffix wins over a later shorter one
    ([7, 1, 2, 5, 3, 2, 6, 7, 1, 2], 2, 1, 1, [6, 7]),  # max_ngram=1: only the last token is looked up
    ([4, 5, 6, 5], 3, 3, 1, [6, 5]),  # unigram match
    ([4, 5, 6, 5], 3, 3, 2, []),  # min_ngram=2 refuses the unigram match
    ([3, 3, 3], 4, 3, 1, [3]),  # overlapping occurrence: the suffix [3, 3] occurs at 0, followed by one token
    ([1, 2, 3, 4], 4, 3, 1, []),  # no repeat at all
    ([5], 4, 3, 1, []),  # one token: nothing earlier to match
])
def test_find_continuation_on_hand_made_contexts(context, n, max_ngram, min_ngram, expected):
    assert find_continuation(context, n, max_ngram, min_ngram) == expected


def test_drafter_defaults_and_point_mass_proposal():
    draft = PromptLookupDraft()
    assert (draft.max_ngram, draft.min_ngram, draft.forwards) == (3, 1, 0)
    assert draft.prefill([1, 2, 3]) == 0.0
    proposal = draft.propose([1, 2, 3, 9, 8, 1, 2, 3], 2, GREEDY)
    assert proposal.token_ids == [9, 8] and proposal.p_draft is None and proposal.forwards == 0
    assert draft.propose([1, 2, 3, 4], 4, GREEDY).token_ids == []


@pytest.mark.parametrize("kwargs", [dict(max_ngram=0), dict(min_ngram=0), dict(max_ngram=2, min_ngram=3),
                                    dict(max_ngram=2.5)])
def test_bad_ngram_sizes_are_refused(kwargs):
    with pytest.raises(ValueError, match="min_ngram"):
        PromptLookupDraft(**kwargs)


REPEATING = [5, 6, 7, 8, 9, 10, 5, 6, 7, 8, 11, 12, 5, 6]  # suffix [5, 6] occurred twice before
PLAIN = [3, 4, 9, 11, 12, 13, 14]  # no repeat: the first round has nothing to look up


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("prompt", [REPEATING, PLAIN], ids=["repeats", "no-repeats"])
def test_greedy_identity_with_the_target_alone(arch, prompt):
    model = tiny_model(arch, seed=3, layers=2)
    alone = autoregressive_generate(model, prompt, max_new_tokens=17, eos_token_id=[])
    reference = model.generate(torch.tensor([prompt]), max_new_tokens=17, min_new_tokens=17, do_sample=False,
                               pad_token_id=0)[0, len(prompt):].tolist()
    assert alone.token_ids == reference
    for k in (1, 3, 4):  # 17 new tokens is a multiple of none of k + 1
        spec = speculative_generate(model, PromptLookupDraft(), prompt, k=k, max_new_tokens=17, eos_token_id=[])
        assert spec.token_ids == reference, f"k={k}"
        assert any(not r.draft_token_ids for r in spec.rounds)  # no-match rounds happened (one target step each)
        assert all(r.draft_forwards == 0 for r in spec.rounds)


def test_a_copy_ends_at_an_end_of_sequence():
    """A copy past the target's end is never emitted: the proposal stops on it (SamplingPolicy.ends)."""
    ended = SamplingPolicy(0.0, 1.0, torch.Generator(), vocab_size=128, ends=frozenset({8}))
    assert PromptLookupDraft().propose(REPEATING, 4, GREEDY).token_ids == [7, 8, 11, 12]
    assert PromptLookupDraft().propose(REPEATING, 4, ended).token_ids == [7, 8]


def test_repeating_prompt_gets_drafts_and_no_match_round_emits_one_token():
    model = tiny_model("llama", seed=3, layers=2)
    spec = speculative_generate(model, PromptLookupDraft(), REPEATING, k=3, max_new_tokens=17, eos_token_id=[])
    first = spec.rounds[0]
    assert first.draft_token_ids == [7, 8, 11]  # the continuation of the latest earlier [5, 6]
    assert all(len(r.emitted_token_ids) == 1 for r in spec.rounds if not r.draft_token_ids)
