"""Tokenizer report and vocabulary transplant on tiny models and tokenizers built in code."""
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from specdec import autoregressive_generate, speculative_generate
from specdec.drafters.tokenizers import compare_words, format_report, shared_token_map, token_texts, tokenizer_report
from specdec.testing import TINY_CORPUS, tiny_bpe_tokenizer, tiny_model
from specdec.training.align import bits_per_character, piece_sources, save_aligned, transplant_vocabulary


@pytest.fixture(scope="module")
def tokenizers():
    return tiny_bpe_tokenizer("bytelevel", 400), tiny_bpe_tokenizer("metaspace", 300)


def test_report_of_a_tokenizer_with_itself(tokenizers):
    target_tok, _ = tokenizers
    report = tokenizer_report(target_tok, target_tok)
    assert report.identical and report.overlap == 1.0 and report.shared_same_id == len(target_tok)
    assert report.boundary_mismatch_rate == 0.0 and report.worst_examples == []


def test_report_of_two_families(tokenizers):
    target_tok, draft_tok = tokenizers
    model = tiny_model("llama", vocab_size=512)
    report = tokenizer_report(target_tok, draft_tok, target_model=model)
    assert not report.identical
    assert 0 < report.shared_tokens < len(target_tok)
    assert 0 < report.boundary_mismatch_rate < 1 and report.target_tokens_checked > 100
    assert report.target_specials["eos"] == ["</s>", 2] and "<unk>" in report.draft_specials
    assert report.target_embedding_rows == 512 and report.target_padding_rows == 512 - len(target_tok)
    worst = report.worst_examples[0]
    assert worst.unmatched >= 1 and worst.target_pieces != worst.draft_pieces
    assert "boundary mismatch" in format_report(report)


def test_boundary_words_show_both_cuts():
    words = compare_words("QuantLib x", target_spans=[(0, 8), (9, 10)], draft_spans=[(0, 5), (5, 8), (9, 10)])
    assert (words[0].text, words[0].target_pieces, words[0].draft_pieces, words[0].unmatched) == \
        ("QuantLib", ["QuantLib"], ["Quant", "Lib"], 1)
    assert words[1].unmatched == 0


def test_spaces_match_across_families(tokenizers):
    """Byte-level 'Ġx' and SentencePiece '▁x' are the same token: decoded text ' x' in both."""
    target_tok, draft_tok = tokenizers
    shared = shared_token_map(target_tok, draft_tok)
    target_strings, draft_strings = target_tok.convert_ids_to_tokens, draft_tok.convert_ids_to_tokens
    across = [(t, d) for t, d in shared.items() if target_strings(t).startswith("Ġ") and draft_strings(d).startswith("▁")]
    assert across, "no Ġ/▁ pair matched"
    texts_t, texts_d = token_texts(target_tok), token_texts(draft_tok)
    assert all(texts_t[t] == texts_d[d] and texts_t[t].startswith(" ") for t, d in across)


@pytest.fixture(scope="module")
def transplanted(tokenizers):
    target_tok, draft_tok = tokenizers
    draft = tiny_model("llama", seed=4, vocab_size=len(draft_tok))
    old_embedding = draft.get_input_embeddings().weight.detach().clone()
    old_head = draft.get_output_embeddings().weight.detach().clone()
    summary = transplant_vocabulary(draft, draft_tok, target_tok)
    return draft, old_embedding, old_head, summary


def test_shared_tokens_keep_their_exact_rows(tokenizers, transplanted):
    target_tok, draft_tok = tokenizers
    draft, old_embedding, old_head, summary = transplanted
    shared = shared_token_map(target_tok, draft_tok)
    rows = torch.tensor(list(shared)), torch.tensor(list(shared.values()))
    assert torch.equal(draft.get_input_embeddings().weight[rows[0]], old_embedding[rows[1]])
    assert torch.equal(draft.get_output_embeddings().weight[rows[0]], old_head[rows[1]])
    assert summary.copied >= len(shared) and summary.rows == len(target_tok) == draft.config.vocab_size


def test_new_tokens_are_the_mean_of_their_pieces(tokenizers, transplanted):
    target_tok, draft_tok = tokenizers
    draft, old_embedding, _, summary = transplanted
    sources, kinds = piece_sources(draft_tok, target_tok, len(target_tok))
    new_rows = [row for row, kind in enumerate(kinds) if kind == "from_pieces"]
    assert summary.from_pieces == len(new_rows) > 10
    for row in new_rows[:20]:
        text = target_tok.decode([row])
        pieces = draft_tok(text, add_special_tokens=False)["input_ids"]
        assert len(pieces) > 1 or draft_tok.convert_ids_to_tokens(pieces[0]) != target_tok.convert_ids_to_tokens(row)
        expected = old_embedding[pieces].mean(0)
        assert torch.allclose(draft.get_input_embeddings().weight[row], expected, atol=1e-6)


def test_index_and_string_methods_differ_when_orders_differ():
    target_tok = tiny_bpe_tokenizer("bytelevel", 400)
    draft_tok = tiny_bpe_tokenizer("bytelevel", 360, corpus=TINY_CORPUS[2:])  # same family, other merges
    shared = shared_token_map(target_tok, draft_tok)
    moved = sorted((t, d) for t, d in shared.items() if t != d and t < len(draft_tok))  # index copies row t
    assert moved
    results = {}
    for method in ("string", "index"):
        draft = tiny_model("llama", seed=4, vocab_size=len(draft_tok))
        old = draft.get_input_embeddings().weight.detach().clone()
        summary = transplant_vocabulary(draft, draft_tok, target_tok, method=method, rows=420)
        results[method] = draft.get_input_embeddings().weight.detach()
    t, d = moved[0]
    assert torch.equal(results["string"][t], old[d]) and torch.equal(results["index"][t], old[t])
    assert not torch.equal(results["string"][t], results["index"][t])
    assert summary.copied == len(draft_tok) and summary.initialised == 420 - len(draft_tok)
    assert results["index"][len(draft_tok):].std() < 0.1  # small Gaussian noise past the draft's rows


def test_tied_embeddings_stay_tied_and_the_saved_draft_runs(tmp_path, tokenizers):
    target_tok, draft_tok = tokenizers
    target = tiny_model("llama", seed=0, vocab_size=len(target_tok))
    draft = tiny_model("gpt2", seed=2, vocab_size=len(draft_tok))
    assert draft.get_output_embeddings().weight is draft.get_input_embeddings().weight
    summary = transplant_vocabulary(draft, draft_tok, target_tok)
    assert summary.tied and draft.get_output_embeddings().weight is draft.get_input_embeddings().weight
    save_aligned(draft, target_tok, tmp_path, summary)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, use_safetensors=True).eval()
    loaded_tok = AutoTokenizer.from_pretrained(tmp_path)
    assert loaded_tok.get_vocab() == target_tok.get_vocab()
    assert loaded.get_output_embeddings().weight is loaded.get_input_embeddings().weight
    assert torch.equal(loaded.get_input_embeddings().weight, draft.get_input_embeddings().weight)
    assert loaded.config.vocab_size == len(target_tok) and loaded.config.eos_token_id == target_tok.eos_token_id
    prompt = "def price(option, curve):"
    alone = autoregressive_generate(target, prompt, max_new_tokens=12, tokenizer=target_tok, eos_token_id=[])
    result = speculative_generate(target, loaded, prompt, k=3, max_new_tokens=12, tokenizer=loaded_tok,
                                  eos_token_id=[])
    assert result.token_ids == alone.token_ids and result.stats.draft_tokens > 0


def test_string_transplant_onto_its_own_tokenizer_changes_nothing(tokenizers):
    target_tok, _ = tokenizers
    model = tiny_model("llama", seed=6, vocab_size=len(target_tok))
    before = bits_per_character(model, target_tok, TINY_CORPUS)
    summary = transplant_vocabulary(model, target_tok, target_tok)
    assert summary.copied == len(target_tok)
    assert bits_per_character(model, target_tok, TINY_CORPUS) == pytest.approx(before, rel=1e-6)


def test_bad_method_and_rows(tokenizers):
    target_tok, draft_tok = tokenizers
    draft = tiny_model("llama", vocab_size=len(draft_tok))
    with pytest.raises(ValueError, match="method must be"):
        transplant_vocabulary(draft, draft_tok, target_tok, method="magic")
    with pytest.raises(ValueError, match="smaller than the target tokenizer"):
        transplant_vocabulary(draft, draft_tok, target_tok, rows=10)
