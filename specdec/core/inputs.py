"""Checking what a caller passes in; every refusal is a ValueError that says what to do."""
from __future__ import annotations

import json

import torch

PADDING_TOLERANCE = 0.01  # vocab sizes within 1% are the same tokenizer with padded rows (Qwen: 151936 vs 152064)


def unwrap(model_or_loaded, tokenizer):
    """Accept a model or anything with `.model` and `.tokenizer` (a `LoadedModel`); return (model, tokenizer)."""
    if not isinstance(model_or_loaded, torch.nn.Module) and hasattr(model_or_loaded, "model"):
        return model_or_loaded.model, tokenizer or getattr(model_or_loaded, "tokenizer", None)
    return model_or_loaded, tokenizer


def vocab_size(model) -> int:
    """Rows of the LM head = width of the logits."""
    return model.get_output_embeddings().weight.shape[0]


def context_length(model) -> int | None:
    config = model.config
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        value = getattr(config, name, None) or getattr(getattr(config, "text_config", None), name, None)
        if value:
            return int(value)
    return None


def check_vocabularies(target_model, draft_model) -> None:
    """Refuse a draft whose vocabulary cannot be the target's (ids would mean different tokens)."""
    v_target, v_draft = vocab_size(target_model), vocab_size(draft_model)
    if abs(v_target - v_draft) > PADDING_TOLERANCE * max(v_target, v_draft):
        raise ValueError(
            f"vocabulary mismatch: the target has {v_target} token ids, the draft {v_draft}. "
            "Token ids would mean different tokens. Use a draft with the target's tokenizer, hard-clone it "
            "(`python -m specdec align`), or run it through the text bridge (specdec.drafters.TextBridgeDrafter).")


def prepare_prompt(input_ids, model, tokenizer, max_new_tokens: int, k: int) -> list[int]:
    """Validate the prompt and lengths; return the prompt as list[int]."""
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
    prompt = _as_id_list(input_ids, tokenizer)
    if not prompt:
        raise ValueError("empty prompt: give at least one token (or a non-empty string)")
    limit = vocab_size(model)
    bad = [t for t in prompt if not 0 <= t < limit]
    if bad:
        raise ValueError(f"prompt token ids {bad[:5]} are outside the target's vocabulary (0..{limit - 1})")
    context = context_length(model)
    if context is not None and len(prompt) + max_new_tokens + k > context:
        raise ValueError(
            f"prompt of {len(prompt)} tokens + max_new_tokens={max_new_tokens} (+ k={k} draft slots) exceeds the "
            f"target's context of {context} tokens: shorten the prompt or lower max_new_tokens")
    return prompt


def _as_id_list(input_ids, tokenizer) -> list[int]:
    if isinstance(input_ids, str):
        if tokenizer is None:
            raise ValueError("a string prompt needs a tokenizer: pass tokenizer=... or token ids")
        return tokenizer(input_ids)["input_ids"]
    if isinstance(input_ids, torch.Tensor):
        if input_ids.dim() == 2:
            if input_ids.shape[0] != 1:
                raise ValueError(
                    f"batch size {input_ids.shape[0]}: specdec decodes one sequence at a time; "
                    "pass input_ids[i:i+1] for each row")
            input_ids = input_ids[0]
        if input_ids.dim() != 1:
            raise ValueError(f"input_ids must be [1, T] or [T], got shape {tuple(input_ids.shape)}")
        return [int(t) for t in input_ids.tolist()]
    ids = list(input_ids)
    if ids and isinstance(ids[0], (list, tuple)):
        raise ValueError(f"batch of {len(ids)} prompts: specdec decodes one sequence at a time")
    return [int(t) for t in ids]


def resolve_eos(model, eos_token_id) -> set[int]:
    """eos_token_id=None means the target's generation_config EOS (int or list), if any."""
    if eos_token_id is None:
        config = getattr(model, "generation_config", None)
        eos_token_id = getattr(config, "eos_token_id", None)
    if eos_token_id is None:
        return set()
    return {eos_token_id} if isinstance(eos_token_id, int) else set(eos_token_id)


def parse_json(text: str):
    """`json.loads`, with nesting too deep for the parser as a JSONDecodeError (it raises RecursionError)."""
    try:
        return json.loads(text)
    except RecursionError:
        raise json.JSONDecodeError("nested too deeply", text[:100], 0) from None
