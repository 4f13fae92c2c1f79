"""The benchmark: measured speedup next to what the acceptance rate promises, against the baselines.

For every (draft, k, prompt) *cell* it times, on the same prompt ids and length budget:
- target alone: `specdec.autoregressive_generate` (same cache and sampling code as ours);
- ours: `specdec.speculative_generate`;
- Hugging Face assisted generation, `target.generate(assistant_model=draft)` with k constant
  (only for model drafts whose vocabulary size equals the target's);
- Hugging Face plain `target.generate()`.
Each method runs `repeats` times (median wall time); a cell's target alone, ours and HF assisted take their runs in
turn (`specdec.lab.measure.time_in_turn`), so a drift of the machine's speed moves them alike and the cell's ratios
hold. With greedy decoding the outputs of ours and of both HF methods are compared token by token with the target
alone and divergences are kept in the row, never hidden (bf16 batched-vs-single-token near-ties do happen).

Rows go to the run folder (`specdec.lab.bench.store`) as soon as a cell finishes; `specdec.lab.bench.summary`
aggregates them. Metric definitions: `specdec.core.metrics`. This module returns data and never prints;
the CLI (`specdec.cli.bench`) prints and draws.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Callable

import torch
from transformers import GenerationConfig

from specdec.core.costmodel import CostModel
from specdec.core.drafter import Drafter
from specdec.core.engine import autoregressive_generate, speculative_generate
from specdec.core.inputs import resolve_eos, unwrap
from specdec.core.limits import K_AUTO_START
from specdec.core.suites import Prompt, encode
from specdec.core.timing import warm_up
from specdec.core.trace import Counts, explain_divergence, first_divergence, ratio
from specdec.lab.bench.store import RESULTS_CSV, append_row, check_run_folder, read_rows, row_key, write_csv
from specdec.lab.measure import Timed, WARMUP_TOKENS, time_generation, time_in_turn


@dataclass
class BenchConfig:
    """What every cell of a run shares; a resumed run must match the stored one."""

    target: str  # the target's name (catalogue name, path, or a label for in-code models)
    max_new_tokens: int = 64  # new-token budget of every method
    temperature: float = 0.0  # 0 = greedy (outputs must match the target alone); > 0 = sampling
    repeats: int = 1  # timed runs per method and cell; the median wall time is reported
    seed: int = 0  # sampling seed (the same for every method and repeat)
    dtype: str = "float32"  # weights dtype, for the record
    prompts: str = ""  # fingerprint of the prompts (ids and texts), filled in by run_bench: one folder, one suite
    row_format: int = 2  # what a row holds (2: the engine's Counts): a folder of older rows is not resumed


@dataclass
class Contender:
    """A draft under test."""

    name: str  # how rows and charts call it
    draft: object  # a causal LM / LoadedModel or a Drafter, as `speculative_generate` takes it
    hf_assistant: torch.nn.Module | None  # the model HF assisted generation runs as assistant; None = no HF column
    costs: CostModel | None = None  # the pair's calibrated v(n) and c (`specdec.costs.calibration`); None = v(n) = 1
    weights: str = ""  # fingerprint of the draft's weights: a retrained draft under the same name is another draft


def contender(name: str, draft, target, costs: CostModel | None = None) -> Contender:
    """Wrap a draft; HF assisted generation applies only to a model draft (not a Drafter) with the target's
    vocab size."""
    draft_model = None if isinstance(draft, Drafter) else unwrap(draft, None)[0]
    target_model, _ = unwrap(target, None)
    same_vocab = (isinstance(draft_model, torch.nn.Module)
                  and draft_model.config.get_text_config().vocab_size == target_model.config.get_text_config().vocab_size)
    return Contender(name, draft, draft_model if same_vocab else None, costs, weights_fingerprint(draft))


def weights_fingerprint(draft) -> str:
    """sha256 over the draft's kind and settings (a Drafter's cost key), its model's config (not the path it was
    read from: a quantized model read from its store names the store) and the shape and sum of every parameter
    and float buffer (a quantized layer's scales and bias: its int8 weights live in a kernel's packed copy) (a
    model-free drafter: its settings alone)."""
    is_drafter = isinstance(draft, Drafter)
    model = draft.model if is_drafter else unwrap(draft, None)[0]
    digest = hashlib.sha256((draft.cost_key if is_drafter else type(draft).__name__).encode())
    if model is not None:
        config = {k: v for k, v in model.config.to_dict().items() if k != "_name_or_path"}  # where it was read from
        digest.update(json.dumps(config, sort_keys=True, default=str).encode())
        tensors = [*model.named_parameters(), *((name, buffer) for name, buffer in model.named_buffers()
                                                if buffer.is_floating_point() and not buffer.is_meta)]
        with torch.no_grad():
            for name, tensor in tensors:
                digest.update(f"{name}{tuple(tensor.shape)}{float(tensor.double().sum()):.17g}".encode())
    return digest.hexdigest()[:16]


def prompts_fingerprint(prompts: list[Prompt]) -> str:
    """sha256 of the prompts' ids, categories and texts."""
    text = json.dumps([[p.id, p.category, p.split, p.prompt] for p in prompts], ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


OnCell = Callable[[dict], None]


def run_bench(target, contenders: list[Contender], prompts: list[Prompt], ks: list, config: BenchConfig,
              out_dir: str | Path, *, tokenizer=None, on_cell: OnCell | None = None,
              hf_plain: bool = True) -> list[dict]:
    """Measure every (contender, k, prompt) cell not yet in `out_dir`; return all rows of the run folder.

    ks: draft lengths (ints, or "auto" for the engine's adaptive k). on_cell(row) is called after
    each finished cell. hf_plain=False skips the HF plain `generate()` column.
    """
    out = Path(out_dir)
    check_run_folder(out, replace(config, prompts=prompts_fingerprint(prompts)))
    target_model, tokenizer = unwrap(target, tokenizer)
    done = {row_key(r) for r in read_rows(out)}
    _check_weights(read_rows(out), contenders)
    todo = {p.id: [(c, k) for c in contenders for k in ks if (c.name, str(k), p.id) not in done] for p in prompts}
    if any(todo.values()):
        _warm_up(target_model, contenders, ks, encode(prompts[0], tokenizer), config)
    for prompt in prompts:
        if not todo[prompt.id]:
            continue
        ids = encode(prompt, tokenizer)
        plain = (time_generation(_hf(target_model, None, ids, 0, config), config.repeats, target_model.device)
                 if hf_plain else None)
        for entry, k in todo[prompt.id]:
            row = _cell(target_model, entry, k, prompt, ids, config, plain)
            append_row(out, row)
            if on_cell is not None:
                on_cell(row)
    rows = read_rows(out)
    write_csv(rows, out / RESULTS_CSV)
    return rows


def _check_weights(rows: list[dict], contenders: list[Contender]) -> None:
    """Refuse to resume a folder whose rows were measured with other weights under a draft's name."""
    for entry in contenders:
        stored = {r.get("draft_weights") for r in rows if r["draft"] == entry.name}
        if stored - {entry.weights}:
            raise ValueError(f"the run folder holds {entry.name!r} rows measured with other weights (a retrained "
                             "draft under the same name): use a new --out folder")


def cells_to_run(out_dir: str | Path, contenders: list[Contender], prompts: list[Prompt], ks: list) -> int:
    """How many cells a run will measure (those not already in out_dir), for a progress bar."""
    done = {row_key(r) for r in read_rows(Path(out_dir))}
    return sum((c.name, str(k), p.id) not in done for p in prompts for c in contenders for k in ks)


def _cell(target_model, entry: Contender, k, prompt: Prompt, ids: list[int], config: BenchConfig,
          plain: Timed | None) -> dict:
    """One cell's row: the target alone, ours and HF assisted (a model draft of the target's vocabulary size)
    timed in turn."""
    methods = {"alone": _target_alone(target_model, ids, config), "ours": _ours(target_model, entry, ids, k, config)}
    if entry.hf_assistant is not None:
        methods["assisted"] = _hf(target_model, entry.hf_assistant, ids, k, config)
    runs = time_in_turn(methods, config.repeats, target_model.device)
    alone, ours, assisted = runs["alone"], runs["ours"], runs.get("assisted")
    stats = ours.output.stats
    greedy = config.temperature == 0
    return {
        "target": config.target, "draft": entry.name, "draft_weights": entry.weights, "k": str(k),
        "prompt_id": prompt.id,
        "category": prompt.category, "language": prompt.language, "split": prompt.split,
        "prompt_tokens": len(ids), "max_new_tokens": config.max_new_tokens, "temperature": config.temperature,
        "dtype": config.dtype, "repeats": config.repeats,
        "new_tokens": len(ours.token_ids),
        "target_alone_s": alone.seconds, "target_alone_tokens": len(alone.token_ids),
        "target_alone_tok_s": alone.tokens_per_s,
        "target_step_s": ratio(alone.output.stats.target_time_s, alone.output.stats.rounds),
        "ours_s": ours.seconds, "ours_tok_s": ours.tokens_per_s,
        "hf_assisted_s": _field(assisted, "seconds"), "hf_assisted_tok_s": _field(assisted, "tokens_per_s"),
        "hf_plain_s": _field(plain, "seconds"), "hf_plain_tok_s": _field(plain, "tokens_per_s"),
        "speedup_vs_target_alone": ratio(ours.tokens_per_s, alone.tokens_per_s),
        "speedup_vs_hf_assisted": ratio(ours.tokens_per_s, assisted.tokens_per_s) if assisted else None,
        **count_fields(stats.counts), "engine_wall_s": stats.wall_time_s,
        **metric_fields(stats),
        "calibrated_c": entry.costs.draft_cost if entry.costs else None,
        "verify_curve": entry.costs.target.verify if entry.costs else None,
        "ours_equals_target_alone": _same(ours, alone) if greedy else None,
        "hf_assisted_equals_target_alone": _same(assisted, alone) if greedy and assisted else None,
        "hf_plain_equals_target_alone": _same(plain, alone) if greedy and plain else None,
        "first_divergence": first_divergence(ours.token_ids, alone.token_ids) if greedy else None,
        "divergence": _divergence(ours, alone, config) if greedy else None,
    }


ROW_NAMES = {"emitted_tokens": "new_tokens", "wall_time_s": "ours_s"}  # counts a row holds under its own names


def count_fields(counts: Counts) -> dict:
    """A bench row's counters: `specdec.core.trace.Counts` of the first run, except those ROW_NAMES lists
    (the row's new_tokens, and its median wall time ours_s)."""
    return {name: value for name, value in asdict(counts).items() if name not in ROW_NAMES}


def row_counts(row: dict) -> Counts:
    """The Counts of a bench row (what `specdec.lab.bench.summary` pools)."""
    return Counts(**{f.name: row[ROW_NAMES.get(f.name, f.name)] for f in fields(Counts)})


def metric_fields(stats) -> dict:
    """A bench row's metric fields: `specdec.core.trace.DecodeStats` values under the same names."""
    return {name: getattr(stats, name) for name in ("acceptance_rate", "mean_accepted_length", "cost_ratio",
                                                     "theoretical_speedup", "leviathan_bound", "verify_cost",
                                                     "predicted_speedup")}


def _divergence(ours: Timed, alone: Timed, config: BenchConfig) -> dict | None:
    """Why ours left the target alone's greedy output (`specdec.core.trace.explain_divergence`), as a row field."""
    divergence = explain_divergence(ours.output, alone.output, config.dtype)
    return None if divergence is None else {**asdict(divergence), "describe": divergence.describe()}


def _same(timed: Timed, reference: Timed) -> bool:
    return timed.token_ids == reference.token_ids


def _field(timed: Timed | None, name: str):
    return getattr(timed, name) if timed is not None else None


# --- the four timed methods: each builds its generation, `specdec.lab.measure` times it ----------

def _ours(target_model, entry: Contender, ids: list[int], k, config: BenchConfig) -> Callable[[], object]:
    """Our engine with `entry`'s draft: returns its GenerationResult."""
    return lambda: speculative_generate(target_model, entry.draft, ids, k=k, max_new_tokens=config.max_new_tokens,
                                        temperature=config.temperature, seed=config.seed, costs=entry.costs)


def _target_alone(target_model, ids: list[int], config: BenchConfig) -> Callable[[], object]:
    """The target alone through our engine: returns its GenerationResult."""
    return lambda: autoregressive_generate(target_model, ids, max_new_tokens=config.max_new_tokens,
                                           temperature=config.temperature, seed=config.seed)


def _hf(target_model, assistant, ids: list[int], k, config: BenchConfig) -> Callable[[], list[int]]:
    """HF `generate()`, plain (assistant None) or assisted with k drafts per round: returns the new token ids."""
    input_ids = torch.tensor([ids], dtype=torch.long, device=target_model.device)  # [1, T]
    generation_config = _hf_generation_config(target_model, config)

    def generate() -> list[int]:
        torch.manual_seed(config.seed)
        with _assistant_schedule(assistant, k), torch.inference_mode():
            out = target_model.generate(input_ids, attention_mask=torch.ones_like(input_ids),
                                        generation_config=generation_config, assistant_model=assistant)  # [1, T + new]
        return out[0, len(ids):].tolist()  # new tokens only
    return generate


def _hf_generation_config(target_model, config: BenchConfig) -> GenerationConfig:
    """A clean config: no repetition penalty or top-k from the model's generation_config.json, so
    HF decodes exactly what our engine does (greedy argmax, or plain temperature sampling)."""
    eos = sorted(resolve_eos(target_model, None))
    sampling = dict(do_sample=True, temperature=config.temperature, top_k=0) if config.temperature > 0 else {}
    return GenerationConfig(max_new_tokens=config.max_new_tokens, min_new_tokens=0, do_sample=False,
                            eos_token_id=eos or None, pad_token_id=eos[0] if eos else 0, **sampling)


@contextlib.contextmanager
def _assistant_schedule(assistant, k):
    """HF reads the draft length from the *assistant's* generation_config (transformers 5.x,
    `AssistedCandidateGenerator.__init__`): set k with the constant schedule, or for k="auto" HF's
    own adaptive rule ("heuristic_transient": +2 after an all-accepted round, -1 otherwise) from
    our starting k; no confidence threshold (its default 0.4 would end drafts early). The
    assistant's config is restored afterwards."""
    if assistant is None:
        yield
        return
    config = assistant.generation_config
    saved = {name: getattr(config, name, None) for name in
             ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")}
    adaptive = k == "auto"
    config.num_assistant_tokens = K_AUTO_START if adaptive else int(k)
    config.num_assistant_tokens_schedule = "heuristic_transient" if adaptive else "constant"
    config.assistant_confidence_threshold = 0.0
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(config, name, value)


def _warm_up(target_model, contenders: list[Contender], ks: list, ids: list[int], config: BenchConfig) -> None:
    """One short untimed call of every method, so no first-call cost lands in a measured cell."""
    short = replace(config, max_new_tokens=WARMUP_TOKENS, repeats=1)
    assisted = [entry for entry in contenders if entry.hf_assistant is not None]
    warm_up(_target_alone(target_model, ids, short), _hf(target_model, None, ids, 0, short),
            *[_ours(target_model, entry, ids, ks[0], short) for entry in contenders],
            *[_hf(target_model, entry.hf_assistant, ids, ks[0], short) for entry in assisted])
