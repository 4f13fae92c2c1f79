"""Real models for specdec, offline first: a catalogue, packaged GGUF weights, a converted-weights
cache, Hugging Face hub and ModelScope sources, a pair check, and a shared model pool.

    from specdec.models import load_model, load_draft
    target = load_model("qwen2.5-coder-1.5b-instruct")          # default target
    draft = load_draft("qwen2.5-coder-0.5b-instruct", target)   # default draft (same tokenizer)
"""
from specdec.drafters.pair import PairReport, check_pair
from specdec.models.cache import root as cache_root
from specdec.models.entries import CatalogueEntry, catalogue, default_name
from specdec.models.loading import LoadedModel, add_model_arguments, load_draft, load_model, resolve_dtype
from specdec.models.pool import ModelPool, default_pool
from specdec.models.speed import apply_speed_levers, transpose_head_storage

__all__ = [
    "LoadedModel", "load_model", "load_draft", "add_model_arguments", "check_pair", "PairReport",
    "catalogue", "CatalogueEntry", "default_name", "ModelPool", "default_pool", "cache_root", "resolve_dtype",
    "apply_speed_levers",
    "transpose_head_storage",
]
