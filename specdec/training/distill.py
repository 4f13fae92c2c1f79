"""Distil a draft towards its target so that the target accepts more of its tokens.

Loss (knowledge distillation, Hinton et al. 2015, as a speculative-decoding draft loss):
    L = (1 - a) * CE(y, draft) + a * T^2 * D(P_target || P_draft),   defaults T = 2, a = 0.7,
where D is the forward KL, or the reverse KL or total variation (DistillSpec, Zhou et al. 2023: acceptance is
1 - TV, Leviathan et al. 2023). y is the target's greedy token at each position: greedy verification accepts a
draft token exactly when it equals that token, so the hard label is the target's choice, not the data's next
token (they differ on sampled and draft-generated continuations; on 28 finance prompts outside the suite it
raised greedy α̂ by 1.3 points at T = 2 and 1.4 at T = 1). The T^2 factor compensates the 1/T^2 gradient scale
of temperature-softened KL targets; TV gets no such factor. Every term is a mean over real (unmasked) tokens;
a plain `F.kl_div(..., reduction="batchmean")` divides a sum over all positions, padding included, by the
batch size instead.

Data (DistillSpec: train on what the target will really be asked): the target's own continuations of
domain prompts, generated once and cached as jsonl of token ids; optionally the draft's own continuations
(on-policy), labelled by the target. The loss covers the continuation tokens only.

Soft labels: with `top_k`, each target distribution is kept as its top-k log-probabilities plus the log
mass of the rest (one "other" outcome), computed once per example and reused every epoch; divergences are
then taken on that coarsened (k+1)-outcome distribution, a lower bound of the full one. top_k=None uses the
full target distribution, recomputed each step.

The training loop is plain torch under `accelerate.Accelerator`: it runs on a CPU here and unchanged under
`accelerate launch` on many GPUs or torchrun on CPUs (each process takes its share of every batch; only the
main process evaluates and writes checkpoints).
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from specdec.core import files
from specdec.core.engine import autoregressive_generate, speculative_generate
from specdec.core.inputs import resolve_eos, unwrap
from specdec.core.trace import pooled_stats
from specdec.models import cache, quant4

DIVERGENCES = ("forward_kl", "reverse_kl", "tv")


# --- the loss -----------------------------------------------------------------------------------------------

@dataclass
class SoftLabels:
    """The target's next-token distributions at temperature T, full or as top-k + the rest."""

    log_probs: torch.Tensor  # [B, L, K] log-probabilities of the kept outcomes (K = V when full)
    ids: torch.Tensor | None  # [B, L, K] vocabulary ids of the kept outcomes; None = all V ids in order
    rest: torch.Tensor | None  # [B, L] log mass of the ids not kept; None when full


@dataclass
class LossParts:
    """One loss value and its two terms (means over real tokens)."""

    total: torch.Tensor  # (1 - a) * ce + a * scale * divergence, scalar with grad
    ce: torch.Tensor  # cross-entropy of the draft on the hard labels (temperature 1)
    divergence: torch.Tensor  # D(P_target || P_draft) at temperature T, before the T^2 scale


def soft_labels(target_logits: torch.Tensor, temperature: float, top_k: int | None = None) -> SoftLabels:
    """target_logits [B, L, V] -> SoftLabels at `temperature` (top-k + rest when top_k < V)."""
    log_probs = F.log_softmax(target_logits.float() / temperature, dim=-1)  # [B, L, V]
    if top_k is None or top_k >= log_probs.shape[-1]:
        return SoftLabels(log_probs, None, None)
    top, ids = log_probs.topk(top_k, dim=-1)  # [B, L, k]
    return SoftLabels(top, ids, _log_rest(top))


def _log_rest(kept_log_probs: torch.Tensor) -> torch.Tensor:
    """[..., k] log-probs of kept outcomes -> [...] log(1 - their total mass), clamped away from log 0."""
    kept = kept_log_probs.logsumexp(-1).clamp(max=-1e-6)
    return torch.log(-torch.expm1(kept))


def divergence(draft_logits: torch.Tensor, labels: SoftLabels, temperature: float, kind: str) -> torch.Tensor:
    """Per-token D(P_target || P_draft) at `temperature`: [B, L, V] logits -> [B, L]."""
    if kind not in DIVERGENCES:
        raise ValueError(f"divergence must be one of {DIVERGENCES}, got {kind!r}")
    draft_log_probs = F.log_softmax(draft_logits.float() / temperature, dim=-1)  # [B, L, V]
    target_lp = labels.log_probs  # [B, L, K]
    if labels.ids is None:
        draft_lp = draft_log_probs
    else:  # the (k+1)-outcome view: the kept ids and "the rest"
        kept = draft_log_probs.gather(-1, labels.ids)  # [B, L, k]
        draft_lp = torch.cat([kept, _log_rest(kept).unsqueeze(-1)], dim=-1)  # [B, L, k+1]
        target_lp = torch.cat([target_lp, labels.rest.unsqueeze(-1)], dim=-1)
    if kind == "forward_kl":
        return (target_lp.exp() * (target_lp - draft_lp)).sum(-1)
    if kind == "reverse_kl":
        return (draft_lp.exp() * (draft_lp - target_lp)).sum(-1)
    return 0.5 * (target_lp.exp() - draft_lp.exp()).abs().sum(-1)


def distill_loss(draft_logits: torch.Tensor, labels: SoftLabels, hard_labels: torch.Tensor, mask: torch.Tensor,
                 *, temperature: float = 2.0, alpha: float = 0.7, kind: str = "forward_kl") -> LossParts:
    """(1 - a) CE + a T^2 D over the tokens where mask is true (T^2 only for the KLs).

    draft_logits [..., V]; labels, hard_labels and mask over the same leading dims [...] (e.g. [B, L] or [N])."""
    if not 0 <= alpha <= 1:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    mask = mask.float()
    real = mask.sum().clamp_min(1.0)
    vocab = draft_logits.shape[-1]
    ce_per_token = F.cross_entropy(draft_logits.float().reshape(-1, vocab), hard_labels.clamp_min(0).reshape(-1),
                                   reduction="none").reshape(hard_labels.shape)  # [...]
    ce = (ce_per_token * mask).sum() / real
    div = (divergence(draft_logits, labels, temperature, kind) * mask).sum() / real
    scale = temperature**2 if kind != "tv" else 1.0
    return LossParts((1 - alpha) * ce + alpha * scale * div, ce, div)


def speculative_distill_loss(target_logits: torch.Tensor, draft_logits: torch.Tensor, labels: torch.Tensor,
                             mask: torch.Tensor | None = None, temperature: float = 2.0, alpha: float = 0.7,
                             kind: str = "forward_kl") -> torch.Tensor:
    """The distillation loss straight from both models' logits, with a per-token mask: logits [B, L, V], labels
    [B, L] (-100 = padding)."""
    if mask is None:
        mask = labels != -100
    parts = distill_loss(draft_logits, soft_labels(target_logits, temperature), labels, mask,
                         temperature=temperature, alpha=alpha, kind=kind)
    return parts.total


# --- data ---------------------------------------------------------------------------------------------------

@dataclass
class Example:
    """One training sequence: a prompt and a continuation of it."""

    prompt_ids: list[int]  # the prompt (no loss on it)
    completion_ids: list[int]  # the continuation the loss is taken on
    source: str = "target"  # "target" (target-generated) or "draft" (on-policy: the draft's own continuation)


def generate_examples(model, prompts: list[list[int]], *, max_new_tokens: int, temperature: float = 0.0,
                      seed: int = 0, source: str = "target") -> list[Example]:
    """Continuations of `prompts` by `model` (greedy at temperature 0, else sampled), eos kept."""
    examples = []
    for i, prompt in enumerate(prompts):
        result = autoregressive_generate(model, prompt, max_new_tokens=max_new_tokens, temperature=temperature,
                                         seed=seed + i)
        examples.append(Example(list(prompt), result.token_ids, source))
    return examples


def generate_batched(model, prompts: list[list[int]], *, max_new_tokens: int, temperature: float = 0.0,
                     seed: int = 0, source: str = "target") -> list[Example]:
    """Continuations of `prompts`, all in one batch: left-padded rows with an attention mask through
    `model.generate`, each cut after its first EOS (kept). Greedy at temperature 0 (padding can change
    low-precision rounding, so a row may differ from `generate_examples`' one-at-a-time output; the recipe
    measures how often), else sampled from the model's own distribution at `temperature` (no top-k/top-p),
    reproducibly from `seed` without touching the global random state."""

    model, _ = unwrap(model, None)
    eos = resolve_eos(model, None)
    width = max(len(p) for p in prompts)
    device = next(model.parameters()).device
    ids = torch.tensor([[0] * (width - len(p)) + list(p) for p in prompts], device=device)  # [B, T] left-padded
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)  # [B, T]
    sampling = (dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if temperature > 0
                else dict(do_sample=False))
    with torch.inference_mode(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, min_new_tokens=1,
                             eos_token_id=sorted(eos) or None, pad_token_id=0, **sampling)  # [B, T + n]
    examples = []
    for prompt, row in zip(prompts, out[:, width:].tolist()):
        end = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
        examples.append(Example(list(prompt), row[:end], source))
    return examples


def cached_examples(model, prompts: list[list[int]], cache_dir, *, max_new_tokens: int, temperature: float = 0.0,
                    seed: int = 0, source: str = "target", model_name: str = "", batch_size: int = 1) -> list[Example]:
    """`generate_examples`, stored once under cache_dir as jsonl (the key hashes every input).

    batch_size > 1: `generate_batched` over that many prompts at a time (its own cache file)."""
    parts = [model_name, _fingerprint(model), prompts, max_new_tokens, temperature, seed, source]
    key = hashlib.sha256(json.dumps(parts + ([batch_size] if batch_size > 1 else [])).encode()).hexdigest()[:16]
    path = Path(cache_dir) / f"{source}-continuations-{key}.jsonl"
    if path.exists():
        return load_examples(path)
    partial = path.with_suffix(".partial")  # one line per finished prompt: a killed run keeps its work
    done = _whole_lines(partial) if partial.exists() else []
    partial.parent.mkdir(parents=True, exist_ok=True)
    with partial.open("a") as file:
        for i in range(len(done), len(prompts), batch_size):
            if batch_size > 1:
                examples = generate_batched(model, prompts[i:i + batch_size], max_new_tokens=max_new_tokens,
                                            temperature=temperature, seed=seed + i, source=source)
            else:
                examples = generate_examples(model, prompts[i:i + 1], max_new_tokens=max_new_tokens,
                                             temperature=temperature, seed=seed + i, source=source)
            for example in examples:
                file.write(json.dumps(asdict(example)) + "\n")
            file.flush()
            done.extend(examples)
    partial.rename(path)
    return done


def _whole_lines(partial: Path) -> list[Example]:
    """The examples of a partial cache file; a last line cut short by a kill is dropped from the file."""
    data = partial.read_bytes()
    whole = data[:data.rfind(b"\n") + 1]
    os.truncate(partial, len(whole))
    return [Example(**json.loads(line)) for line in whole.decode().split("\n") if line.strip()]


def _fingerprint(model) -> list:
    """Cheap identity of a model's weights: config name, sizes, and the sum of its head's first 64 outputs for a
    fixed input (a head in any format: float, int8, 4-bit, whose weight may be only a shape)."""
    model, _ = unwrap(model, None)
    head, hidden = model.get_output_embeddings(), model.config.hidden_size
    parameter = next(p for p in model.parameters() if p.is_floating_point() and not p.is_meta)
    with torch.no_grad():
        probe = torch.linspace(-1, 1, hidden, device=parameter.device, dtype=parameter.dtype)[None]  # [1, H]
        outputs = head(probe)[0, :64]  # [64]
    return [type(model).__name__, list(head.weight.shape), round(float(outputs.double().sum()), 4)]


def load_examples(path) -> list[Example]:
    return [Example(**json.loads(line)) for line in Path(path).read_text().split("\n") if line.strip()]


@dataclass
class Batch:
    """Right-padded training tensors."""

    input_ids: torch.Tensor  # [B, L] prompt + continuation, padded with 0
    attention_mask: torch.Tensor  # [B, L] 1 on real tokens
    loss_mask: torch.Tensor  # [B, L] true where position i predicts a continuation token


def make_batch(examples: list[Example], device="cpu") -> Batch:
    length = max(len(e.prompt_ids) + len(e.completion_ids) for e in examples)
    input_ids = torch.zeros(len(examples), length, dtype=torch.long)
    attention = torch.zeros(len(examples), length, dtype=torch.long)
    loss_mask = torch.zeros(len(examples), length, dtype=torch.bool)
    for row, e in enumerate(examples):
        ids = torch.tensor(e.prompt_ids + e.completion_ids)
        input_ids[row, :len(ids)], attention[row, :len(ids)] = ids, 1
        loss_mask[row, len(e.prompt_ids) - 1:len(ids) - 1] = True
    return Batch(*(t.to(device) for t in (input_ids, attention, loss_mask)))


class TargetLabeller:
    """Soft labels from the target for a batch; with top_k they are computed once per example and kept."""

    def __init__(self, target_model, temperature: float, top_k: int | None):
        self.target, self.temperature, self.top_k = target_model, temperature, top_k
        self.kept: dict[int, tuple[SoftLabels, torch.Tensor]] = {}  # example index -> (labels [1,L,k], argmax [1,L])

    @torch.no_grad()
    def __call__(self, indices: list[int], batch: Batch) -> tuple[SoftLabels, torch.Tensor]:
        """-> (SoftLabels [B, L, ...], target argmax ids [B, L])."""
        if self.top_k is None:
            logits = self._logits(batch.input_ids, batch.attention_mask)  # [B, L, V]
            return soft_labels(logits, self.temperature), logits.argmax(-1)
        missing = [(row, i) for row, i in enumerate(indices) if i not in self.kept]
        for row, i in missing:
            length = int(batch.attention_mask[row].sum())
            logits = self._logits(batch.input_ids[row:row + 1, :length], batch.attention_mask[row:row + 1, :length])
            self.kept[i] = (soft_labels(logits, self.temperature, self.top_k), logits.argmax(-1))
        return self._pad([self.kept[i] for i in indices], batch.input_ids.shape[1])

    def _logits(self, input_ids, attention_mask) -> torch.Tensor:
        return self.target(input_ids=input_ids, attention_mask=attention_mask).logits.float()

    def _pad(self, rows: list[tuple[SoftLabels, torch.Tensor]], length: int) -> tuple[SoftLabels, torch.Tensor]:
        """Stack per-example labels, padding positions past each end (their loss is masked out)."""
        def pad(t: torch.Tensor) -> torch.Tensor:  # [1, L_i, ...] -> [1, length, ...]
            extra = length - t.shape[1]
            return torch.cat([t, t[:, -1:].expand(1, extra, *t.shape[2:])], dim=1) if extra else t
        log_probs = torch.cat([pad(r[0].log_probs) for r in rows])
        full = rows[0][0].ids is None  # top_k >= V: every id kept, in order, nothing left over
        ids = None if full else torch.cat([pad(r[0].ids) for r in rows])
        rest = None if full else torch.cat([pad(r[0].rest) for r in rows])
        argmax = torch.cat([pad(r[1]) for r in rows])
        return SoftLabels(log_probs, ids, rest), argmax


# --- evaluation ---------------------------------------------------------------------------------------------

@dataclass
class Acceptance:
    """Greedy speculative decoding of held-out prompts, pooled over the prompts."""

    acceptance_rate: float  # α̂ = accepted / (accepted + rejections), pooled
    mean_accepted_length: float  # tokens per target forward (incl. the target's token), pooled


def held_out_acceptance(target, draft, prompts: list[list[int]], *, k: int = 4,
                        max_new_tokens: int = 32) -> Acceptance:
    """α̂ and mean accepted length of `draft` for `target` on `prompts` (greedy, k drafts per round)."""
    stats = pooled_stats([speculative_generate(target, draft, prompt, k=k, max_new_tokens=max_new_tokens)
                          for prompt in prompts], k)
    return Acceptance(stats.acceptance_rate, stats.mean_accepted_length)


# --- training -----------------------------------------------------------------------------------------------

@dataclass
class DistillConfig:
    """Hyper-parameters of one distillation run."""

    steps: int = 200  # optimizer steps (each over grad_accum micro-batches)
    lr: float = 2e-4  # AdamW learning rate (constant; above 1e-4 and 5e-4 on the recipe's dev-prompt split)
    batch_size: int = 4  # sequences per micro-batch
    grad_accum: int = 1  # micro-batches per optimizer step
    temperature: float = 2.0  # T of the soft labels and the T^2 factor
    alpha: float = 0.7  # weight of the divergence term; 1 - alpha on cross-entropy
    divergence: str = "forward_kl"  # "forward_kl" (classic distillation), "reverse_kl" or "tv"
    top_k: int | None = 64  # soft labels kept per position (None = full distribution every step)
    four_bit: bool = True  # forward and backward through the 4-bit values of the decoder's Linear weights: the form a
    # draft runs in on every CPU measured (int4-dynamic); False for a draft that will run in float
    max_grad_norm: float = 1.0  # gradient clipping
    eval_every: int = 50  # steps between held-out acceptance evaluations (0 = only at start and end)
    eval_k: int = 4  # draft length of the evaluation
    eval_max_new_tokens: int = 32  # tokens generated per evaluation prompt
    checkpoint_every: int = 100  # steps between checkpoints (when a checkpoint_dir is given)
    seed: int = 0  # batch order

    def __post_init__(self):
        """Refuse, on construction (before any model loads), settings that would fail late or train nothing."""
        rules = {"steps": (self.steps >= 1, ">= 1"), "lr": (0 < self.lr < math.inf, "> 0"),
                 "batch_size": (self.batch_size >= 1, ">= 1"), "grad_accum": (self.grad_accum >= 1, ">= 1"),
                 "temperature": (0 < self.temperature < math.inf, "> 0"), "alpha": (0 <= self.alpha <= 1, "in [0, 1]"),
                 "divergence": (self.divergence in DIVERGENCES, f"one of {DIVERGENCES}"),
                 "top_k": (self.top_k is None or self.top_k >= 1, ">= 1 or None"),
                 "max_grad_norm": (self.max_grad_norm > 0, "> 0"), "eval_every": (self.eval_every >= 0, ">= 0"),
                 "eval_k": (self.eval_k >= 1, ">= 1"), "eval_max_new_tokens": (self.eval_max_new_tokens >= 1, ">= 1"),
                 "checkpoint_every": (self.checkpoint_every >= 1, ">= 1")}
        for name, (valid, rule) in rules.items():
            if not valid:
                raise ValueError(f"{name} must be {rule}, got {getattr(self, name)!r}")


# what a resumed run must share with its checkpoint (the rest: step count, evaluation)
TRAINING_SETTINGS = ("lr", "batch_size", "grad_accum", "temperature", "alpha", "divergence", "top_k", "four_bit",
                     "max_grad_norm", "seed")
BEFORE_SETTING = {"four_bit": False}  # how a checkpoint older than a setting trained


@dataclass
class DistillReport:
    """What a run did and measured (JSON-able)."""

    config: dict  # the DistillConfig used
    examples: int  # training sequences
    train_tokens: int  # continuation tokens the loss covers, over the data set
    steps_done: int  # optimizer steps completed (a resumed run counts the earlier ones)
    data: str = ""  # sha256 prefix of the training examples (a resume must train on the same data)
    losses: list[dict] = field(default_factory=list)  # per step: step, loss, ce, divergence
    evals: list[dict] = field(default_factory=list)  # step, acceptance_rate, mean_accepted_length
    wall_time_s: float = 0.0  # time of this run (a resumed run: since resuming)
    processes: int = 1  # training processes (`accelerate launch` / torchrun); each takes a slice of every batch

    def to_dict(self) -> dict:
        return asdict(self)


Progress = Callable[[int, int, dict], None]  # (step, steps, latest loss record)


def cpu_only() -> bool:
    """True without a GPU-like accelerator: accelerate then needs cpu=True to see a multi-process CPU launch
    (torchrun, or MPI; gloo backend) instead of N processes that each train alone."""
    return torch.accelerator.current_accelerator() is None


def process_state():
    """accelerate's process state (rank, main process), the one `distill`'s Accelerator will share."""
    from accelerate import PartialState

    return PartialState(cpu=cpu_only())


def distill(target, draft, data: list[Example], *, config: DistillConfig = DistillConfig(),
            eval_prompts: list[list[int]] = (), checkpoint_dir=None, resume: bool = False,
            progress: Progress | None = None) -> DistillReport:
    """Train `draft` (in place) towards `target` on `data`; returns the loss curve and held-out acceptance."""
    from accelerate import Accelerator

    if not data:
        raise ValueError("no training examples: give prompts the target can continue")
    checkpoint = Path(checkpoint_dir) if checkpoint_dir else None
    saved = latest_checkpoint(checkpoint) if checkpoint else None
    if saved is not None and not resume:
        raise ValueError(f"{checkpoint} holds a checkpoint of another run: resume it, or use another folder")
    target_model, _ = unwrap(target, None)
    draft_model, _ = unwrap(draft, None)
    accelerator = Accelerator(cpu=cpu_only(), gradient_accumulation_steps=config.grad_accum)
    if next(target_model.parameters()).device != accelerator.device:  # an int8 target (CPU) holds meta weights
        target_model.to(accelerator.device)
    target_model.eval()
    optimizer = torch.optim.AdamW([p for p in draft_model.parameters() if p.requires_grad], lr=config.lr)
    report = DistillReport(asdict(config), len(data), sum(len(e.completion_ids) for e in data), 0,
                           data=data_fingerprint(data), processes=accelerator.num_processes)
    if saved is not None:
        report = _resumed(saved, report, draft_model, optimizer)
    trained, optimizer = accelerator.prepare(draft_model, optimizer)
    labeller = TargetLabeller(target_model, config.temperature, config.top_k)
    as_run = functools.partial(four_bit_weights, four_bit_linears(draft_model) if config.four_bit else [])
    start = time.perf_counter()
    if not report.evals:
        with as_run():
            _evaluate(accelerator, target_model, trained, eval_prompts, config, report)
    for step in range(report.steps_done + 1, config.steps + 1):
        trained.train()
        record = _step(accelerator, trained, optimizer, labeller, data, step, config, as_run)
        report.losses.append(record)
        report.steps_done = step
        if config.eval_every and step % config.eval_every == 0 or step == config.steps:
            with as_run():
                _evaluate(accelerator, target_model, trained, eval_prompts, config, report)
        if checkpoint is not None and (step % config.checkpoint_every == 0 or step == config.steps):
            report.wall_time_s = time.perf_counter() - start
            _save_checkpoint(checkpoint, accelerator, trained, optimizer, report)
        if progress is not None:
            progress(step, config.steps, record)
    trained.eval()
    report.wall_time_s = time.perf_counter() - start
    return report


def _step(accelerator, draft, optimizer, labeller, data, step: int, config: DistillConfig, as_run) -> dict:
    """One optimizer step over grad_accum micro-batches; returns the mean loss parts. The forward and backward run
    inside `as_run()` (the weights as the draft will run), the optimizer steps the float weights."""
    sums = {"loss": 0.0, "ce": 0.0, "divergence": 0.0}
    for micro in range(config.grad_accum):
        indices = _batch_indices(len(data), config, step, micro, accelerator)
        batch = make_batch([data[i] for i in indices], accelerator.device)
        with accelerator.accumulate(draft):
            labels, target_argmax = labeller(indices, batch)  # target_argmax [B, L]: the hard labels
            with as_run():
                logits = _loss_position_logits(draft, batch)  # [N, V]: N = loss positions of the batch
                keep = batch.loss_mask
                hard = target_argmax[keep]  # [N]
                parts = distill_loss(logits, _select(labels, keep), hard, torch.ones_like(hard),
                                     temperature=config.temperature, alpha=config.alpha, kind=config.divergence)
                accelerator.backward(parts.total)
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(draft.parameters(), config.max_grad_norm)
            optimizer.step()
            optimizer.zero_grad()
        for name, value in zip(sums, (parts.total, parts.ce, parts.divergence)):
            sums[name] += float(value.detach()) / config.grad_accum
    return {"step": step} | sums


def four_bit_linears(model) -> list[torch.nn.Parameter]:
    """The weights an int4 form of `model` holds in 4-bit groups and that are its own: each Linear of the decoder
    the kernel takes (`quant4.fits_int4`), not the head (the int4 form keeps it apart, and it may be the embedding)."""
    head = model.get_output_embeddings()
    return [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear) and m is not head
            and quant4.fits_int4(*m.weight.shape)]


@contextlib.contextmanager
def four_bit_weights(weights: list[torch.nn.Parameter]):
    """Inside, each of `weights` holds the values of its 4-bit groups (`quant4.four_bit_values`); on leaving, its
    float values again. Gradients taken inside are the 4-bit weights', and an optimizer step after it applies them
    to the float ones: quantization-aware training with a straight-through gradient (Courbariaux et al. 2015;
    Jacob et al. 2018), so that a draft trained so loses less to its 4-bit form."""
    floats = [w.data for w in weights]
    with torch.no_grad():
        for w in weights:
            w.data = quant4.four_bit_values(w.data).to(w.dtype)
    try:
        yield
    finally:
        for w, data in zip(weights, floats):
            w.data = data


def _loss_position_logits(draft, batch: Batch) -> torch.Tensor:
    """Draft logits [N, V] at the N loss positions (row-major order of batch.loss_mask). The LM head
    ([V, H], the largest matmul for a 150k vocabulary) skips the prompt columns via `logits_to_keep`."""
    columns = batch.loss_mask.any(0).nonzero().squeeze(1)  # [K] sequence positions some row needs
    logits = draft(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                   logits_to_keep=columns).logits  # [B, K, V]
    return logits[batch.loss_mask[:, columns]]


def _select(labels: SoftLabels, keep: torch.Tensor) -> SoftLabels:
    """SoftLabels [B, L, ...] -> [N, ...] at the positions where keep [B, L] is true."""
    return SoftLabels(*(None if t is None else t[keep] for t in (labels.log_probs, labels.ids, labels.rest)))


def _batch_indices(n: int, config: DistillConfig, step: int, micro: int, accelerator) -> list[int]:
    """Example indices of one micro-batch: a function of (seed, step, micro) so a resumed run sees the same
    batches; each process of a multi-process launch takes its slice."""
    generator = torch.Generator().manual_seed(config.seed * 1_000_003 + step * 997 + micro)
    chosen = torch.randint(n, (config.batch_size * accelerator.num_processes,), generator=generator).tolist()
    return chosen[accelerator.process_index::accelerator.num_processes]


def _evaluate(accelerator, target_model, trained, prompts, config: DistillConfig, report: DistillReport) -> None:
    if not prompts or not accelerator.is_main_process:
        return
    draft_model = accelerator.unwrap_model(trained).eval()
    result = held_out_acceptance(target_model, draft_model, list(prompts), k=config.eval_k,
                                 max_new_tokens=config.eval_max_new_tokens)
    report.evals.append({"step": report.steps_done} | asdict(result))


def data_fingerprint(data: list[Example]) -> str:
    return hashlib.sha256(json.dumps([asdict(e) for e in data]).encode()).hexdigest()[:16]


# --- checkpoints --------------------------------------------------------------------------------------------
# checkpoint/step-<n>/ holds draft.safetensors, optimizer.pt and trainer_state.json; checkpoint/LATEST names
# the newest complete one. A step folder is written under a partial name, fsynced and renamed; LATEST is
# then replaced atomically; so a kill at any point leaves LATEST naming a whole checkpoint.

STATE_FILE = "trainer_state.json"
LATEST = "LATEST"


def latest_checkpoint(checkpoint: Path) -> Path | None:
    """The newest complete step folder under `checkpoint`, or None."""
    pointer = checkpoint / LATEST
    return checkpoint / pointer.read_text().strip() if pointer.is_file() else None


def _save_checkpoint(checkpoint: Path, accelerator, trained, optimizer, report: DistillReport) -> None:
    """Draft weights (safetensors), optimizer state, and the report so far, swapped in whole."""
    from safetensors.torch import save_model

    if not accelerator.is_main_process:
        return
    name = f"step-{report.steps_done:08d}"
    with files.atomic_path(checkpoint / name) as folder:
        folder.mkdir()
        save_model(accelerator.unwrap_model(trained), str(folder / "draft.safetensors"))
        torch.save(optimizer.state_dict(), folder / "optimizer.pt")
        (folder / STATE_FILE).write_text(json.dumps(report.to_dict()))
        cache.mark_ready(folder)
    files.write_text(checkpoint / LATEST, name)
    for old in checkpoint.iterdir():
        if old.name not in (name, LATEST) and not files.in_progress(old):
            files.remove(old)  # older steps
    cache.clean_stale(checkpoint)  # partials of killed writes (a live writer's stay)


def checkpoint_report(checkpoint: Path) -> DistillReport | None:
    """The report saved with the newest checkpoint under `checkpoint` (no weights read), or None."""
    saved = latest_checkpoint(checkpoint)
    return _saved_report(saved) if saved is not None else None


def _saved_report(step_folder: Path) -> DistillReport:
    return DistillReport(**json.loads((step_folder / STATE_FILE).read_text()))


def resume_conflict(saved: DistillReport, config: dict, data: str) -> str | None:
    """Why a run with `config` (a DistillConfig as a dict) on data of fingerprint `data` cannot continue the
    checkpoint whose report is `saved` (None: it can)."""
    for name in TRAINING_SETTINGS:
        trained = saved.config.get(name, BEFORE_SETTING.get(name))
        if trained != config[name]:
            return f"{name} was {trained!r} there, {config[name]!r} now"
    if saved.data != data:
        return "the training data differ (other prompts, split, limit, continuation length or --on-policy)"
    if saved.steps_done > config["steps"]:
        return f"it has trained {saved.steps_done} steps, more than the {config['steps']} asked"
    return None


def _resumed(saved: Path, fresh: DistillReport, draft_model, optimizer) -> DistillReport:
    """The checkpoint's report (weights and optimizer restored) after checking it belongs to this run."""
    from safetensors.torch import load_model

    report = _saved_report(saved)  # the step folder LATEST named when this run started
    conflict = resume_conflict(report, fresh.config, fresh.data)
    if conflict:
        raise ValueError(f"cannot resume {saved.parent}: {conflict}; use the same settings, or another run folder")
    load_model(draft_model, str(saved / "draft.safetensors"))
    optimizer.load_state_dict(torch.load(saved / "optimizer.pt", weights_only=True))  # tensors and numbers only
    report.config = fresh.config  # this run's settings (steps may have grown)
    return report

