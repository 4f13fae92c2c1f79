"""Speculative decoding and its honest baseline, on one set of cache machinery.

Recipe of `speculative_generate` (Leviathan et al. 2023; Chen et al. 2023):
1. prefill: both models read the prompt except its last token, from empty caches (in chunks, the request's
   `Budget` checked between);
2. each round, the drafter proposes n <= k tokens that continue the context;
3. the target reads the pending context tokens plus the n drafts in ONE forward and returns
   n+1 next-token distributions; greedy with k = "auto" on a row-invariant target, the same forward also reads a
   few leaves, the draft's second choices where they are priced to pay (`SamplingPolicy.leaves`), each a row that
   sees only its own prefix (`specdec.core.kv.tree_layout`);
4. `specdec.core.verify` keeps the accepted prefix and adds one target token (correction or bonus); where the
   correction is a leaf, the leaf's row adds the target's token after it;
5. the caches are rolled back by the rule in `specdec.core.kv` at the next round.
`autoregressive_generate` is the same loop with a drafter that proposes nothing. `speculative_rounds` is the
loop itself, a generator: it yields each round as it ends (the time its consumer holds a round is not counted),
so a page can show them one by one without a thread of its own.
"""
from __future__ import annotations

import time
from dataclasses import replace
from typing import Callable, Generator

import torch

from specdec.core.costmodel import CostModel
from specdec.core.drafter import Drafter, NoDraft, Proposal, SamplingPolicy, as_drafter
from specdec.core.inputs import prepare_prompt, resolve_eos, unwrap
from specdec.core.kv import CachedLM
from specdec.core.limits import K_MAX, LEAVES_MAX, Budget
from specdec.core.schedule import AdaptiveK, FixedK
from specdec.core.timing import clock
from specdec.core.trace import DecodeStats, GenerationResult, Round
from specdec.core.verify import Verdict, verify_greedy, verify_sampling

TOP_KEPT = 2  # target logits kept per verification row (enough to explain a greedy near-tie)
PREFILL_CHUNK = 256  # prompt tokens per prefill forward: a request's deadline is checked between chunks

OnRound = Callable[[Round], "bool | None"]  # return False to stop after this round
Rounds = Generator[Round, "bool | None", GenerationResult]  # yields each round; send(False) stops; returns the result


def speculative_generate(
    target,
    draft,
    input_ids,
    *,
    k: int | str = 4,
    max_new_tokens: int = 128,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int | None = None,
    eos_token_id: int | list[int] | None = None,
    on_round: OnRound | None = None,
    tokenizer=None,
    costs: CostModel | None = None,
    budget: Budget = Budget(),
) -> GenerationResult:
    """Generate with `draft` proposing k tokens per round and `target` verifying them.

    k: draft length per round, 1..K_MAX, or "auto" (chosen each round, 0 allowed, from the measured
    acceptance and the costs: rule in `specdec.core.schedule`).
    costs: the pair's calibrated costs (`specdec.costs.calibration.calibrate`); they price the rounds in the stats
    (predicted speedup, c, v) and steer k="auto". None = Leviathan's assumption, v(n) = 1.

    target: a transformers causal LM (or a `specdec.LoadedModel`); draft: a causal LM sharing the
    target's tokenizer, or any `Drafter`. input_ids: LongTensor [1, T], list[int], or a string when
    a tokenizer is given or attached. Greedy output (temperature 0) is token-identical to the target
    alone; with temperature > 0 the output law is the target's (lossless rejection sampling).
    on_round(round) is called after each round (its time is not counted in the stats); returning
    False stops the generation. budget: the request's prompt-token cap and deadline, checked before and during
    the prefill (a BudgetExceeded); the rounds stop through on_round.
    """
    return run_rounds(speculative_rounds(target, draft, input_ids, k=k, max_new_tokens=max_new_tokens,
                                         temperature=temperature, top_p=top_p, seed=seed, eos_token_id=eos_token_id,
                                         tokenizer=tokenizer, costs=costs, budget=budget), on_round)


def speculative_rounds(
    target,
    draft,
    input_ids,
    *,
    k: int | str = 4,
    max_new_tokens: int = 128,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int | None = None,
    eos_token_id: int | list[int] | None = None,
    tokenizer=None,
    costs: CostModel | None = None,
    budget: Budget = Budget(),
) -> Rounds:
    """`speculative_generate` one round at a time: a generator that yields each Round as it ends and returns the
    GenerationResult (`run_rounds` drives it; StopIteration.value). Sending False stops after the round just
    yielded (result.stopped_early = True); the time from a yield to the next resume is not counted. Bad
    arguments raise here, a bad prompt at the first round.
    """
    schedule = AdaptiveK(costs) if k == "auto" else FixedK(k)
    if k != "auto" and (not isinstance(k, int) or not 1 <= k <= K_MAX):
        raise ValueError(f"k must be an integer in 1..{K_MAX} or 'auto', got {k!r}")
    target_model, tokenizer = unwrap(target, tokenizer)
    drafter = as_drafter(draft, target_model)
    return _generate(target_model, drafter, input_ids, schedule, max_new_tokens, temperature, top_p, seed,
                     eos_token_id, tokenizer, costs, budget)


def autoregressive_generate(
    target,
    input_ids,
    *,
    max_new_tokens: int = 128,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int | None = None,
    eos_token_id: int | list[int] | None = None,
    on_round: OnRound | None = None,
    tokenizer=None,
    budget: Budget = Budget(),
) -> GenerationResult:
    """The target alone, one token per forward, with the same KV cache and sampling code."""
    target_model, tokenizer = unwrap(target, tokenizer)
    return run_rounds(_generate(target_model, NoDraft(), input_ids, FixedK(0), max_new_tokens, temperature, top_p,
                                seed, eos_token_id, tokenizer, None, budget), on_round)


def run_rounds(rounds: Rounds, on_round: OnRound | None = None) -> GenerationResult:
    """Drive `rounds` to its end, calling on_round(round) after each one (False stops); returns the result."""
    try:
        round_ = next(rounds)
        while True:
            round_ = rounds.send(None if on_round is None else on_round(round_))
    except StopIteration as end:
        return end.value


def _generate(target_model, drafter, input_ids, schedule, max_new_tokens, temperature, top_p, seed,
              eos_token_id, tokenizer, costs, budget) -> Rounds:
    prompt = prepare_prompt(input_ids, target_model, tokenizer, max_new_tokens, schedule.k_max)
    budget.check_prompt(len(prompt))
    policy = _policy(target_model, temperature, top_p, seed, schedule.go_on_above,
                     resolve_eos(target_model, eos_token_id))
    verifier = CachedLM(target_model)
    drafter.reset()  # a drafter reused from an earlier request starts empty, as the verifier does
    start = clock(verifier.device)
    draft_prefill_time = _prefill(drafter, prompt, budget)
    prefill_time = draft_prefill_time + _prefill(verifier, prompt, budget)
    emitted: list[int] = []
    rounds: list[Round] = []
    stopped_early = False
    callback_s = 0.0  # time the consumer held a round (on_round, page rendering): never part of the measurement
    while len(emitted) < max_new_tokens and not (emitted and emitted[-1] in policy.ends):
        room = max_new_tokens - len(emitted) - 1  # leave room for the target's token
        n, most = min(schedule.next_k(), room), min(schedule.k_max, room)  # asked, and the most a sure draft goes on to
        copied = _copy(drafter, schedule, prompt + emitted, most, policy, n) if n <= 1 else None
        priced = policy.capped(most, schedule.round_times(most),  # the most a sure draft goes on to, each token priced
                               schedule.row_times(most + 1 + LEAVES_MAX) if verifier.takes_leaves else ())
        round_ = _round(verifier, drafter, prompt + emitted, n, priced, copied)
        schedule.observe(round_)
        rounds.append(round_)
        emitted.extend(round_.emitted_token_ids)
        paused = time.perf_counter()
        stopped_early = (yield round_) is False
        callback_s += time.perf_counter() - paused
        if stopped_early:
            break
    stats = DecodeStats.from_rounds(
        rounds, schedule.reported_k(rounds), costs, prefill_time_s=prefill_time,
        draft_prefill_time_s=draft_prefill_time,
        wall_time_s=clock(verifier.device) - start - callback_s, target_forwards=verifier.forwards,
        draft_forwards=drafter.forwards)
    text = tokenizer.decode(emitted, skip_special_tokens=True) if tokenizer is not None else None
    return GenerationResult(emitted, rounds, stats, text, stopped_early)


def _prefill(reader, prompt: list[int], budget: Budget) -> float:
    """`reader.prefill(prompt)` PREFILL_CHUNK tokens at a time, the budget checked before each chunk: each call
    reads one more chunk of the prompt, the prefix already cached is kept (`specdec.core.kv`). Returns seconds."""
    seconds = 0.0
    for end in [*range(1 + PREFILL_CHUNK, len(prompt), PREFILL_CHUNK), len(prompt)]:
        budget.check("reading the prompt")
        seconds += reader.prefill(prompt[:end])
    return seconds


def _copy(drafter: Drafter, schedule, context: list[int], most: int, policy: SamplingPolicy,
          n: int) -> Proposal | None:
    """A free copy of at most `most` tokens for a round the schedule gave n <= 1 drafts: the drafter's copy (a
    hybrid's prompt lookup, no model forward), as long as the schedule prices it above the round it chose (`copy_k`);
    None where there is none."""
    copy = getattr(drafter, "copy", None)
    if copy is None or most <= 0 or not schedule.copy_k(most, n):
        return None  # no copy the schedule could take (none shorter either): none made, none remembered
    proposal = copy(context, most, policy)
    k = schedule.copy_k(len(proposal.token_ids), n)
    return replace(proposal, token_ids=proposal.token_ids[:k]) if k else None


def _round(verifier: CachedLM, drafter: Drafter, context: list[int], n: int,
           policy: SamplingPolicy, copied: Proposal | None = None) -> Round:
    start = clock(verifier.device)
    if copied is not None:
        proposal, n = copied, len(copied.token_ids)
    else:
        proposal = drafter.propose(context, n, policy) if n > 0 else Proposal([], None)
    drafts = proposal.token_ids
    positions, leaves = _leaves(proposal, policy)
    pending = verifier.pending(context)
    # all_logits: [len(drafts)+1+len(leaves), V], row i < len(drafts)+1 = next-token logits after context + drafts[:i];
    # then leaf l's: after context + drafts[:positions[l]] + [leaves[l]]
    all_logits, target_time = verifier.forward(pending + drafts, logits_to_keep=len(drafts) + 1,
                                               leaves=[(leaf, len(pending) + position - 1)
                                                       for position, leaf in zip(positions, leaves)])
    target_logits = all_logits[:len(drafts) + 1]
    # p_target: [len(drafts)+1, V]; greedy [len(drafts), V]: only the drafted tokens' probabilities are read
    p_target = policy.probs(target_logits[:len(drafts)] if policy.greedy else target_logits)
    p_draft = proposal.draft_distributions(policy.vocab_size)  # [len(drafts), V]
    verdict = _verify(drafts, target_logits, p_draft, p_target, policy)
    passed = _passed_leaf(verdict, positions, leaves)  # the leaf that passed, or None
    kept = target_logits if passed is None else all_logits[[*range(len(drafts) + 1), len(drafts) + 1 + passed]]
    top_ids, top_logits = _top(kept)  # [n+1, 2] each, then the passed leaf's row
    after = [] if passed is None else [top_ids[-1][0]]  # the target's token after the leaf: its row's argmax
    emitted = policy.up_to_end(drafts[:verdict.num_accepted] + [verdict.target_token_id] + after)  # as `generate`
    rows = torch.arange(len(drafts))
    ids = torch.tensor(drafts, dtype=torch.long)
    return Round(
        draft_token_ids=drafts,
        draft_probs=proposal.token_probs(),
        target_probs=p_target[rows, ids].tolist(),
        matches=verdict.matches,
        num_accepted=verdict.num_accepted,
        target_token_id=verdict.target_token_id,
        emitted_token_ids=emitted,
        draft_time_s=proposal.time_s,
        target_time_s=target_time,
        draft_forwards=proposal.forwards,
        k=n,
        target_top_ids=top_ids,
        target_top_logits=top_logits,
        draft_source=proposal.source if drafts else "",
        uniforms=list(verdict.uniforms),
        wall_time_s=clock(verifier.device) - start,
        leaf_positions=positions,
        leaf_token_ids=leaves,
        leaf_passed=len(emitted) > verdict.num_accepted + 1,  # (a leaf that ends the output adds nothing after it)
    )


def _leaves(proposal: Proposal, policy: SamplingPolicy) -> tuple[list[int], list[int]]:
    """(draft positions, second choices) of the leaves a greedy round verifies beside its drafts: where the draft's
    second choice is priced to pay (`SamplingPolicy.leaves`; none without prices or without the draft's
    distributions). A second choice has at most 1 - q of the draft's probability: only the positions where that
    much would pay are looked up (a max over the vocabulary each)."""
    if not policy.row_times or proposal.p_draft is None or not proposal.token_ids:
        return [], []
    confidences = proposal.token_probs()
    looked = policy.leaves(confidences, [1.0 - q for q in confidences])
    if not looked:
        return [], []
    top_ids, top_probs = _top(proposal.p_draft[looked])  # [looked, 2] each: the draft's first and second choices
    seconds = dict(zip(looked, (second for _, second in top_probs)))
    positions = policy.leaves(confidences, [seconds.get(i, 0.0) for i in range(len(confidences))])
    return positions, [top_ids[looked.index(position)][1] for position in positions]


def _passed_leaf(verdict: Verdict, positions: list[int], leaves: list[int]) -> int | None:
    """The index of the leaf that passed, or None: a leaf passes where the round's first miss is at its position and
    the target's token there is the leaf."""
    return next((index for index, (position, leaf) in enumerate(zip(positions, leaves))
                 if position == verdict.num_accepted and leaf == verdict.target_token_id), None)


def _top(logits: torch.Tensor) -> tuple[list[list[int]], list[list[float]]]:
    """The ids and logits of each row's TOP_KEPT largest logits [rows, V], largest first: a row's max, then its max
    with the ones found masked (a max over a 152k row is 3x sooner than topk here); `logits` is left as it was."""
    rows, found = torch.arange(logits.shape[0]), []
    with torch.inference_mode():  # the logits come from an inference-mode forward: written in place only there
        for _ in range(min(TOP_KEPT, logits.shape[-1])):
            best = logits.max(dim=-1)
            found.append(best)
            logits[rows, best.indices] = float("-inf")
        for best in reversed(found):  # the first found last: a later max can land on a masked place (all -inf)
            logits[rows, best.indices] = best.values
    ids, values = (torch.stack([getattr(b, name) for b in found], dim=-1).tolist() for name in ("indices", "values"))
    return ids, values


def _verify(drafts, target_logits, p_draft, p_target, policy: SamplingPolicy) -> Verdict:
    if policy.greedy:
        return verify_greedy(drafts, target_logits)
    return verify_sampling(drafts, p_draft, p_target, policy.generator)


def _policy(target_model, temperature: float, top_p: float, seed: int | None, go_on_above: float,
            eos: set[int]) -> SamplingPolicy:
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    generator = torch.Generator()
    generator.manual_seed(seed if seed is not None else int(torch.randint(2**62, (1,))))
    vocab_size = target_model.get_output_embeddings().weight.shape[0]
    return SamplingPolicy(temperature, top_p, generator, vocab_size, go_on_above, ends=frozenset(eos))
