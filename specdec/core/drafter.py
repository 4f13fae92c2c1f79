"""Drafters: anything that proposes tokens for the target to verify.

The interface (a `typing.Protocol`, no base class needed) is three methods and what callers read:

- `reset()`: forget earlier generations (the engine calls it first, so every generation is timed as a fresh
  request: a drafter reused across requests never reads a prompt's prefix for free, nor counts old forwards);
- `prefill(prompt_ids)`: read the prompt ahead of the first round (may do nothing);
- `propose(context_ids, n, policy) -> Proposal`: up to n tokens that continue `context_ids` (a model draft may end
  sooner where one more is priced not to pay, or go on to `policy.most` when sure: `SamplingPolicy.goes_on`);
- `forwards`: draft model forwards so far, prefill included (0 for a model-free drafter; the stats count them);
- `model`: the causal LM it drafts with, or None (the calibration times it, the bench fingerprints it);
- `cost_key`: its kind and the settings its cost depends on (with its model's identity, the calibration's
  cache key for c).

A drafter derives its own state from the context it is given (see `specdec.core.kv` for the
rollback rule of model drafters), so the engine never tells it what was accepted.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Protocol, runtime_checkable

import torch

from specdec.core.inputs import check_vocabularies, unwrap
from specdec.core.kv import CachedLM
from specdec.core.limits import LEAVES_MAX
from specdec.core.verify import logits_to_probs


@dataclass
class SamplingPolicy:
    """How tokens are chosen, applied identically to draft and target (and where a greedy draft stops early)."""

    temperature: float  # 0 = greedy (top-1); > 0 = sampling with lossless verification
    top_p: float  # nucleus mass kept, 1.0 = off (ignored when greedy)
    generator: torch.Generator  # the one RNG of a generation (seeded => reproducible)
    vocab_size: int  # the target's vocabulary size: every distribution lives over it
    go_on_above: float = math.inf  # greedy: past the n asked, a model draft goes on while its tokens get more ...
    most: int = 0  # ... up to this many tokens in all (the engine sets it each round; 0 = n, never past it)
    ends: frozenset[int] = frozenset()  # the target's end-of-sequence ids: a draft proposes nothing after one
    round_times: tuple[float, ...] = ()  # greedy: predicted seconds of a round of j drafts, j = 0.. (k="auto" sets
    # it each round): a model draft ends where one more token is priced to lower the round's tokens per second (`pays`)
    before: tuple[float, ...] = ()  # the confidences of this round's tokens drafted before (a proposal made in parts)
    row_times: tuple[float, ...] = ()  # greedy: predicted seconds of a verification of n rows, n = 0.. (k="auto" on
    # a target that verifies leaves sets it each round): a draft's second choice is verified where it pays (`leaves`)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """[..., V] logits -> [..., V] probabilities (softmax at T=1 when greedy, for the trace)."""
        return logits_to_probs(logits, self.temperature, 1.0 if self.greedy else self.top_p)

    def pays(self, confidences: list[float]) -> bool:
        """Whether a greedy draft that gave this round's tokens so far `confidences` (its probability of each,
        `before` first) is predicted to raise the round's tokens per second by drafting one more:
        (E_j + P_j·q_j) / round_times[j + 1] against E_j / round_times[j], where P_i = q_1···q_i is the chance that
        the first i pass, E_j = 1 + P_1 + ... + P_j the tokens a round of j drafts yields, and the last token's
        confidence q_j stands for the next one's. Always without prices (a fixed k, sampling)."""
        if not self.round_times or not self.greedy:
            return True
        confidences = [*self.before, *confidences]
        drafted = len(confidences)
        if drafted + 1 >= len(self.round_times):
            return False
        passes = expected = 1.0
        for confidence in confidences:
            passes *= confidence
            expected += passes
        now, next_ = self.round_times[drafted], self.round_times[drafted + 1]
        return (expected + passes * confidences[-1]) * now > expected * next_

    def leaves(self, confidences: list[float], seconds: list[float]) -> list[int]:
        """The draft positions whose second choice a greedy round verifies too, as a leaf row each (at most
        LEAVES_MAX, in order): the one adding most tokens first, while it is predicted to raise the round's tokens
        per second, (E + g) / (time + row) against E / time. A round of j drafts with confidences q_i yields
        E = 1 + P_1 + ... + P_j tokens (P_i = q_1···q_i) in round_times[j]; a leaf at position i adds
        g = P_(i-1)·s_i tokens (the chain reaches i, and the target takes the second choice there, given the
        draft's probability s_i of it: `seconds`) and costs one more verification row (`row_times`)."""
        drafted = len(confidences)
        if not self.greedy or not drafted or drafted >= len(self.round_times):
            return []
        passes, expected, gains = 1.0, 1.0, []
        for position, (confidence, second) in enumerate(zip(confidences, seconds)):
            gains.append((passes * second, position))
            passes *= confidence
            expected += passes
        time, chosen = self.round_times[drafted], []
        for gain, position in sorted(gains, reverse=True)[:LEAVES_MAX]:
            rows = drafted + 1 + len(chosen)
            if rows + 1 >= len(self.row_times):
                break
            row = self.row_times[rows + 1] - self.row_times[rows]
            if gain * time <= expected * row:
                break
            chosen.append(position)
            expected, time = expected + gain, time + row
        return sorted(chosen)

    def goes_on(self, tokens: list[int], n: int, confidences: list[float]) -> bool:
        """Whether a model draft asked for n tokens drafts another after `tokens`, to which it gave `confidences`:
        never after an end of sequence (the output ends there if it passes, so no later token is ever emitted); up
        to n while another `pays`; past n (greedy) only while each is surer than go_on_above and another pays, up to
        `most`."""
        drafted = len(tokens)
        if tokens[-1] in self.ends:
            return False
        if drafted < n:
            return self.pays(confidences)
        return self.greedy and drafted < self.most and confidences[-1] > self.go_on_above and self.pays(confidences)

    def up_to_end(self, tokens: list[int]) -> list[int]:
        """`tokens` up to and including the first end of sequence: the part of a copy that could be emitted."""
        end = next((i + 1 for i, t in enumerate(tokens) if t in self.ends), len(tokens))
        return tokens[:end]

    def capped(self, most: int, round_times: tuple[float, ...] | None = None,
               row_times: tuple[float, ...] | None = None) -> "SamplingPolicy":
        """This policy for a round whose draft may go on (when sure) up to `most` tokens, priced by `round_times`
        and `row_times` (None: as they are)."""
        return replace(self, most=most, round_times=self.round_times if round_times is None else round_times,
                       row_times=self.row_times if row_times is None else row_times)

    def after(self, confidences: list[float]) -> "SamplingPolicy":
        """This policy for the rest of a round whose draft already gave tokens these `confidences`."""
        return replace(self, before=(*self.before, *confidences))

    def choose(self, logits: torch.Tensor, probs: torch.Tensor) -> int:
        """Pick one token from [V] logits/probs: argmax when greedy, else a draw from probs."""
        if self.greedy:
            return int(logits.max(dim=-1).indices)  # argmax's first-index rule; a 152k row's max is 3x sooner here
        return int(torch.multinomial(probs, 1, generator=self.generator))


@dataclass
class Proposal:
    """Tokens proposed for one round."""

    token_ids: list[int]  # proposed tokens, len <= n
    p_draft: torch.Tensor | None  # [len, V_target] distribution each token was drawn from; None = point masses
    time_s: float = 0.0  # wall time spent proposing
    forwards: int = 0  # model forwards spent proposing
    source: str = "model"  # which kind of drafter proposed: "model" or "lookup"

    def draft_distributions(self, vocab_size: int) -> torch.Tensor:
        """p_draft as [len, V_target]; a drafter without probabilities counts as a point mass."""
        if self.p_draft is not None:
            return self.p_draft
        one_hot = torch.zeros(len(self.token_ids), vocab_size)
        one_hot[torch.arange(len(self.token_ids)), torch.tensor(self.token_ids, dtype=torch.long)] = 1.0
        return one_hot

    def token_probs(self) -> list[float]:
        """The probability each token was drawn with (its draft's confidence): p_draft at the token, 1.0 for a point
        mass (a drafter without probabilities)."""
        if self.p_draft is None:
            return [1.0] * len(self.token_ids)
        return self.p_draft[torch.arange(len(self.token_ids)), torch.tensor(self.token_ids, dtype=torch.long)].tolist()


@runtime_checkable
class Drafter(Protocol):
    forwards: int  # draft model forwards so far, prefill included (0 for a model-free drafter)
    model: torch.nn.Module | None  # the causal LM it drafts with; None for a model-free drafter
    cost_key: str  # its kind and the settings its cost depends on (not its model: the calibration adds that)

    def reset(self) -> None: ...

    def prefill(self, prompt_ids: list[int]) -> float: ...

    def propose(self, context_ids: list[int], n: int, policy: SamplingPolicy) -> Proposal: ...


class NoDraft:
    """Proposes nothing: every round is one plain target step (the target-alone baseline)."""

    forwards = 0
    model = None
    cost_key = "none"

    def reset(self) -> None:
        pass

    def prefill(self, prompt_ids: list[int]) -> float:
        return 0.0

    def propose(self, context_ids: list[int], n: int, policy: SamplingPolicy) -> Proposal:
        return Proposal([], None)


def to_target_vocab(logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Draft logits [..., V_draft] -> [..., V_target] over the shared ids.

    Ids the target does not have are dropped; ids only the target has get -inf, so a draft
    never proposes an id outside the shared vocabulary (Qwen pads 151936 vs 152064 rows).
    """
    v_draft = logits.shape[-1]
    if v_draft >= vocab_size:
        return logits[..., :vocab_size]
    pad = logits.new_full((*logits.shape[:-1], vocab_size - v_draft), float("-inf"))
    return torch.cat([logits, pad], dim=-1)


class ModelDrafter:
    """A smaller causal LM with its own KV cache that drafts autoregressively."""

    def __init__(self, model: torch.nn.Module):
        self.lm = CachedLM(model)

    @property
    def forwards(self) -> int:
        return self.lm.forwards

    @property
    def model(self) -> torch.nn.Module:
        return self.lm.model

    @property
    def cost_key(self) -> str:
        return type(self).__name__

    @property
    def tokens_fed(self) -> int:
        return self.lm.tokens_fed

    def reset(self) -> None:
        self.lm.reset()

    def prefill(self, prompt_ids: list[int]) -> float:
        return self.lm.prefill(prompt_ids)

    def propose(self, context_ids: list[int], n: int, policy: SamplingPolicy) -> Proposal:
        tokens, rows, confidences, ids, elapsed = [], [], [], None, 0.0
        feed = self.lm.pending(context_ids)
        for _ in range(max(n, policy.most)):
            logits, seconds = self.lm.forward(feed)
            elapsed += seconds
            candidates, ids = self.candidates(logits[-1], policy)  # [C] logits, the target id of each (None: C = V)
            probs = policy.probs(candidates)  # [C]
            index = policy.choose(candidates, probs)
            tokens.append(index if ids is None else int(ids[index]))
            rows.append(probs)
            confidences.append(float(probs[index]))
            feed = tokens[-1:]
            if not policy.goes_on(tokens, n, confidences):
                break  # n drafted, an end of sequence, or one more token priced not to pay
        p_draft = over_target_vocab(torch.stack(rows), ids, policy.vocab_size) if rows else None  # [len, V_target]
        return Proposal(tokens, p_draft, elapsed, len(tokens))

    def candidates(self, logits: torch.Tensor, policy: SamplingPolicy) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The logits the next token is chosen from and the target id of each (None: they are the target's whole
        vocabulary in order): the draft's [V_draft] logits over the shared ids (`to_target_vocab`)."""
        return to_target_vocab(logits, policy.vocab_size), None


def over_target_vocab(probs: torch.Tensor, ids: torch.Tensor | None, vocab_size: int) -> torch.Tensor:
    """[len, C] probabilities over candidates with target ids `ids` [C] -> [len, V_target], 0 elsewhere (None: as
    they are)."""
    if ids is None:
        return probs
    spread = probs.new_zeros(probs.shape[0], vocab_size)
    spread[:, ids] = probs
    return spread


def as_drafter(draft, target_model) -> Drafter:
    """A Drafter as is; a causal LM (or LoadedModel) becomes a ModelDrafter after a vocabulary check."""
    if isinstance(draft, Drafter):
        return draft
    draft_model, _ = unwrap(draft, None)
    if not isinstance(draft_model, torch.nn.Module):
        raise ValueError(f"draft must be a causal LM or a Drafter, got {type(draft).__name__}")
    check_vocabularies(target_model, draft_model)
    return ModelDrafter(draft_model)
