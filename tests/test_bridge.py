"""Drafts with another tokenizer: the text bridge is lossless and the naive mode runs (and fails)."""
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from specdec import autoregressive_generate, speculative_generate
from specdec.drafters import NaiveCrossVocabDrafter, TextBridgeDrafter
from specdec.testing import tiny_bpe_tokenizer, tiny_model

PROMPT = "def price(option, curve):\n    return"


def word_tokenizer(words: int = 60) -> PreTrainedTokenizerFast:
    """Whole words split on spaces: decode then encode gives back the same ids (no merge ambiguity)."""
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2} | {f"w{i}": i + 3 for i in range(words)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", bos_token="<s>", eos_token="</s>")


@pytest.fixture(scope="module")
def pair():
    target_tok, draft_tok = tiny_bpe_tokenizer("bytelevel", 400), tiny_bpe_tokenizer("metaspace", 300)
    target = tiny_model("llama", seed=0, vocab_size=len(target_tok))
    draft = tiny_model("qwen2", seed=1, vocab_size=len(draft_tok))
    return target, target_tok, draft, draft_tok


@pytest.mark.parametrize("k", [1, 4])
def test_bridge_greedy_output_is_the_target_alone(pair, k):
    target, target_tok, draft, draft_tok = pair
    alone = autoregressive_generate(target, PROMPT, max_new_tokens=30, tokenizer=target_tok, eos_token_id=[])
    bridged = speculative_generate(target, TextBridgeDrafter(draft, target_tok, draft_tok), PROMPT, k=k,
                                   max_new_tokens=30, tokenizer=target_tok, eos_token_id=[])
    assert bridged.token_ids == alone.token_ids
    assert bridged.stats.draft_tokens > 0 and bridged.stats.draft_forwards > 0


def test_bridge_over_the_targets_own_model_accepts_every_token():
    tokenizer = word_tokenizer()
    target = tiny_model("llama", seed=3, vocab_size=len(tokenizer))
    prompt = "w1 w7 w3 w9"
    alone = autoregressive_generate(target, prompt, max_new_tokens=24, tokenizer=tokenizer, eos_token_id=[])
    bridged = speculative_generate(target, TextBridgeDrafter(target, tokenizer, tokenizer), prompt, k=4,
                                   max_new_tokens=24, tokenizer=tokenizer, eos_token_id=[])
    assert bridged.token_ids == alone.token_ids
    assert bridged.stats.acceptance_rate == 1.0
    assert bridged.stats.mean_accepted_length == pytest.approx(5.0, abs=0.6)  # k + 1 but for the last round


def test_bridge_needs_both_tokenizers(pair):
    target, target_tok, draft, _ = pair
    with pytest.raises(ValueError, match="both tokenizers"):
        TextBridgeDrafter(draft, target_tok)


def test_naive_mode_runs_lossless_and_wraps_ids(pair):
    target, target_tok, draft, draft_tok = pair
    naive = NaiveCrossVocabDrafter(draft)
    assert naive._wrap([5, len(draft_tok) + 5]) == [5, 5]
    alone = autoregressive_generate(target, PROMPT, max_new_tokens=20, tokenizer=target_tok, eos_token_id=[])
    result = speculative_generate(target, naive, PROMPT, k=3, max_new_tokens=20, tokenizer=target_tok,
                                  eos_token_id=[])
    assert result.token_ids == alone.token_ids
    assert all(t < len(draft_tok) for r in result.rounds for t in r.draft_token_ids)
