"""Drafts with another tokenizer: how far two tokenizers are apart (`report`), and how to make a draft
speak the target's (`transplant`, then `specdec.distill`)."""
from .report import (DEFAULT_TEXTS, BoundaryExample, TokenizerReport, compare_words, decode_text, format_report,
                     shared_token_map, special_tokens, token_texts, tokenizer_report)
from .transplant import (TransplantSummary, bits_per_character, piece_sources, rows_by_index, rows_from_sources,
                         save_aligned, transplant_vocabulary)

__all__ = ["DEFAULT_TEXTS", "BoundaryExample", "TokenizerReport", "TransplantSummary", "bits_per_character",
           "compare_words", "decode_text", "format_report", "piece_sources", "rows_by_index", "rows_from_sources",
           "save_aligned", "shared_token_map", "special_tokens", "token_texts", "tokenizer_report",
           "transplant_vocabulary"]
