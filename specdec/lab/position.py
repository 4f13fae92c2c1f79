"""One drafted position of one round, with the numbers of its verification rule.

The engine keeps only the drafted token's probabilities per round (`Round.draft_probs`,
`Round.target_probs`), so `position_view` recomputes both distributions at that position for the bars: the
target and the drafter read the context up to it (prompt + earlier rounds' output + the round's
earlier drafts) under the run's temperature and top-p. The rule's numbers (the drafted token's two
probabilities and their ratio) are the engine's own: a draft whose rows are coupled (int8-dynamic) reads the
context in other chunks here than in the run, so its recomputed probabilities can differ in the last digits.
Then, following Leviathan et al. 2023 (Alg. 1) and Chen et al. 2023 (`specdec.core.verify`):

- sampling: the drafted token x is kept iff u < min(1, p_target(x) / p_draft(x)), u the round's
  uniform draw (`Round.uniforms`); on rejection the correction is drawn from the residual
  norm(max(0, p_target - p_draft));
- greedy: x is kept iff it is the target's argmax; probabilities do not decide, the ranking does.

Position n+1 (after the round's n drafts) is the target's own token: a bonus when all n were kept.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec.core.drafter import SamplingPolicy, as_drafter
from specdec.core.inputs import prepare_prompt, unwrap, vocab_size
from specdec.core.trace import GenerationResult
from specdec.core.verify import acceptance_probability, residual_distribution

TOP_TOKENS = 8  # tokens shown in the bars: the union of both models' most likely, capped


@dataclass
class PositionView:
    """What decided one position (probabilities over the target's vocabulary)."""

    round_index: int  # 1-based round
    position: int  # 1-based: 1..n a drafted token, n+1 the target's own token
    greedy: bool  # greedy (argmax rule) or sampling (rejection rule)
    outcome: str  # "accepted", "rejected", "unreached" (after a rejection) or "bonus"
    drafted_token: int | None  # the draft's token here (None at position n+1)
    token_ids: list[int]  # the tokens shown (most likely under either model first)
    p_target: list[float]  # p_target of each shown token
    p_draft: list[float]  # p_draft of each shown token (zeros at position n+1)
    residual: list[float]  # norm(max(0, p_target - p_draft)) of each shown token (sampling and rejected only)
    target_argmax: int  # the target's most likely token here
    p_draft_token: float | None  # p_draft(x) of the drafted token, as the engine computed it (Round.draft_probs)
    p_target_token: float | None  # p_target(x) of the drafted token, as the engine computed it
    acceptance: float | None  # min(1, p_target(x)/p_draft(x)) (sampling)
    uniform: float | None  # the round's uniform draw here (sampling; None when the run did not keep it)
    target_token: int | None  # the target's token emitted here (correction or bonus), else None
    kept: bool  # whether the drafted token stayed in the output


def round_context(result: GenerationResult, prompt_ids: list[int], round_index: int) -> list[int]:
    """Token ids the target had read before round `round_index` (1-based): prompt + earlier rounds' output."""
    context = list(prompt_ids)
    for r in result.rounds[:round_index - 1]:
        context.extend(r.emitted_token_ids)
    return context


def position_view(target, draft, prompt, result: GenerationResult, round_index: int, position: int, *,
                  temperature: float = 0.0, top_p: float = 1.0, top: int = TOP_TOKENS,
                  tokenizer=None) -> PositionView:
    """Recompute p_draft and p_target at `position` (1-based) of round `round_index` of `result`.

    target/draft/prompt as given to `speculative_generate` for `result` (same temperature and top_p).
    """
    if not 1 <= round_index <= len(result.rounds):
        raise ValueError(f"round must be in 1..{len(result.rounds)}, got {round_index}")
    r = result.rounds[round_index - 1]
    n = len(r.draft_token_ids)
    if not 1 <= position <= n + 1:
        raise ValueError(f"round {round_index} drafted {n} tokens: position must be in 1..{n + 1}, got {position}")
    target_model, tokenizer = unwrap(target, tokenizer)
    prompt_ids = prepare_prompt(prompt, target_model, tokenizer, 1, 0)
    context = round_context(result, prompt_ids, round_index) + r.draft_token_ids[:position - 1]
    policy = SamplingPolicy(temperature, top_p, torch.Generator().manual_seed(0), vocab_size(target_model))
    with torch.no_grad():  # logits of the one row shown, not of every context position
        logits = target_model(torch.tensor([context]), logits_to_keep=1).logits[0, -1].float()  # [V]
    p_target = policy.probs(logits)  # [V]
    drafted = r.draft_token_ids[position - 1] if position <= n else None
    p_draft = _draft_distribution(draft, target_model, context, policy) if drafted is not None \
        else torch.zeros_like(p_target)  # [V]
    outcome = ("bonus" if r.is_bonus else "unreached") if drafted is None else \
        "accepted" if position <= r.num_accepted else "rejected" if position == r.num_accepted + 1 else "unreached"
    sampling = not policy.greedy
    residual = residual_distribution(p_target, p_draft) if sampling and outcome == "rejected" \
        else torch.zeros_like(p_target)
    shown = _top_ids(p_target, p_draft, top, [t for t in (drafted, r.target_token_id) if t is not None])
    p_draft_token = p_target_token = acceptance = None
    if drafted is not None:  # the rule's numbers are the engine's own (a recomputation may differ in the last bits)
        p_draft_token, p_target_token = r.draft_probs[position - 1], r.target_probs[position - 1]
        if sampling:
            acceptance = float(acceptance_probability(torch.tensor(p_target_token), torch.tensor(p_draft_token)))
    emits_target = outcome == "bonus" or outcome == "rejected"
    return PositionView(
        round_index=round_index, position=position, greedy=policy.greedy, outcome=outcome, drafted_token=drafted,
        token_ids=shown, p_target=p_target[shown].tolist(), p_draft=p_draft[shown].tolist(),
        residual=residual[shown].tolist(), target_argmax=int(logits.argmax()),
        p_draft_token=p_draft_token, p_target_token=p_target_token, acceptance=acceptance,
        uniform=r.uniforms[position - 1] if sampling and drafted is not None and position <= len(r.uniforms) else None,
        target_token=r.target_token_id if emits_target else None,
        kept=outcome == "accepted")


def _draft_distribution(draft, target_model, context: list[int], policy: SamplingPolicy) -> torch.Tensor:
    """p_draft [V_target] of the drafter's next token after `context` (a point mass for a model-free drafter).

    The drafter derives its state from the context it is given (`specdec.core.kv`), so asking it again is safe.
    """
    drafter = as_drafter(draft, target_model)
    drafter.prefill(context)
    proposal = drafter.propose(context, 1, policy)
    if not proposal.token_ids:
        return torch.zeros(policy.vocab_size)
    return proposal.draft_distributions(policy.vocab_size)[0]


def _top_ids(p_target: torch.Tensor, p_draft: torch.Tensor, top: int, must: list[int]) -> list[int]:
    """The tokens to show: `must` first, then the most likely under either model, `top` at most."""
    ranked = torch.maximum(p_target, p_draft).argsort(descending=True).tolist()
    shown = list(dict.fromkeys(must))
    for token in ranked:
        if len(shown) >= max(top, len(must)):
            break
        if token not in shown:
            shown.append(token)
    return shown
