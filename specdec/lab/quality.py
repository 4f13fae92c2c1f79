"""How far a quantized target is from the model it was quantized from, measured on text.

A quantized target (`load_model(name, quant="int8")`) is a different target: speculative decoding is lossless
with respect to it, not to the float model. Three measures of how different, per prompt category and pooled:

- teacher-forced top-1 agreement: on the same text, the share of positions where the candidate's argmax is
  the reference's argmax;
- perplexity of each model on that text, and the ratio candidate / reference;
- free-running: how many tokens the candidate's own greedy continuation shares with the reference's before
  it first leaves it (secondary: one early flip ends it, however close the models are afterwards). Read off
  the teacher-forced forward: until its first flip the candidate's greedy path *is* the reference text, so the
  first position whose argmax differs from the text's token is where it leaves. Exact for a row-invariant
  candidate (the integer path: a row of a multi-token forward is bitwise its one-token step); up to rounding
  for a float candidate.

Top-1 agreement and perplexity are the usual quality measures of weight quantization (LLM.int8(), Dettmers
et al. 2022; GPTQ, Frantar et al. 2023).

The text is the reference model's greedy continuations of the held-out prompts (`TEXT`), cached per
(model, dtype, prompts, length) under the specdec cache, one line per finished prompt, so a rerun (or a run
after a kill) does not generate them again. `BIAS` says
what that choice favours.

Each run's pooled row is kept as a `QualityRecord` (where and when it was measured) under the specdec cache,
and the default target's are shipped under `assets/quality/`: `records_for(name)` is what the app's Hardware
tab and `profile` show beside the target's weight format (this machine's measurement first).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import torch

from specdec.core import files, hardware
from specdec.core.inputs import unwrap
from specdec.core.kv import CachedLM
from specdec.core.suites import Prompt, encode, load_suite
from specdec.models import cache, formats
from specdec.models.loading import QUANTS, LoadedModel
from specdec.training.distill import Example, cached_examples

POOLED = "pooled"  # category name of the row over every prompt
TEXT = "the reference model's greedy continuations of the held-out prompts"
BIAS = ("the reference chose every token of this text (its argmax at each step), so it is favoured: its "
        "perplexity here is lower than on text neither model wrote, and the ratio candidate/reference is "
        "larger than it would be there; agreement counts positions on the reference's path only")
CACHE_FOLDER = "quality"  # under the specdec cache: the reference continuations
RECORDS_FOLDER = "quality-records"  # under the specdec cache: the pooled row of each run here, by candidate
RECORD_FORMAT, RECORD_VERSION = "specdec quality record", 1  # the header of a QualityRecord file (`files.read_json`)
SHIPPED = files.ASSETS / "quality"  # records that ship with the code: the default target's formats


@dataclass
class PromptScores:
    """What one prompt's continuation measured (counts and sums, so rows pool by tokens)."""

    prompt_id: str  # e.g. "code-07"
    category: str  # the prompt's category
    tokens: int  # continuation tokens scored (the reference's greedy continuation, EOS included)
    agreed: int  # positions where argmax(candidate) == argmax(reference), teacher-forced
    nll_reference: float  # summed negative log-likelihood (nats) of the continuation under the reference
    nll_candidate: float  # the same under the candidate
    common_prefix: int  # tokens the candidate's own greedy continuation shares with the reference's before leaving it


@dataclass
class QualityRow:
    """One category (or the pool) of a quality report: token-weighted, never an average of ratios.

    Teacher-forced top-1 agreement and perplexity (ratio) are how weight quantization is usually judged
    (LLM.int8(), Dettmers et al. 2022; GPTQ, Frantar et al. 2023)."""

    category: str  # prompt category, or POOLED
    prompts: int  # prompts in the row
    tokens: int  # continuation positions scored
    agreement: float  # teacher-forced top-1 agreement = agreed positions / tokens
    ppl_reference: float  # exp(summed reference NLL / tokens)
    ppl_candidate: float  # exp(summed candidate NLL / tokens)
    ppl_ratio: float  # ppl_candidate / ppl_reference
    mean_common_prefix: float  # mean over prompts of tokens in common before the free-running divergence


@dataclass
class QualityReport:
    """A candidate measured against a reference on the reference's greedy text."""

    reference: str  # e.g. "qwen2.5-coder-1.5b-instruct float32"
    candidate: str  # e.g. "qwen2.5-coder-1.5b-instruct int8"
    max_new_tokens: int  # length of each reference continuation (shorter when it ends with EOS)
    rows: list[QualityRow]  # one per category, sorted by name
    pooled: QualityRow  # every prompt's tokens together
    prompts: list[PromptScores] = field(default_factory=list)  # the per-prompt counts behind the rows
    text: str = TEXT  # what the measures are taken on
    bias: str = BIAS  # what that text favours


@dataclass
class Check:
    """One target of a report's pooled row, and whether it is met."""

    label: str  # e.g. "agreement >= 0.900"
    value: float  # the measured value
    met: bool


def read_prompts(spec: str, split: str | None = "heldout") -> list[Prompt]:
    """Prompts of `spec`: a suite name, "all", comma-separated suite names ("code,chat") or a file."""
    names = [spec] if "," not in spec else [name.strip() for name in spec.split(",") if name.strip()]
    return [p for name in names for p in load_suite(name, split=split)]


def describe(model) -> str:
    """"name format" of a LoadedModel; class name and weight format (`formats.format_of`) of a bare model."""
    if isinstance(model, LoadedModel):
        return f"{model.name} {model.dtype}"
    return f"{type(model).__name__} {formats.format_of(model)}"


def reference_continuations(reference, prompts_ids: list[list[int]], max_new_tokens: int) -> list[Example]:
    """The reference's greedy continuations of the prompts (one at a time: on a CPU a batched forward of
    padded rows was not cheaper per row), cached per (model name and dtype, weights fingerprint, prompts,
    length) under the specdec cache."""
    return cached_examples(reference, prompts_ids, cache.root() / CACHE_FOLDER, max_new_tokens=max_new_tokens,
                           model_name=describe(reference))


def continuation_logits(model, example: Example) -> torch.Tensor:
    """Logits [n, V] (float32) predicting each of the n continuation tokens, from one forward over
    prompt + continuation[:-1] (teacher forcing: row i has read the continuation's first i tokens), by the forward
    the model decodes with (`CachedLM`: a quantized target's own, whose rows are its one-token steps)."""
    model, _ = unwrap(model, None)
    n = len(example.completion_ids)
    logits, _ = CachedLM(model).forward(example.prompt_ids + example.completion_ids[:-1], logits_to_keep=n)
    return logits  # [n, V]


def agreed_positions(reference_logits: torch.Tensor, candidate_logits: torch.Tensor) -> int:
    """Positions where both argmaxes are the same token (logits [n, V] each; the widths may differ by padding)."""
    width = min(reference_logits.shape[-1], candidate_logits.shape[-1])
    return int((reference_logits[:, :width].argmax(-1) == candidate_logits[:, :width].argmax(-1)).sum())


def negative_log_likelihood(logits: torch.Tensor, token_ids: list[int]) -> float:
    """Sum over positions of -log p(token_i) (nats), logits [n, V], one token per row."""
    log_probs = torch.log_softmax(logits, dim=-1)  # [n, V]
    picked = log_probs.gather(-1, torch.tensor(token_ids)[:, None])  # [n, 1]
    return -float(picked.double().sum())


def common_prefix(a: list[int], b: list[int]) -> int:
    """Tokens `a` and `b` share before their first difference."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def free_running_prefix(candidate_logits: torch.Tensor, completion_ids: list[int]) -> int:
    """Tokens the candidate's own greedy continuation shares with the text before leaving it: the first
    position whose teacher-forced argmax (logits [n, V]) is not the text's token (module docstring)."""
    return common_prefix(candidate_logits.argmax(-1).tolist(), completion_ids)


def score_prompt(reference, candidate, prompt: Prompt, example: Example) -> PromptScores:
    """Teacher-forced agreement, both NLLs and the free-running prefix of one prompt's continuation."""
    reference_logits = continuation_logits(reference, example)  # [n, V]
    candidate_logits = continuation_logits(candidate, example)  # [n, V']
    return PromptScores(prompt.id, prompt.category, len(example.completion_ids),
                        agreed_positions(reference_logits, candidate_logits),
                        negative_log_likelihood(reference_logits, example.completion_ids),
                        negative_log_likelihood(candidate_logits, example.completion_ids),
                        free_running_prefix(candidate_logits, example.completion_ids))


def pool(scores: list[PromptScores], category: str = POOLED) -> QualityRow:
    """One row over `scores`: counts and NLLs summed over tokens first, then divided (token-weighted)."""
    tokens = sum(s.tokens for s in scores)
    ppl_reference = math.exp(sum(s.nll_reference for s in scores) / tokens)
    ppl_candidate = math.exp(sum(s.nll_candidate for s in scores) / tokens)
    return QualityRow(category, len(scores), tokens, sum(s.agreed for s in scores) / tokens, ppl_reference,
                      ppl_candidate, ppl_candidate / ppl_reference, sum(s.common_prefix for s in scores) / len(scores))


def report_of(scores: list[PromptScores], reference: str, candidate: str, max_new_tokens: int) -> QualityReport:
    """Rows per category (sorted) and the pooled row of per-prompt scores."""
    categories = sorted({s.category for s in scores})
    rows = [pool([s for s in scores if s.category == c], c) for c in categories]
    return QualityReport(reference, candidate, max_new_tokens, rows, pool(scores), scores)


def measure_quality(reference, candidate, prompts: list[Prompt], *, max_new_tokens: int = 64, tokenizer=None,
                    on_prompt: Callable[[int, PromptScores], None] | None = None) -> QualityReport:
    """Measure `candidate` (e.g. the int8 target) against `reference` (e.g. the float32 one) on TEXT.

    reference, candidate: LoadedModels or causal LMs sharing one tokenizer (`tokenizer`, else the
    reference's). on_prompt(index, scores) is called after each prompt (progress).
    """
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
    _, tokenizer = unwrap(reference, tokenizer)
    scores = []
    examples = reference_continuations(reference, [encode(p, tokenizer) for p in prompts], max_new_tokens)
    for index, (prompt, example) in enumerate(zip(prompts, examples)):
        scores.append(score_prompt(reference, candidate, prompt, example))
        if on_prompt is not None:
            on_prompt(index, scores[-1])
    return report_of(scores, describe(reference), describe(candidate), max_new_tokens)


def check_targets(row: QualityRow, min_agreement: float | None = None,
                  max_ppl_ratio: float | None = None) -> list[Check]:
    """The targets given (None = not checked) against `row` (usually the pooled one)."""
    checks = []
    if min_agreement is not None:
        checks.append(Check(f"agreement >= {min_agreement:.3f}", row.agreement, row.agreement >= min_agreement))
    if max_ppl_ratio is not None:
        checks.append(Check(f"perplexity ratio <= {max_ppl_ratio:.3f}", row.ppl_ratio, row.ppl_ratio <= max_ppl_ratio))
    return checks


@dataclass
class QualityRecord:
    """A report's pooled row with where and when it was measured: what is shown beside a target's format."""

    candidate: str  # "name dtype" of the model measured, e.g. "qwen2.5-coder-1.5b-instruct int8"
    reference: str  # "name dtype" of the model it was measured against
    prompts: int  # prompts scored
    tokens: int  # continuation positions scored
    agreement: float  # pooled teacher-forced top-1 agreement
    ppl_ratio: float  # pooled perplexity ratio candidate / reference
    hardware: str  # `specdec.core.hardware.label` of the machine it was measured on
    date: str  # when, ISO 8601 UTC

    def line(self) -> str:
        return (f"{self.candidate} against {self.reference}: top-1 agreement {100 * self.agreement:.1f} %, "
                f"perplexity {100 * (self.ppl_ratio - 1):+.2f} % over {self.tokens} positions of {self.prompts} "
                f"held-out prompts (measured {self.date[:10]} on {self.hardware})")


def record_of(report: QualityReport) -> QualityRecord:
    """The pooled row of `report`, measured now on this machine."""
    row = report.pooled
    return QualityRecord(report.candidate, report.reference, row.prompts, row.tokens, row.agreement, row.ppl_ratio,
                         hardware.label(hardware.describe()), datetime.now(timezone.utc).isoformat(timespec="seconds"))


def save_record(record: QualityRecord, folder: Path | None = None) -> Path:
    """Keep `record` under the cache (`folder` overrides), replacing an earlier one of the same candidate."""
    path = (folder or cache.root() / RECORDS_FOLDER) / f"{record.candidate.replace(' ', '-')}.json"
    files.write_json(path, {"format": RECORD_FORMAT, "version": RECORD_VERSION, **asdict(record)})
    return path


def records_for(name: str, folders: list[Path] | None = None) -> list[QualityRecord]:
    """Every record of the model `name` (any format): this machine's first, then the shipped ones of a format
    not measured here. A file that does not read as a record is skipped."""
    found: dict[str, QualityRecord] = {}
    for folder in folders or [cache.root() / RECORDS_FOLDER, SHIPPED]:
        for path in sorted(Path(folder).glob("*.json")):
            record = _read_record(path)
            if record is not None and record.candidate.rsplit(" ", 1)[0] == name:
                found.setdefault(record.candidate, record)
    return list(found.values())


def _read_record(path: Path) -> QualityRecord | None:
    names = [f.name for f in fields(QualityRecord)]
    try:
        data = files.read_json(path, "quality record", RECORD_FORMAT, RECORD_VERSION, names,
                               "`python -m specdec quality` writes one")
    except ValueError:
        return None
    return QualityRecord(**{name: data[name] for name in names})


def quality_lines(name: str, format_: str | None = None, folders: list[Path] | None = None) -> list[str]:
    """What is known of the quality of `name`'s formats against its float model: the record of `format_` (the
    quantized format it runs in, where known) first, else first how to measure that one; with no format and no
    record, how to measure the int8 one."""
    records = sorted(records_for(name, folders), key=lambda r: r.candidate != f"{name} {format_}")
    lines = [record.line() for record in records]
    if format_ is None:
        wanted = None if lines else "int8"
    else:
        wanted = format_ if format_ in QUANTS[1:] else None  # a float format is the reference itself
    if wanted and not (records and records[0].candidate == f"{name} {wanted}"):
        lines.insert(0, f"{name} {wanted}: quality against its float model not measured yet "
                        f"(`python -m specdec quality --target {name} --quant {wanted}`)")
    return lines
