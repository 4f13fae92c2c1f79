"""Writes the teaching notebooks and executes them (run `python notebooks/build.py` after editing a cell here).

Each notebook runs on tiny in-code models in seconds. They are committed WITH their outputs, so they read on
the web; every printed number is deterministic (seeded models, one thread, no timings) except in cells tagged
"timings", whose numbers vary run to run. tests/test_notebooks.py regenerates the cells, executes them and
checks that the outputs match the committed ones.
"""
from __future__ import annotations

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TIMINGS = "timings"  # tag of a cell whose printed numbers depend on wall time (not compared on re-execution)

SETUP = """\
import torch
from specdec.testing import tiny_model, tiny_bpe_tokenizer, perturbed_copy
torch.set_num_threads(1)  # tiny models: threads only add overhead
tokenizer = tiny_bpe_tokenizer()  # a BPE tokenizer trained in code (ids 0/1/2 = <pad>/<s>/</s>)
target = tiny_model("llama", seed=0, vocab_size=len(tokenizer))  # a random 2-layer "big" model
draft = perturbed_copy(target, noise=0.3)  # a noisy copy of it: agrees often, not always"""

ONE_ROUND = [
    new_markdown_cell("""\
# One round of speculative decoding, by hand

Take a classic pair, Qwen1.5 0.5B as draft and 1.8B as target, and k=3:
the draft proposes 3 tokens, the target reads them all in **one** forward, the tokens are kept
while they equal the target's own top-1 choice, and the target's token replaces the first
mismatch (or is a free *bonus* token when all 3 match). Here we do exactly that with tiny
random models (so the text is gibberish, but every number is real), then check that
`specdec.speculative_generate` makes the same round."""),
    new_code_cell(SETUP),
    new_code_cell("""\
prompt = tokenizer("def price(option, curve):\\n    return")["input_ids"]
k = 3
print("prompt ids:", prompt)"""),
    new_markdown_cell("""\
## Step 1 — the draft proposes k tokens, one forward each (greedy top-1)"""),
    new_code_cell("""\
context = list(prompt)
draft_tokens, draft_probs = [], []
with torch.no_grad():
    for _ in range(k):
        logits = draft(torch.tensor([context + draft_tokens])).logits[0, -1]  # [V]
        token = int(logits.argmax())
        draft_tokens.append(token)
        draft_probs.append(float(torch.softmax(logits, -1)[token]))
print("Draft candidate tokens:", draft_tokens, repr(tokenizer.decode(draft_tokens)))
print("p_draft of each:", [round(p, 3) for p in draft_probs])"""),
    new_markdown_cell("""\
## Step 2 — the target verifies all k in ONE forward

Row i of the target's logits (over `context + drafts`) predicts the token after draft i-1, so
the last k+1 rows give the target's choice at every drafted position plus one more."""),
    new_code_cell("""\
with torch.no_grad():
    target_logits = target(torch.tensor([context + draft_tokens])).logits[0, -(k + 1):]  # [k+1, V]
target_choice = target_logits.argmax(-1).tolist()  # [k+1]
matches = [d == t for d, t in zip(draft_tokens, target_choice)]
print("Match flags per position:", matches)
print("Target top-1 tokens:    ", target_choice[:k], "(+ one more:", target_choice[k], ")")"""),
    new_markdown_cell("""\
## Step 3 — keep the matching prefix, add the target's token"""),
    new_code_cell("""\
accepted = next((i for i, m in enumerate(matches) if not m), k)
target_token = target_choice[accepted]  # correction at the first mismatch, or the bonus token
emitted = draft_tokens[:accepted] + [target_token]
kind = "bonus (all k accepted)" if accepted == k else f"correction at position {accepted + 1}"
print(f"accepted {accepted} of {k}; target token {target_token} {tokenizer.decode([target_token])!r}: {kind}")
print("emitted this round:", emitted, repr(tokenizer.decode(emitted)))
print("one target forward produced", len(emitted), "tokens (the target alone would need", len(emitted), "forwards)")"""),
    new_markdown_cell("""\
## The engine makes the same round

`speculative_generate` does the same with KV caches; `on_round` returning False stops after one round."""),
    new_code_cell("""\
from specdec import speculative_generate
one = speculative_generate(target, draft, prompt, k=k, max_new_tokens=32, on_round=lambda r: False)
r = one.rounds[0]
print("engine:", r.draft_token_ids, r.matches, r.num_accepted, r.target_token_id)
assert r.draft_token_ids == draft_tokens and r.matches == matches
assert r.num_accepted == accepted and r.target_token_id == target_token and r.emitted_token_ids == emitted
print("identical to the round by hand")"""),
    new_markdown_cell("""\
## Ten rounds, as the round table

Columns: match flags, accepted count, the target's token (correction or bonus), the tokens the
round produced, the output so far. And the check that makes it all worth it: greedy speculative
output is token-for-token the target's own greedy output."""),
    new_code_cell("""\
from specdec import autoregressive_generate
from specdec.lab.report import format_stats, format_table, round_rows
result = speculative_generate(target, draft, prompt, k=k, max_new_tokens=30)
print(format_table(round_rows(result, tokenizer)[:10]))
print()
# the counting metrics (the timed ones, c, v and tokens/s, vary run to run: see notebook 03)
for line in format_stats(result.stats).splitlines():
    if line.split(" ")[0] in ("acceptance", "draft", "mean", "rounds", "tokens"):
        print(line)
alone = autoregressive_generate(target, prompt, max_new_tokens=30)
assert result.token_ids == alone.token_ids
print("\\nsame tokens as the target alone:", result.token_ids == alone.token_ids)"""),
    new_markdown_cell("""\
Mean accepted length counts the target's own token (1 + accepted / rounds); "accepted draft tokens per
round" (0..k) does not. Every metric is defined once from a run's counts in `specdec/core/trace.py` (the table: docs/metrics.md).

**Next:** [02 — why rejection sampling is lossless](02_lossless_rejection_sampling.ipynb)"""),
]

LOSSLESS = [
    new_markdown_cell("""\
# Why rejection sampling is lossless — checked empirically

With sampling (temperature > 0) the draft proposes x ~ p_draft. Leviathan et al. 2023 (Alg. 1)
and Chen et al. 2023 accept x with probability min(1, p_target(x) / p_draft(x)); on rejection
they sample from the residual norm(max(0, p_target − p_draft)). Then the emitted token is
distributed **exactly** as p_target:

P(emit y) = p_draft(y)·min(1, p_target(y)/p_draft(y)) + P(reject)·residual(y)
          = min(p_draft(y), p_target(y)) + (1 − Σ_x min(p_draft(x), p_target(x)))·residual(y) = p_target(y),

because 1 − Σ min(p_draft, p_target) = Σ max(0, p_target − p_draft), the residual's normaliser.
The acceptance probability is β = Σ_x min(p_draft(x), p_target(x)) = 1 − TV(p_draft, p_target).
Below we draw many times with specdec's own functions (`specdec.core.verify`) and compare."""),
    new_code_cell("""\
import torch
from specdec.core.verify import acceptance_probability, residual_distribution, verify_sampling
p_target = torch.tensor([0.05, 0.40, 0.25, 0.20, 0.10])  # the law we must reproduce
p_draft = torch.tensor([0.30, 0.30, 0.05, 0.05, 0.30])  # a draft that is quite wrong
print("acceptance probability per token, min(1, p_target/p_draft):", acceptance_probability(p_target, p_draft))
print("residual norm(max(0, p_target - p_draft)):", residual_distribution(p_target, p_draft))
beta = torch.minimum(p_target, p_draft).sum()
print(f"expected acceptance β = Σ min = {beta:.3f} = 1 - TV")"""),
    new_markdown_cell("""\
## One drafted position, many draws

Draw x ~ p_draft, accept with `acceptance_probability`, otherwise draw from `residual_distribution`
(vectorised over 200 000 trials), then the same through `verify_sampling` itself, one round at a time."""),
    new_code_cell("""\
generator = torch.Generator().manual_seed(0)
trials = 200_000
x = torch.multinomial(p_draft, trials, replacement=True, generator=generator)  # [trials]
keep = torch.rand(trials, generator=generator) < acceptance_probability(p_target, p_draft)[x]
residual_draws = torch.multinomial(residual_distribution(p_target, p_draft), trials, replacement=True,
                                   generator=generator)
emitted = torch.where(keep, x, residual_draws)
empirical = torch.bincount(emitted, minlength=5) / trials
print("target   :", [round(v, 3) for v in p_target.tolist()])
print("emitted  :", [round(v, 3) for v in empirical.tolist()])
print("draft    :", [round(v, 3) for v in p_draft.tolist()])
tv = 0.5 * (empirical - p_target).abs().sum()
print(f"TV(emitted, target) = {tv:.4f}   (sampling noise is about {1 / trials ** 0.5:.4f})")
print(f"measured acceptance {keep.float().mean():.3f} vs β = {beta:.3f}")
assert tv < 0.01 and abs(keep.float().mean() - beta) < 0.01"""),
    new_code_cell("""\
rounds = 3000
counts = torch.zeros(5)
for _ in range(rounds):
    x = int(torch.multinomial(p_draft, 1, generator=generator))
    verdict = verify_sampling([x], p_draft[None], torch.stack([p_target, p_target]), generator)
    counts[x if verdict.num_accepted == 1 else verdict.target_token_id] += 1
tv = 0.5 * (counts / rounds - p_target).abs().sum()
print(f"verify_sampling, {rounds} rounds: TV(emitted, target) = {tv:.3f}")
assert tv < 0.05"""),
    new_markdown_cell("""\
## The naive rule is *not* lossless

Accepting x whenever it is the target's most likely token (or always accepting it) returns the
draft's habits, not the target's law. Compare: if we always kept the draft token, the emitted law
would simply be p_draft — TV to the target:"""),
    new_code_cell("""\
print(f"TV(p_draft, p_target) = {0.5 * (p_draft - p_target).abs().sum():.3f}  — the error the rule removes")"""),
    new_markdown_cell("""\
## The whole engine, k = 3, on tiny models

The same holds for whole generations: with temperature 1 the first token of
`speculative_generate` follows the target's softmax, whatever the draft. 150 seeded runs:"""),
    new_code_cell("""\
from specdec import speculative_generate
from specdec.testing import tiny_model, perturbed_copy
torch.set_num_threads(1)
target = tiny_model("llama", seed=0, vocab_size=8)
draft = tiny_model("llama", seed=5, vocab_size=8)  # unrelated: many rejections
prompt = [3, 4, 5, 6]
with torch.no_grad():
    law = torch.softmax(target(torch.tensor([prompt])).logits[0, -1], -1)  # [8]
runs = 150
first = torch.zeros(8)
for seed in range(runs):
    out = speculative_generate(target, draft, prompt, k=3, max_new_tokens=4, temperature=1.0, seed=seed)
    first[out.token_ids[0]] += 1
with torch.no_grad():
    draft_law = torch.softmax(draft(torch.tensor([prompt])).logits[0, -1], -1)  # what a lossy method would follow
tv = 0.5 * (first / runs - law).abs().sum()
tv_draft = 0.5 * (draft_law - law).abs().sum()
print(f"TV(first emitted token, target softmax) over {runs} runs = {tv:.3f}; TV(draft, target) = {tv_draft:.3f}")
assert tv < 0.15 < tv_draft"""),
    new_markdown_cell("""\
150 runs leave sampling noise of order 1/√150 ≈ 0.08 in TV, far below the draft's own distance to the target.

**Next:** [03 — reading a benchmark: α, c, v, k and the speedup](03_reading_a_benchmark.ipynb)"""),
]

READING = [
    new_markdown_cell("""\
# Reading a benchmark: α, c, v, k and the speedup

Leviathan et al. 2023: with acceptance rate α (probability a drafted token is accepted), k drafts
per round (their γ) and cost ratio c = one draft step / one target step (both reading one token):

- expected tokens per target forward: (1 − α^(k+1)) / (1 − α)  — at most k + 1 (their Eq. 1);
- expected wall-time speedup: (1 − α^(k+1)) / ((1 − α)(k·c + 1))  (their Thm 3.8, Leviathan's bound).

A high α is not enough: each round also pays k draft steps, so a draft that is not much cheaper
than the target (large c) cancels the gain. The bound also assumes that verifying k+1 tokens in one
forward costs one step; where it costs v(k+1) > 1 steps the prediction is
(1 − α^(k+1)) / ((1 − α)(v(k+1) + k·c)). Everything else (prefill, sampling, cache bookkeeping, Python)
is outside both formulas: that is the gap between prediction and measurement."""),
    new_code_cell("""\
from specdec import theory
from specdec.costs.advisor import advise
print("tokens per round (1-α^(k+1))/(1-α):")
print("α \\\\ k " + "".join(f"{k:>7}" for k in range(1, 9)))
for alpha in (0.5, 0.7, 0.8, 0.9):
    print(f"{alpha:<6}" + "".join(f"{theory.expected_tokens_per_step(alpha, k):7.2f}" for k in range(1, 9)))
print("\\nLeviathan's bound at α = 0.8:")
for c in (0.0, 0.05, 0.2, 0.5):
    print(f"c={c:<5}" + "".join(f"{theory.leviathan_bound(0.8, k, c):7.2f}" for k in range(1, 9)),
          "  ->", advise(0.8, c).verdict)
print("\\nLeviathan Table 1 check (c=0): α=0.8,k=5 ->", round(theory.expected_tokens_per_step(0.8, 5), 2),
      "; α=0.6,k=2 ->", round(theory.expected_tokens_per_step(0.6, 2), 2))"""),
    new_markdown_cell("""\
## A real (tiny) benchmark run

`specdec.lab.bench.run_bench` times target-alone, ours and Hugging Face assisted generation on the same
prompts. Three drafts: the target itself (α = 1), a noisy copy, and an unrelated random model."""),
    new_code_cell("""\
import tempfile
import torch
from specdec.lab.bench import BenchConfig, contender, run_bench, summarise, advice_rows
from specdec.core.suites import load_suite
from specdec.testing import tiny_model, perturbed_copy
torch.set_num_threads(1)
target = tiny_model("llama", seed=0)
drafts = {"self": target, "noisy": perturbed_copy(target, 0.3), "unrelated": tiny_model("llama", seed=7)}
rows = run_bench(target, [contender(n, d, target) for n, d in drafts.items()], load_suite("tiny", limit=1),
                 [1, 4], BenchConfig(target="tiny", max_new_tokens=10), tempfile.mkdtemp())
print(len(rows), "cells measured")
summaries = [s for s in summarise(rows) if s.category == "all"]
print(f"{'draft':10} {'k':>2} {'α̂':>6} {'mean accepted length':>21} {'tokens per forward (Eq. 1)':>27}")
for s in summaries:  # counting metrics: the same on every run
    print(f"{s.draft:10} {s.k:>2} {s.acceptance_rate:6.2f} {s.mean_accepted_length:21.2f} "
          f"{s.theoretical_speedup:27.2f}")"""),
    new_markdown_cell("""\
The timed columns: c, v(k+1), Leviathan's bound, the prediction and the measurement, and where the time
went. They vary run to run (this machine is shared), so they are printed to one decimal and the notebook
test does not compare them."""),
    new_code_cell("""\
print(f"{'draft':10} {'k':>2} {'c':>5} {'v':>5} {'bound':>6} {'predicted':>10} {'measured':>9}  draft/target/prefill/other")
for s in summaries:
    print(f"{s.draft:10} {s.k:>2} {s.cost_ratio:5.1f} {s.verify_cost:5.1f} {s.leviathan_bound:6.1f} "
          f"{s.predicted_speedup:9.1f}x {s.speedup_vs_target_alone:8.1f}x  "
          f"{s.draft_share:.0%}/{s.target_share:.0%}/{s.prefill_share:.0%}/{s.overhead_share:.0%}")""",
                  metadata={"tags": [TIMINGS]}),
    new_markdown_cell("""\
How to read it:

- **α̂** is 1.00 for `self`, lower for `noisy`, near 0 for `unrelated` — the acceptance rate is a
  property of the *pair* (and of the prompts).
- **c** is large here: the draft is as big as the target, so k draft forwards cost k target
  forwards. The bound (1−α^(k+1))/((1−α)(kc+1)) then says little can be gained, even at α = 1.
- **measured** falls below the bound on tiny models: a forward of a 2-layer, 64-wide model takes
  well under a millisecond, so the per-round bookkeeping (the "other" share) is comparable to the
  forwards themselves. With real models the forwards dominate, but the bound is still not the target:
  on a CPU in float32 a verification forward over k+1 tokens costs v(k+1) > 1 steps, so the
  measurement follows the *predicted* speedup, which sits below Leviathan's bound. The app's waterfall
  shows each step from Eq. 1 to the measurement for one run.
- the **advisor** turns the measured α̂ and c (and v) into the best k:"""),
    new_code_cell("""\
for a in advice_rows(rows):
    if a.category == "all":
        print(f"{a.draft:10} α̂={a.acceptance_rate:.2f} c={a.cost_ratio:.1f}: advised k={a.recommended_k}; "
              f"best measured k={a.best_measured_k} ({a.best_measured_speedup:.1f}x)")""",
                  metadata={"tags": [TIMINGS]}),
    new_markdown_cell("""\
**Next:** the papers — Leviathan et al. 2023 ([arXiv:2211.17192](https://arxiv.org/abs/2211.17192)) and
Chen et al. 2023 ([arXiv:2302.01318](https://arxiv.org/abs/2302.01318)) — then the app (`python app.py`):
step through a round and read the cost waterfall of a real pair. Back to the
[README](../README.md#start-here)."""),
]

NOTEBOOKS = {
    "01_one_round_by_hand.ipynb": ONE_ROUND,
    "02_lossless_rejection_sampling.ipynb": LOSSLESS,
    "03_reading_a_benchmark.ipynb": READING,
}


def notebook(name: str) -> nbformat.NotebookNode:
    """The notebook `name` as written here, without outputs."""
    cells = [nbformat.from_dict(dict(cell)) for cell in NOTEBOOKS[name]]  # copies: executing never edits the source
    return new_notebook(cells=cells, metadata={
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})


def execute(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Run every cell in a fresh kernel from the repository root; cell ids and timing metadata are made stable."""
    from nbclient import NotebookClient

    NotebookClient(nb, timeout=300, kernel_name="python3", record_timing=False,
                   resources={"metadata": {"path": str(ROOT)}}).execute()
    for index, cell in enumerate(nb.cells):
        cell["id"] = f"cell-{index:02d}"
        cell.get("metadata", {}).pop("execution", None)
        if cell.cell_type == "code":  # warnings (stderr) name this machine's paths and library versions
            cell.outputs = [o for o in cell.outputs if not (o.output_type == "stream" and o.get("name") == "stderr")]
    nb.metadata.pop("language_info", None)  # names the exact Python patch version: not part of the lesson
    return nb


def printed(nb: nbformat.NotebookNode) -> list[str]:
    """What each code cell printed (stdout and results), "" for cells tagged TIMINGS."""
    texts = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        if TIMINGS in cell.get("metadata", {}).get("tags", []):
            texts.append("")
            continue
        parts = [o.get("text", "") if o.output_type == "stream" and o.get("name") == "stdout"
                 else o.get("data", {}).get("text/plain", "") for o in cell.outputs if o.output_type != "error"
                 and not (o.output_type == "stream" and o.get("name") == "stderr")]
        texts.append("".join(parts))
    return texts


def build(run: bool = True) -> list[Path]:
    paths = []
    for name in NOTEBOOKS:
        nb = notebook(name)
        if run:
            nb = execute(nb)
        path = HERE / name
        nbformat.write(nb, path)
        paths.append(path)
    return paths


if __name__ == "__main__":
    import sys

    for path in build(run="--no-run" not in sys.argv):
        print("wrote", path)
