"""The aligned-draft recipe: turn a small draft of another family into a draft for the target, per domain.

A domain-shift experiment at small scale: does a draft with another tokenizer collapse on domain text, and
do alignment, distillation (DistillSpec, Zhou et al. 2023) and a pruned draft vocabulary (FR-Spec, Zhao
et al. 2025) bring it back? Stages, each cached in the domain's folder and skipped when it finished before with
the same inputs (inputs.json records them) and no stage before it ran again; a stage that runs again removes what
the later ones made. Outputs are written under a temporary name and renamed, so a kill never leaves a half-written
one; a changed step count continues distillation from its checkpoint, other changed training settings start it
again:

| stage | output | what |
|---|---|---|
| report | report.json | tokenizer compatibility of the two models (`specdec.drafters.tokenizers`) |
| transplant | transplant/ | the draft hard-cloned onto the target's tokenizer, rows copied by token string |
| data | data.json | the target's greedy continuations of the training prompts, plus `samples` sampled ones per
  prompt (cached in distill/data/; several rows per batched forward with `generation_batch`, and how many greedy
  rows match one-at-a-time generation) |
| distill | distill/ | transplant/ distilled on that data (resumable checkpoints; `specdec.training.distill`); registered as
  an aligned draft, its held-out α̂ filled in by the measure stage (no separate held-out check unless
  `distill.eval_every` > 0: measuring (d) and (e) is that check) |
| prune | prune/vocabulary.json | target ids the domain data uses, the most frequent ones of general text and every token
  the other draft's own vocabulary has (the rows the transplant copied) |
| measure | results.json, table.md | every draft on held-out prompts, against the target alone as decoding runs it (its
  `target_dtype`: by default the format generate and bench run), all under one k policy |

Rows of the table: (a) the target's family, (b) the other draft with its ids fed naively, (c) through the
text bridge, (d) transplanted, (e) (d) distilled, (f) (e) drafting over the pruned vocabulary. Each row has
α̂, mean accepted length, c, the predicted speedup (calibrated costs, `DecodeStats.predicted_speedup`) and the
measured speedup over the target alone, timed prompt by prompt just before each draft (`DraftTrials.run`),
and greedy identity.
"""
from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable

from specdec.core import files
from specdec.core.inputs import vocab_size
from specdec.core.schedule import mean_draft_length
from specdec.core.suites import ALL, encode, load_suite
from specdec.core.trace import pooled_stats
from specdec.costs.calibration import calibrate
from specdec.drafters import Vocabulary, from_spec
from specdec.drafters.bridge import NaiveCrossVocabDrafter, TextBridgeDrafter
from specdec.drafters.spec import VOCAB_SEPARATOR
from specdec.drafters.tokenizers import shared_token_map, tokenizer_report
from specdec.lab.measure import DraftTrials
from specdec.models import aligned, cache
from specdec.models.loading import load_draft, load_model
from specdec.training.align import save_aligned, transplanted
from specdec.training.distill import (DistillConfig, cached_examples, checkpoint_report, data_fingerprint,
                                      generate_examples, resume_conflict)
from specdec.training.prune import MOST_FREQUENT, build_vocabulary, save_vocabulary
from specdec.training.service import distill_to_folder

STAGES = ("report", "transplant", "data", "distill", "prune", "measure")
BATCH_CHECKS = 2  # batched training rows regenerated one at a time to check they are the same
# the recipe's distillation, the CLI's defaults too (eval_every 0: the measure stage measures α̂)
RECIPE_DISTILL = DistillConfig(steps=100, eval_every=0)
Say = Callable[[str], None]


@dataclass
class RecipeSettings:
    """What one domain's run needs besides the models; every field is part of the run's identity."""

    train: list[list[int]]  # training prompts, target token ids
    held_out: list[list[int]]  # held-out prompts (measure and distillation evals), target token ids
    texts: list[str]  # domain text the tokenizer report is computed on
    distill: DistillConfig = field(default_factory=lambda: replace(RECIPE_DISTILL))  # distillation hyper-parameters
    max_new_tokens: int = 48  # target continuation length per training prompt
    measure_max_new_tokens: int = 32  # tokens generated per held-out prompt when measuring
    k: int | str = "auto"  # draft tokens per round when measuring: "auto" (the controller, as generate) or a fixed k
    most_frequent: int = MOST_FREQUENT  # general-text tokens kept in the pruned vocabulary
    generation_batch: int = 16  # training prompts the target continues per batched forward (1 = one at a time)
    samples: int = 1  # sampled target continuations per training prompt besides the greedy one (more contexts)
    sample_temperature: float = 0.8  # temperature of those samples (the target's own distribution, sharpened)
    draft_dtype: str = "auto"  # format of each draft measured (auto: the fastest here for a draft)
    target_dtype: str = "auto"  # format of the target measured against (auto: as generate and bench run it)


@dataclass
class Row:
    """One line of the table: a draft measured on every held-out prompt."""

    draft: str  # what drafts, e.g. "(c) smollm2-135m-instruct via text bridge"
    tokenizer: str  # whose tokenizer the draft uses
    acceptance_rate: float  # α̂ pooled over prompts (accepted / (accepted + rejections)); nan for the target alone
    mean_accepted_length: float  # tokens per target forward, pooled (incl. the target's token)
    cost_ratio: float  # c = one draft forward / one target step, measured in this run
    predicted_speedup: float  # the whole call priced by the calibrated v(n) and c (DecodeStats.predicted_speedup)
    measured_speedup: float  # tokens/s of this row / of the target alone timed beside it (pooled)
    ms_per_token: float  # pooled wall time per emitted token
    identical_outputs: str  # "n/N" prompts whose greedy output equals the target alone's


# --- stages ------------------------------------------------------------------------------------------------

# what each stage makes; the first is its mark of completion. Running a stage again removes what the stages after it
# made (it was made from the old output); its own checkpoint stays for `distill` to continue when it can.
PRODUCTS = {"report": ("report.json",), "transplant": ("transplant",), "data": ("data.json",),
            "distill": ("distill/report.json", "distill/draft", "distill/loss.html", "distill/checkpoint"),
            "prune": ("prune",), "measure": ("results.json", "table.md")}
INPUTS = "inputs.json"  # per finished stage, the settings it was made with (`stage_inputs`)


def run_recipe(target, other, same_draft: str, settings: RecipeSettings, folder: Path, *,
               say: Say = print, domain: str = "", measured_target: Callable[[], object] | None = None) -> list[Row]:
    """Every stage for one domain in `folder`. A stage is skipped when it finished before with the same inputs;
    else it runs, after removing what the stages after it made (so they run too). Returns the table's rows.

    `target` makes the data and the soft labels (a float form); `measured_target()` (default: `target` itself) is
    the target the measure stage runs the drafts against, in `settings.target_dtype` (loaded only if it runs)."""
    folder.mkdir(parents=True, exist_ok=True)
    times = _read_json(folder / "stage_times.json") or {}
    made_with = _read_json(folder / INPUTS) or {}
    inputs = stage_inputs(target, other, same_draft, settings)
    work = {"report": lambda: stage_report(target, other, settings, folder),
            "transplant": lambda: stage_transplant(target, other, folder),
            "data": lambda: stage_data(target, settings, folder),
            "distill": lambda: stage_distill(target, other, settings, folder),
            "prune": lambda: stage_prune(target, other, settings, folder),
            "measure": lambda: stage_measure((measured_target or (lambda: target))(), other, same_draft, settings,
                                             folder, say)}
    for number, name in enumerate(STAGES, start=1):
        head, output = f"[{domain}] {number}/{len(STAGES)} {name}", folder / PRODUCTS[name][0]
        changed = _changes(made_with.get(name), inputs[name])
        if output.exists() and not changed:
            say(f"{head}: skipped, done before ({output.relative_to(folder)})")
            continue
        if output.exists():
            say(f"{head}: done before with other inputs ({changed}); doing it and the stages after it again")
        for later in STAGES[number:]:  # made from this stage's old output
            for product in PRODUCTS[later]:
                files.remove(folder / product)
        files.remove(output)
        cache.clean_stale(output.parent)  # what a killed run left half-written
        say(f"{head} ...")
        start = time.perf_counter()
        summary = work[name]()
        times[name], made_with[name] = round(time.perf_counter() - start, 1), inputs[name]
        files.write_text(folder / "stage_times.json", json.dumps(times, indent=1))
        files.write_text(folder / INPUTS, json.dumps(made_with, indent=1))
        say(f"{head}: {summary} ({times[name]:.0f} s)")
    return [Row(**r) for r in _read_json(folder / "results.json")["rows"]]


def stage_inputs(target, other, same_draft: str, settings: RecipeSettings) -> dict[str, dict]:
    """What each stage's output depends on besides the stages before it (JSON values; prompts as digests)."""
    return {
        "report": {"target": target.name, "dtype": str(target.dtype), "other draft": other.name,
                   "texts": _digest(settings.texts)},
        "transplant": {},
        "data": {"training prompts": _digest(settings.train), "max_new_tokens": settings.max_new_tokens,
                 "samples": settings.samples, "sample_temperature": settings.sample_temperature,
                 "generation_batch": settings.generation_batch},
        "distill": asdict(settings.distill),
        "prune": {"most_frequent": settings.most_frequent, "keeps the draft's own tokens": True},
        "measure": {"held-out prompts": _digest(settings.held_out), "same draft": same_draft, "k": settings.k,
                    "measure_max_new_tokens": settings.measure_max_new_tokens, "draft_dtype": settings.draft_dtype,
                    "target_dtype": settings.target_dtype},
    }


def _digest(value) -> dict:
    """A fingerprint of a long input for the record (a dict, so that a change reads "changed", not two hashes)."""
    return {"sha256": hashlib.sha256(json.dumps(value, ensure_ascii=False).encode()).hexdigest()[:16]}


def _changes(before: dict | None, now: dict) -> str:
    """'' when a stage's recorded inputs are `now`, else what changed, e.g. "steps 100 -> 150"."""
    if before is None:
        return "no record of its inputs"
    return ", ".join(f"{key} changed" if isinstance(value, dict) else f"{key} {before.get(key)} -> {value}"
                     for key, value in now.items() if before.get(key) != value)


def stage_report(target, other, settings: RecipeSettings, folder: Path) -> str:
    report = tokenizer_report(target.tokenizer, other.tokenizer, settings.texts, target_model=target.model,
                              draft_model=other.model)
    files.write_text(folder / "report.json", json.dumps(report.to_dict(), indent=1, ensure_ascii=False))
    return (f"{report.shared_tokens} shared tokens ({report.overlap:.0%} of the target's), word-boundary "
            f"mismatch {report.boundary_mismatch_rate:.0%}")


def stage_transplant(target, other, folder: Path) -> str:
    model = transplanted(other, target, "string").model
    with files.atomic_path(folder / "transplant") as partial:
        save_aligned(model, target.tokenizer, partial)
    return f"{other.name} on the target's tokenizer ({vocab_size(model)} rows) in transplant/"


def stage_data(target, settings: RecipeSettings, folder: Path) -> str:
    start = time.perf_counter()
    data = _data(target, settings, folder)
    seconds = time.perf_counter() - start
    tokens = sum(len(e.completion_ids) for e in data)
    summary = {"sequences": len(data), "prompts": len(settings.train), "samples": settings.samples,
               "continuation_tokens": tokens, "generation_batch": settings.generation_batch,
               "s_per_row": round(seconds / len(data), 2)}
    note = ""
    if settings.generation_batch > 1:  # batching may change rounding: compare a few rows with one at a time
        checked = data[:BATCH_CHECKS]
        start = time.perf_counter()
        alone = generate_examples(target, [e.prompt_ids for e in checked], max_new_tokens=settings.max_new_tokens)
        summary["one_at_a_time_s_per_row"] = round((time.perf_counter() - start) / len(checked), 2)
        same = sum(a.completion_ids == e.completion_ids for a, e in zip(alone, checked))
        summary["identical_to_one_at_a_time"] = f"{same}/{len(checked)}"
        note = (f"; {summary['s_per_row']:.1f} s per row batched vs {summary['one_at_a_time_s_per_row']:.1f} s one at "
                f"a time, rows equal to one-at-a-time: {same}/{len(checked)}")
    files.write_text(folder / "data.json", json.dumps(summary))
    sampled = f" (greedy + {settings.samples} sampled at T={settings.sample_temperature} per prompt)" \
        if settings.samples else ""
    return f"{len(data)} target continuations{sampled}, {tokens} tokens{note}"


def stage_distill(target, other, settings: RecipeSettings, folder: Path) -> str:
    """Distil transplant/ into distill/draft and register it in the model cache as an aligned draft
    (`specdec.models.aligned`: the dashboard lists it with its recipe). Held-out α̂ is checked during
    training only when `distill.eval_every` > 0; the measure stage measures it either way."""

    draft = load_model(str(folder / "transplant"), dtype=target.dtype)
    held_out = settings.held_out if settings.distill.eval_every else []
    data = _data(target, settings, folder)
    continued = _continue_or_restart(folder / "distill" / "checkpoint", settings.distill, data)
    report = distill_to_folder(target, draft, settings.train, held_out, settings.distill,
                               folder / "distill", max_new_tokens=settings.max_new_tokens, resume=True, data=data)
    registered = aligned.register_distilled(folder / "distill" / "draft", report, domain=folder.name,
                                            name=_registry_name(other, folder),
                                            target=aligned.loaded_id(target), source=aligned.loaded_id(other))
    first, last = report.losses[0], report.losses[-1]
    checked = (f", held-out α̂ {report.evals[0]['acceptance_rate']:.3f} -> {report.evals[-1]['acceptance_rate']:.3f}"
               if report.evals else "")
    return (f"{settings.distill.steps} steps{continued}, loss {first['loss']:.2f} -> {last['loss']:.2f}{checked}; "
            f"registered as aligned:{registered.name}")


def _continue_or_restart(checkpoint: Path, config: DistillConfig, data) -> str:
    """Keep the checkpoint when this run can continue it (same training settings and data, at most `steps` done),
    else remove it. Returns what the stage summary says about it."""
    saved = checkpoint_report(checkpoint)
    if saved is None:
        return ""
    conflict = resume_conflict(saved, asdict(config), data_fingerprint(data))
    if conflict:
        files.remove(checkpoint)
        return f" (started again: {conflict})"
    return f" (continued from step {saved.steps_done})"


def stage_prune(target, other, settings: RecipeSettings, folder: Path) -> str:
    domain = [e.prompt_ids + e.completion_ids for e in _data(target, settings, folder)]
    general = [encode(p, target.tokenizer) for p in load_suite(ALL, split="dev") if isinstance(p.prompt, str)]
    own = shared_token_map(target.tokenizer, other.tokenizer)  # the tokens the draft had: rows transplanted as they were
    ids = build_vocabulary(domain, general, most_frequent=settings.most_frequent,
                           always=[*target.tokenizer.all_special_ids, *own])
    rows = vocab_size(target.model)
    ids = [t for t in ids if t < rows]
    save_vocabulary(folder / "prune" / "vocabulary.json", ids, rows=rows, domain_sequences=len(domain),
                    general_sequences=len(general), most_frequent=settings.most_frequent, draft_own_tokens=len(own))
    return f"{len(ids)} of {rows} target ids kept ({len(ids) / rows:.1%})"


def stage_measure(target, other, same_draft: str, settings: RecipeSettings, folder: Path, say: Say) -> str:
    """Measure every row; the registered distilled draft's card gets row (e)'s held-out α̂."""
    rows = measure(target, other, same_draft, settings, folder, say)
    distilled = next(r for r in rows if r.draft.startswith("(e)"))
    aligned.set_acceptance(_registry_name(other, folder), distilled.acceptance_rate)
    return f"{len(rows) - 1} drafts measured on {len(settings.held_out)} held-out prompts"


# --- measurement -------------------------------------------------------------------------------------------

def measure(target, other, same_draft: str, settings: RecipeSettings, folder: Path, say: Say = print) -> list[Row]:
    """Every row of the table, measured here in one run; writes results.json and table.md."""
    held_out, n, k = settings.held_out, settings.measure_max_new_tokens, settings.k
    trials = DraftTrials(target, held_out, k, n)  # warm-up, then the target alone (its outputs, its row)
    baseline = trials.baseline
    distilled = folder / "distill" / "draft"
    pruned = f"{distilled}{VOCAB_SEPARATOR}{folder / 'prune' / 'vocabulary.json'}"
    # every draft in the format measured fastest here for a draft (its precision never changes the output), so
    # the rows compare drafts, not formats (a pruned vocabulary slices the head in the draft's format)
    load = lambda name: load_model(name, dtype=settings.draft_dtype, role="draft")  # noqa: E731
    foreign = lambda: load(str(other.path))  # noqa: E731 - the other draft as it drafts, not as it was transplanted
    contenders = [
        (f"(a) {Path(same_draft).name}", "target's",
         lambda: load_draft(same_draft, target, dtype=settings.draft_dtype, bridge=Vocabulary.AS_IS)),
        (f"(b) {other.name}, ids fed naively", f"{other.name}'s", lambda: NaiveCrossVocabDrafter(foreign())),
        (f"(c) {other.name} via text bridge", f"{other.name}'s",
         lambda: TextBridgeDrafter(foreign(), target.tokenizer)),
        (f"(d) {other.name} transplanted by string", "target's (hard-cloned)",
         lambda: load(str(folder / "transplant"))),
        ("(e) (d) distilled", "target's (hard-cloned)", lambda: load(str(distilled))),
        ("(f) (e) with a pruned vocabulary", "target's, pruned",
         lambda: from_spec(pruned, target, load=load)),
    ]
    rows = [Row("target alone", "target's", math.nan, 1.0, 0.0, 1.0, 1.0, _ms_per_token(baseline),
                f"{len(held_out)}/{len(held_out)}")]
    say(markdown(rows).rstrip())
    for label, tokenizer, make in contenders:
        draft = make()
        costs = calibrate(target, draft, cache_dir=folder / "costs")  # v(n) measured once, c per draft
        trial = trials.run(draft, costs)
        stats = pooled_stats(trial.results, _reported_k(k, trial.results), costs)
        same = trials.identical(trial.results)
        rows.append(Row(label, tokenizer, stats.acceptance_rate, stats.mean_accepted_length, stats.cost_ratio,
                        stats.predicted_speedup, trial.measured_speedup, _ms_per_token(stats),
                        f"{same}/{len(trial.results)}"))
        say(markdown(rows[-1:]).splitlines()[-1])
    files.write_text(folder / "table.md", markdown(rows))
    files.write_text(folder / "results.json", json.dumps(
        {"target": target.name, "dtype": target.dtype, "k": k, "prompts": len(held_out), "max_new_tokens": n,
         "rows": [asdict(r) for r in rows]}, indent=1, ensure_ascii=False))
    return rows


def _reported_k(k: int | str, results: list) -> int:
    """The k of pooled stats: a fixed k as asked, k = "auto" the mean draft length of every round measured."""
    return k if isinstance(k, int) else mean_draft_length([r for result in results for r in result.rounds])


def _ms_per_token(stats) -> float:
    return 1000 / stats.tokens_per_s if stats.tokens_per_s else math.nan


def markdown(rows: list[Row]) -> str:
    """The table as markdown (α̂ "—" for the target alone)."""
    lines = ["| draft | tokenizer | α̂ | mean accepted length | c | predicted speedup | measured speedup | "
             "ms per token | greedy output = target's |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        alpha = "—" if math.isnan(r.acceptance_rate) else f"{r.acceptance_rate:.3f}"
        lines.append(f"| {r.draft} | {r.tokenizer} | {alpha} | {r.mean_accepted_length:.2f} | {r.cost_ratio:.2f} | "
                     f"{r.predicted_speedup:.2f}x | {r.measured_speedup:.2f}x | {r.ms_per_token:.0f} | "
                     f"{r.identical_outputs} |")
    return "\n".join(lines) + "\n"


# --- helpers -----------------------------------------------------------------------------------------------


def _registry_name(other, folder: Path) -> str:
    return aligned.name_for(f"{other.name}-{folder.name}")


def _data(target, settings: RecipeSettings, folder: Path):
    """The target's continuations of the training prompts, greedy then `samples` sampled ones per prompt
    (cached in distill/data/, so the data and distill stages read the same examples)."""
    def continuations(prompts, temperature):
        return cached_examples(target, prompts, folder / "distill" / "data", max_new_tokens=settings.max_new_tokens,
                               temperature=temperature, model_name=target.name, batch_size=settings.generation_batch)
    sampled = continuations(settings.train * settings.samples, settings.sample_temperature) if settings.samples else []
    return continuations(settings.train, 0.0) + sampled


def _read_json(path: Path):
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None
