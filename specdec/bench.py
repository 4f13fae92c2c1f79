"""The benchmark: measured speedup next to what the acceptance rate promises, against the baselines.

For every (draft, k, prompt) *cell* it times, on the same prompt ids and length budget:
- target alone: `specdec.autoregressive_generate` (same cache and sampling code as ours);
- ours: `specdec.speculative_generate`;
- Hugging Face assisted generation, `target.generate(assistant_model=draft)` with k constant
  (only for model drafts whose vocabulary size equals the target's);
- Hugging Face plain `target.generate()`.
Each method runs `repeats` times (median wall time); with greedy decoding the outputs of ours and
of both HF methods are compared token by token with the target alone and divergences are kept
in the row, never hidden (bf16 batched-vs-single-token near-ties do happen).

Rows go to `results.jsonl` as soon as a cell finishes (a rerun skips cells already there) and
to `results.csv`; `summarise` aggregates them per category. Metric definitions: `specdec.trace`.
This module returns data and never prints; the CLI (`specdec.cli.bench`) prints and draws.
"""
from __future__ import annotations

import contextlib
import csv
import json
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch
from transformers import GenerationConfig

from . import theory
from .advisor import advise
from .engine import autoregressive_generate, speculative_generate
from .inputs import resolve_eos, unwrap
from .schedule import K_AUTO_START
from .suites import Prompt, encode
from .trace import first_divergence

RESULTS_JSONL = "results.jsonl"
RESULTS_CSV = "results.csv"
CONFIG_JSON = "config.json"
WARMUP_TOKENS = 4  # new tokens of the warm-up calls (first-call allocation and kernel selection)


@dataclass
class BenchConfig:
    """What every cell of a run shares; a resumed run must match the stored one."""

    target: str  # the target's name (catalogue name, path, or a label for in-code models)
    max_new_tokens: int = 64  # new-token budget of every method
    temperature: float = 0.0  # 0 = greedy (outputs must match the target alone); > 0 = sampling
    repeats: int = 1  # timed runs per method and cell; the median wall time is reported
    seed: int = 0  # sampling seed (the same for every method and repeat)
    dtype: str = "float32"  # weights dtype, for the record


@dataclass
class Contender:
    """A draft under test."""

    name: str  # how rows and charts call it
    draft: object  # a causal LM / LoadedModel or a Drafter, as `speculative_generate` takes it
    hf_assistant: torch.nn.Module | None  # the model HF assisted generation runs as assistant; None = no HF column


def contender(name: str, draft, target) -> Contender:
    """Wrap a draft; HF assisted generation applies only to a model draft with the target's vocab size."""
    draft_model, _ = unwrap(draft, None)
    target_model, _ = unwrap(target, None)
    same_vocab = (isinstance(draft_model, torch.nn.Module)
                  and draft_model.config.get_text_config().vocab_size == target_model.config.get_text_config().vocab_size)
    return Contender(name, draft, draft_model if same_vocab else None)


@dataclass
class Timed:
    """One method's output on a prompt and its median wall time."""

    token_ids: list[int]  # new tokens of the first run
    seconds: float  # median wall time over the repeats
    result: object = None  # the GenerationResult of our engine (None for HF methods)

    @property
    def tokens_per_s(self) -> float:
        return len(self.token_ids) / self.seconds if self.seconds else 0.0


OnCell = Callable[[dict], None]


def run_bench(target, contenders: list[Contender], prompts: list[Prompt], ks: list, config: BenchConfig,
              out_dir: str | Path, *, tokenizer=None, on_cell: OnCell | None = None,
              hf_plain: bool = True) -> list[dict]:
    """Measure every (contender, k, prompt) cell not yet in `out_dir`; return all rows of the run folder.

    ks: draft lengths (ints, or "auto" for the engine's adaptive k). on_cell(row) is called after
    each finished cell. hf_plain=False skips the HF plain `generate()` column.
    """
    out = Path(out_dir)
    _check_run_folder(out, config)
    target_model, tokenizer = unwrap(target, tokenizer)
    done = {_key(r) for r in read_rows(out)}
    todo = {p.id: [(c, k) for c in contenders for k in ks if (c.name, str(k), p.id) not in done] for p in prompts}
    if any(todo.values()):
        _warm_up(target_model, contenders, ks, encode(prompts[0], tokenizer), config)
    for prompt in prompts:
        if not todo[prompt.id]:
            continue
        ids = encode(prompt, tokenizer)
        alone = _time_target_alone(target_model, ids, config)
        plain = _time_hf(target_model, None, ids, 0, config) if hf_plain else None
        for entry, k in todo[prompt.id]:
            row = _cell(target_model, entry, k, prompt, ids, config, alone, plain)
            _append(out / RESULTS_JSONL, row)
            if on_cell is not None:
                on_cell(row)
    rows = read_rows(out)
    write_csv(rows, out / RESULTS_CSV)
    return rows


def cells_to_run(out_dir: str | Path, contenders: list[Contender], prompts: list[Prompt], ks: list) -> int:
    """How many cells a run will measure (those not already in out_dir), for a progress bar."""
    done = {_key(r) for r in read_rows(Path(out_dir))}
    return sum((c.name, str(k), p.id) not in done for p in prompts for c in contenders for k in ks)


def _cell(target_model, entry: Contender, k, prompt: Prompt, ids: list[int], config: BenchConfig,
          alone: Timed, plain: Timed | None) -> dict:
    ours = _time_ours(target_model, entry.draft, ids, k, config)
    assisted = _time_hf(target_model, entry.hf_assistant, ids, k, config) if entry.hf_assistant is not None else None
    stats = ours.result.stats
    rounds = ours.result.rounds
    greedy = config.temperature == 0
    return {
        "target": config.target, "draft": entry.name, "k": str(k), "prompt_id": prompt.id,
        "category": prompt.category, "language": prompt.language, "split": prompt.split,
        "prompt_tokens": len(ids), "max_new_tokens": config.max_new_tokens, "temperature": config.temperature,
        "dtype": config.dtype, "repeats": config.repeats,
        "new_tokens": len(ours.token_ids),
        "target_alone_s": alone.seconds, "target_alone_tokens": len(alone.token_ids),
        "target_alone_tok_s": alone.tokens_per_s,
        "target_step_s": _ratio(alone.result.stats.target_time_s, alone.result.stats.rounds),
        "ours_s": ours.seconds, "ours_tok_s": ours.tokens_per_s,
        "hf_assisted_s": _field(assisted, "seconds"), "hf_assisted_tok_s": _field(assisted, "tokens_per_s"),
        "hf_plain_s": _field(plain, "seconds"), "hf_plain_tok_s": _field(plain, "tokens_per_s"),
        "speedup_vs_target_alone": _ratio(ours.tokens_per_s, alone.tokens_per_s),
        "speedup_vs_hf_assisted": _ratio(ours.tokens_per_s, _field(assisted, "tokens_per_s")),
        "rounds": stats.rounds, "draft_tokens": stats.draft_tokens, "accepted_tokens": stats.accepted_tokens,
        "rejections": stats.rejections, "round_draft_forwards": sum(r.draft_forwards for r in rounds),
        "prefill_time_s": stats.prefill_time_s, "draft_time_s": stats.draft_time_s,
        "target_time_s": stats.target_time_s, "engine_wall_s": stats.wall_time_s,
        "acceptance_rate": stats.acceptance_rate, "mean_accepted_length": stats.mean_accepted_length,
        "cost_ratio": stats.cost_ratio, "theoretical_speedup": stats.theoretical_speedup,
        "cost_aware_bound": stats.expected_walltime_speedup,
        "ours_equals_target_alone": _same(ours, alone) if greedy else None,
        "hf_assisted_equals_target_alone": _same(assisted, alone) if greedy and assisted else None,
        "hf_plain_equals_target_alone": _same(plain, alone) if greedy and plain else None,
        "first_divergence": first_divergence(ours.token_ids, alone.token_ids) if greedy else None,
    }


def _same(timed: Timed, reference: Timed) -> bool:
    return timed.token_ids == reference.token_ids


def _field(timed: Timed | None, name: str):
    return getattr(timed, name) if timed is not None else None


def _ratio(a, b):
    return a / b if a is not None and b else None


# --- the four timed methods ------------------------------------------------------------------

def _median_time(run: Callable[[], tuple[list[int], object]], repeats: int) -> Timed:
    """Run `repeats` times; keep the first output and the median wall time."""
    seconds, first = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        output = run()
        seconds.append(time.perf_counter() - start)
        first = first or output
    return Timed(first[0], statistics.median(seconds), first[1])


def _time_ours(target_model, draft, ids: list[int], k, config: BenchConfig) -> Timed:
    def run():
        result = speculative_generate(target_model, draft, ids, k=k, max_new_tokens=config.max_new_tokens,
                                      temperature=config.temperature, seed=config.seed)
        return result.token_ids, result
    return _median_time(run, config.repeats)


def _time_target_alone(target_model, ids: list[int], config: BenchConfig) -> Timed:
    def run():
        result = autoregressive_generate(target_model, ids, max_new_tokens=config.max_new_tokens,
                                         temperature=config.temperature, seed=config.seed)
        return result.token_ids, result
    return _median_time(run, config.repeats)


def _time_hf(target_model, assistant, ids: list[int], k, config: BenchConfig) -> Timed:
    """HF `generate()`, plain (assistant None) or assisted with k drafts per round, constant schedule."""
    input_ids = torch.tensor([ids], dtype=torch.long, device=target_model.device)  # [1, T]
    generation_config = _hf_generation_config(target_model, config)

    def run():
        torch.manual_seed(config.seed)
        with _assistant_schedule(assistant, k), torch.inference_mode():
            out = target_model.generate(input_ids, attention_mask=torch.ones_like(input_ids),
                                        generation_config=generation_config, assistant_model=assistant)
        return out[0, len(ids):].tolist(), None  # new tokens only
    return _median_time(run, config.repeats)


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
    short = BenchConfig(**{**asdict(config), "max_new_tokens": WARMUP_TOKENS, "repeats": 1})
    _time_target_alone(target_model, ids, short)
    _time_hf(target_model, None, ids, 0, short)
    for entry in contenders:
        _time_ours(target_model, entry.draft, ids, ks[0], short)
        if entry.hf_assistant is not None:
            _time_hf(target_model, entry.hf_assistant, ids, ks[0], short)


# --- the run folder --------------------------------------------------------------------------

def _key(row: dict) -> tuple[str, str, str]:
    return row["draft"], str(row["k"]), row["prompt_id"]


def read_rows(out_dir: Path) -> list[dict]:
    """Rows of `results.jsonl` in a run folder ([] when there is none)."""
    path = Path(out_dir) / RESULTS_JSONL
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _append(path: Path, row: dict) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(row, ensure_ascii=False) + "\n")


def _check_run_folder(out: Path, config: BenchConfig) -> None:
    """Create the folder, or refuse to mix results of a different configuration into it."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / CONFIG_JSON
    if path.exists():
        stored = json.loads(path.read_text(encoding="utf-8"))
        if stored != asdict(config):
            changed = sorted(k for k in set(stored) | set(asdict(config)) if stored.get(k) != asdict(config).get(k))
            raise ValueError(f"{out} holds results of another configuration (differs in {', '.join(changed)}): "
                             "use a new --out folder, or the same settings to resume")
    else:
        path.write_text(json.dumps(asdict(config), indent=1), encoding="utf-8")


def write_csv(rows: list[dict], path: Path) -> None:
    if not rows:
        return
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


# --- aggregation -----------------------------------------------------------------------------

@dataclass
class Summary:
    """Pooled metrics of a group of rows (one draft, one k, one category or all)."""

    draft: str  # contender name
    k: str  # draft length ("auto" for the adaptive k)
    category: str  # category, or "all"
    prompts: int  # cells pooled
    mean_drafted: float  # tokens drafted per round (= k for a fixed k, except near the length limit)
    acceptance_rate: float  # pooled alpha-hat = sum accepted / sum (accepted + rejections)
    mean_accepted_length: float  # 1 + sum accepted / sum rounds
    cost_ratio: float  # pooled c = (draft time / draft forwards) / (target time / rounds)
    theoretical_speedup: float  # (1 - a^(k+1)) / (1 - a) at the pooled alpha-hat (k: mean drafted per round if auto)
    cost_aware_bound: float  # (1 - a^(k+1)) / ((1 - a)(k c + 1))
    ours_tok_s: float  # sum new tokens / sum wall time
    target_alone_tok_s: float
    hf_assisted_tok_s: float | None  # None when the draft has no HF column
    hf_plain_tok_s: float | None
    speedup_vs_target_alone: float  # ours_tok_s / target_alone_tok_s
    speedup_vs_hf_assisted: float | None  # ours_tok_s / hf_assisted_tok_s
    identical: str  # greedy: "n/m" cells where ours == target alone; "-" when sampling
    hf_identical: str  # greedy: "n/m" cells where HF assisted == target alone
    draft_share: float  # share of our wall time in draft forwards
    target_share: float  # ... in target verification forwards
    prefill_share: float  # ... in prompt prefill
    overhead_share: float  # ... in everything else (sampling, verification, bookkeeping, Python)
    verify_vs_step: float  # mean verification forward (k+1 tokens) / mean target-alone forward (1 token);
    #                        Leviathan's bound assumes 1: above 1 the bound is out of reach


def summarise(rows: list[dict]) -> list[Summary]:
    """One Summary per (draft, k, category) plus a per-(draft, k) "all" group."""
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        for category in (row["category"], "all"):
            groups.setdefault((row["draft"], str(row["k"]), category), []).append(row)
    return [_pool(key, group) for key, group in sorted(groups.items(), key=lambda kv: _sort_key(kv[0]))]


def _sort_key(key: tuple) -> tuple:
    draft, k, category = key
    return draft, category == "all", category, (0, int(k)) if k.isdigit() else (1, 0)


def _pool(key: tuple, rows: list[dict]) -> Summary:
    draft, k, category = key
    total = lambda name: sum(r[name] for r in rows)  # noqa: E731
    accepted, rounds = total("accepted_tokens"), total("rounds")
    alpha = _safe(accepted, accepted + total("rejections"))
    c = _safe(_safe(total("draft_time_s"), total("round_draft_forwards")), _safe(total("target_time_s"), rounds))
    k_eff = int(k) if k.isdigit() else max(1, round(_safe(total("draft_tokens"), rounds)))
    ours_tok_s = _safe(total("new_tokens"), total("ours_s"))
    alone_tok_s = _safe(total("target_alone_tokens"), total("target_alone_s"))
    assisted = _pooled_rate(rows, "hf_assisted_s")
    wall = total("engine_wall_s")
    inside = total("prefill_time_s") + total("draft_time_s") + total("target_time_s")
    return Summary(
        draft=draft, k=k, category=category, prompts=len(rows), mean_drafted=_safe(total("draft_tokens"), rounds),
        acceptance_rate=alpha,
        mean_accepted_length=1.0 + _safe(accepted, rounds), cost_ratio=c,
        theoretical_speedup=theory.expected_tokens_per_step(alpha, k_eff),
        cost_aware_bound=theory.walltime_speedup(alpha, k_eff, c),
        ours_tok_s=ours_tok_s, target_alone_tok_s=alone_tok_s, hf_assisted_tok_s=assisted,
        hf_plain_tok_s=_pooled_rate(rows, "hf_plain_s"),
        speedup_vs_target_alone=_safe(ours_tok_s, alone_tok_s),
        speedup_vs_hf_assisted=_safe(ours_tok_s, assisted) if assisted else None,
        identical=_count_true(rows, "ours_equals_target_alone"),
        hf_identical=_count_true(rows, "hf_assisted_equals_target_alone"),
        draft_share=_safe(total("draft_time_s"), wall), target_share=_safe(total("target_time_s"), wall),
        prefill_share=_safe(total("prefill_time_s"), wall), overhead_share=_safe(wall - inside, wall),
        verify_vs_step=_safe(_safe(total("target_time_s"), rounds), _mean(r["target_step_s"] for r in rows)),
    )


def _pooled_rate(rows: list[dict], seconds_field: str) -> float | None:
    """Tokens/s of an HF column over the rows that have it (same token counts as the target alone)."""
    have = [r for r in rows if r[seconds_field] is not None]
    if not have:
        return None
    tokens_field = "hf_assisted_tok_s" if seconds_field == "hf_assisted_s" else "hf_plain_tok_s"
    tokens = sum(r[tokens_field] * r[seconds_field] for r in have)
    return _safe(tokens, sum(r[seconds_field] for r in have))


def _count_true(rows: list[dict], name: str) -> str:
    values = [r[name] for r in rows if r[name] is not None]
    return f"{sum(values)}/{len(values)}" if values else "-"


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values) if values else 0.0


def _safe(a: float, b: float) -> float:
    return a / b if b else 0.0


# --- the Markdown report ---------------------------------------------------------------------

TARGET_VS_HF = 1.15  # issue 6: our greedy tokens/s >= 1.15x HF assisted, same pair, prompts and k
TARGET_OF_BOUND = 0.9  # measured speedup >= 0.9x the cost-aware bound at the best k
TARGET_CODE = 1.5  # code prompts: >= 1.5x over the target alone

COLUMNS = (  # (header, Summary field, format)
    ("draft", "draft", "{}"), ("k", "k", "{}"), ("n", "prompts", "{}"),
    ("α̂", "acceptance_rate", "{:.3f}"), ("mean acc. len", "mean_accepted_length", "{:.2f}"),
    ("c", "cost_ratio", "{:.3f}"), ("(1-α^(k+1))/(1-α)", "theoretical_speedup", "{:.2f}"),
    ("cost-aware bound", "cost_aware_bound", "{:.2f}"),
    ("measured vs target alone", "speedup_vs_target_alone", "{:.2f}x"),
    ("ours vs HF assisted", "speedup_vs_hf_assisted", "{:.2f}x"),
    ("ours tok/s", "ours_tok_s", "{:.2f}"), ("target alone tok/s", "target_alone_tok_s", "{:.2f}"),
    ("HF assisted tok/s", "hf_assisted_tok_s", "{:.2f}"), ("HF generate tok/s", "hf_plain_tok_s", "{:.2f}"),
    ("ours = target alone", "identical", "{}"), ("HF assisted = target alone", "hf_identical", "{}"),
)
PROFILE_COLUMNS = (
    ("draft", "draft", "{}"), ("k", "k", "{}"), ("draft forwards", "draft_share", "{:.0%}"),
    ("target forwards", "target_share", "{:.0%}"), ("prefill", "prefill_share", "{:.0%}"),
    ("overhead", "overhead_share", "{:.0%}"),
    ("verify forward / target step", "verify_vs_step", "{:.2f}"),
)


def format_report(rows: list[dict]) -> str:
    """The run's Markdown summary: per-category tables, time profile, k advice, issue targets, divergences."""
    if not rows:
        return "(no results)"
    summaries = summarise(rows)
    first = rows[0]
    parts = [f"# Benchmark: target {first['target']}",
             f"dtype {first['dtype']}, max_new_tokens {first['max_new_tokens']}, temperature {first['temperature']}, "
             f"repeats {first['repeats']} (median), {len({r['prompt_id'] for r in rows})} prompts. "
             "Speedups are ratios of tokens/s measured in this run; metric definitions in specdec/trace.py."]
    for category in _categories(summaries):
        parts += [f"## {category}", _markdown([s for s in summaries if s.category == category], COLUMNS)]
    overall = [s for s in summaries if s.category == "all"]
    parts += ["## Where our wall time goes (all prompts)",
              "Shares of our engine's wall time. The last column is the cost of one verification forward "
              "(k+1 tokens) relative to one target-alone step (1 token): the bound assumes it is 1.",
              _markdown(overall, PROFILE_COLUMNS)]
    parts += ["## k advisor (Leviathan optimal k from the measured α̂, c and verification cost)",
              _advice_table(rows, summaries)]
    if any(s.k == "auto" for s in overall):
        parts += ['## k="auto" vs the best fixed k (all prompts)', _auto_table(overall)]
    parts += ["## Issue targets", _targets_table(summaries)]
    parts += ["## Greedy divergences", _divergences(rows)]
    return "\n\n".join(parts) + "\n"


def _categories(summaries: list[Summary]) -> list[str]:
    return sorted({s.category for s in summaries} - {"all"}) + ["all"]


def _markdown(items: list, columns: tuple) -> str:
    header = "| " + " | ".join(h for h, _, _ in columns) + " |"
    rule = "|" + "|".join("---" for _ in columns) + "|"
    lines = ["| " + " | ".join(_cell_text(getattr(item, f), fmt) for _, f, fmt in columns) + " |" for item in items]
    return "\n".join([header, rule, *lines])


def _cell_text(value, fmt: str) -> str:
    return "–" if value is None else fmt.format(value)


@dataclass
class AdviceRow:
    """The advisor's view of one (draft, category)."""

    draft: str  # contender
    category: str  # category or "all"
    acceptance_rate: float  # pooled over every fixed k measured
    cost_ratio: float  # pooled over every fixed k measured
    verify_cost: float  # measured extra verification cost per drafted token, in target steps (see advice_rows)
    recommended_k: int  # Leviathan's argmax k with c + verify_cost as the cost per drafted token
    expected_speedup: float  # cost-aware bound at recommended_k, with the same cost
    best_measured_k: str  # the k with the highest measured speedup vs the target alone
    best_measured_speedup: float  # that speedup
    verdict: str  # one line


def advice_rows(rows: list[dict], summaries: list[Summary] | None = None) -> list[AdviceRow]:
    """k advice per (draft, category) from the pooled fixed-k measurements.

    Leviathan's bound prices a verification forward of k+1 tokens at one target step; measured here it
    costs `verify_vs_step` steps. Modelling it as 1 + k·v target steps (v = (verify_vs_step − 1) / k drafted,
    at least 0) adds v to the cost of each drafted token, so the advice maximises the bound at c + v:
    without it a model-free draft (c = 0) would always be advised the largest k.
    """
    summaries = summaries if summaries is not None else summarise(rows)
    result = []
    for draft, category in sorted({(s.draft, s.category) for s in summaries}):
        fixed = [r for r in rows if r["draft"] == draft and str(r["k"]).isdigit()
                 and category in (r["category"], "all")]
        if not fixed:
            continue
        pooled = _pool((draft, "pooled", category), fixed)
        verify_cost = max(0.0, _safe(pooled.verify_vs_step - 1.0, pooled.mean_drafted))
        advice = advise(pooled.acceptance_rate, pooled.cost_ratio + verify_cost)
        best = max((s for s in summaries if s.draft == draft and s.category == category),
                   key=lambda s: s.speedup_vs_target_alone)
        result.append(AdviceRow(draft, category, pooled.acceptance_rate, pooled.cost_ratio, verify_cost, advice.k,
                                advice.expected_speedup, best.k, best.speedup_vs_target_alone, advice.verdict))
    return result


ADVICE_COLUMNS = (
    ("draft", "draft", "{}"), ("category", "category", "{}"), ("α̂", "acceptance_rate", "{:.3f}"),
    ("c", "cost_ratio", "{:.3f}"), ("verify cost per drafted token", "verify_cost", "{:.3f}"),
    ("advised k", "recommended_k", "{}"),
    ("expected speedup", "expected_speedup", "{:.2f}x"), ("best measured k", "best_measured_k", "{}"),
    ("its measured speedup", "best_measured_speedup", "{:.2f}x"), ("advice", "verdict", "{}"),
)


def _advice_table(rows: list[dict], summaries: list[Summary]) -> str:
    return _markdown(advice_rows(rows, summaries), ADVICE_COLUMNS)


def _auto_table(overall: list[Summary]) -> str:
    lines = ["| draft | auto: measured speedup | mean k drafted | best fixed k | its measured speedup | auto / best fixed |",
             "|---|---|---|---|---|---|"]
    for draft in sorted({s.draft for s in overall}):
        auto = next((s for s in overall if s.draft == draft and s.k == "auto"), None)
        fixed = [s for s in overall if s.draft == draft and s.k.isdigit()]
        if auto is None or not fixed:
            continue
        best = max(fixed, key=lambda s: s.speedup_vs_target_alone)
        lines.append(f"| {draft} | {auto.speedup_vs_target_alone:.2f}x | {auto.mean_drafted:.2f} | {best.k} | "
                     f"{best.speedup_vs_target_alone:.2f}x | "
                     f"{_safe(auto.speedup_vs_target_alone, best.speedup_vs_target_alone):.2f} |")
    return "\n".join(lines)


@dataclass
class TargetCheck:
    """One performance target of issue 6, measured."""

    draft: str  # contender
    target: str  # what is asked
    k: str  # the k it was measured at (the best measured k over all prompts)
    measured: float | None  # the measured ratio
    required: float  # the threshold
    met: str  # "yes" / "no" / "n/a"


def target_checks(summaries: list[Summary]) -> list[TargetCheck]:
    """The three targets at each draft's best measured k (over all prompts; code: best code k)."""
    checks = []
    for draft in sorted({s.draft for s in summaries}):
        overall = [s for s in summaries if s.draft == draft and s.category == "all"]
        best = max(overall, key=lambda s: s.speedup_vs_target_alone)
        checks.append(_check(draft, "ours / HF assisted tokens/s", best.k, best.speedup_vs_hf_assisted, TARGET_VS_HF))
        checks.append(_check(draft, "measured speedup / cost-aware bound", best.k,
                             _safe(best.speedup_vs_target_alone, best.cost_aware_bound), TARGET_OF_BOUND))
        code = [s for s in summaries if s.draft == draft and s.category == "code"]
        if code:
            best_code = max(code, key=lambda s: s.speedup_vs_target_alone)
            checks.append(_check(draft, "code: speedup vs target alone", best_code.k,
                                 best_code.speedup_vs_target_alone, TARGET_CODE))
    return checks


def _check(draft: str, what: str, k: str, measured: float | None, required: float) -> TargetCheck:
    met = "n/a" if measured is None else ("yes" if measured >= required else "no")
    return TargetCheck(draft, what, k, measured, required, met)


TARGET_COLUMNS = (
    ("draft", "draft", "{}"), ("target", "target", "{}"), ("at k", "k", "{}"),
    ("measured", "measured", "{:.2f}"), ("required", "required", "≥ {:.2f}"), ("met", "met", "{}"),
)


def _targets_table(summaries: list[Summary]) -> str:
    return _markdown(target_checks(summaries), TARGET_COLUMNS)


def _divergences(rows: list[dict]) -> str:
    """Every greedy cell whose output differs from the target alone, by method."""
    lines = []
    for r in rows:
        for method in ("ours", "hf_assisted", "hf_plain"):
            if r.get(f"{method}_equals_target_alone") is False:
                where = f" at token {r['first_divergence']}" if method == "ours" else ""
                lines.append(f"- {method} ≠ target alone: draft {r['draft']}, k={r['k']}, prompt {r['prompt_id']}{where}")
    if not lines and rows[0]["temperature"] > 0:
        return "Sampling run (temperature > 0): outputs are not expected to match token by token."
    return "\n".join(lines) if lines else "None: every greedy output matched the target alone token for token."
