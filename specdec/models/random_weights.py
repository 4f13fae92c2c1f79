"""A catalogue model's architecture with random weights: profiled where none of its files are.

A forward's time depends on the shapes (layers, widths, heads, vocabulary) and the format, not on the values of
the weights, so v(n) and c can be measured on a machine that has no model files
(`python -m specdec profile --random-weights`). Each shipped config, `assets/configs/<name>.json`, is the
config transformers reads from that entry's GGUF (what its converted folder's config.json holds), so the model
built here (`specdec.models.formats.build`, at the model's full depth) has the shapes `load_model` gives. The
model lives in memory only: nothing is written to the model cache, and it has no tokenizer (its tokens mean
nothing).
"""
from __future__ import annotations

from pathlib import Path

from transformers import AutoConfig

from specdec.core.timing import Timer
from specdec.models import entries, formats
from specdec.models.loading import LoadedModel, resolve_device, resolve_dtype

SOURCE = "random weights"  # LoadedModel.source of a model built here


def shipped() -> list[str]:
    """The catalogue names with a shipped config."""
    return sorted(path.stem for path in entries.CONFIGS.glob("*.json"))


def config_path(spec: str) -> Path:
    """The shipped config of catalogue model `spec`; a ValueError naming the choices otherwise."""
    entry = entries.find(spec.strip()) if isinstance(spec, str) else None
    path = entries.shipped_config(entry.name) if entry is not None else None
    if path is None:
        raise ValueError(f"random weights need a catalogue model whose architecture ships with specdec "
                         f"({', '.join(shipped())}), got {spec!r}")
    return path


def load_random(spec: str, *, dtype="auto", device: str = "auto", role: str = "target") -> LoadedModel:
    """Catalogue model `spec` built from its shipped config with random weights, in eval mode (module docstring).

    dtype: a weight format (`formats.FORMATS`), or "auto", the fastest `formats.choose_format` measures here for
    `role` on this very architecture (as `load_model` chooses)."""
    path = config_path(spec)
    config = AutoConfig.from_pretrained(path)
    device = resolve_device(device)
    dtype = (formats.choose_format(config, role, device=device).chosen if dtype == "auto"
             else resolve_dtype(dtype, device))
    with Timer(device) as timer:
        model = formats.build(config, dtype, config.num_hidden_layers, device)
    return LoadedModel(path.stem, model, None, SOURCE, path, dtype, device, timer.seconds)
