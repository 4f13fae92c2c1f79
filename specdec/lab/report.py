"""Plain-text and tabular views of a `GenerationResult` (shared by the CLI, dashboard and bench)."""
from __future__ import annotations

from specdec.core.trace import DecodeStats, Divergence, GenerationResult, explain_divergence, measured_speedup

STAT_LINES = (  # (field, label, format)
    ("acceptance_rate", "acceptance rate α̂ = accepted/(accepted+rejections)", "{:.3f}"),
    ("draft_acceptance_rate", "draft acceptance = accepted/proposed", "{:.3f}"),
    ("mean_accepted_length", "mean accepted length (tokens per target forward, incl. target token)", "{:.2f}"),
    ("rounds", "rounds (verification forwards)", "{}"),
    ("draft_tokens", "draft tokens proposed", "{}"),
    ("accepted_tokens", "draft tokens accepted", "{}"),
    ("leaf_rows", "leaves verified (a draft's second choice, a row each)", "{}"),
    ("leaf_tokens", "leaves passed (one token more each)", "{}"),
    ("cost_ratio", "cost ratio c = one draft step / one target step", "{:.3f}"),
    ("verify_cost", "verification cost v(k+1) in target steps (1 = Leviathan's assumption)", "{:.2f}"),
    ("theoretical_speedup", "tokens per target forward (1-α^(k+1))/(1-α)", "{:.2f}"),
    ("leviathan_bound", "Leviathan bound (1-α^(k+1))/((1-α)(kc+1)), verification = 1 step", "{:.2f}"),
    ("rounds_speedup", "speedup of the rounds tokens/(v(n+1)+forwards·c), prefill and bookkeeping left out", "{:.2f}"),
    ("predicted_speedup", "predicted speedup, prefill and bookkeeping included", "{:.2f}"),
    ("tokens_per_s", "tokens/s", "{:.2f}"),
    ("wall_time_s", "wall time (s)", "{:.2f}"),
)


POSITION_CONVENTIONS = (  # (field, convention): per-position acceptance both ways it is reported
    ("per_position_acceptance", "conditional: accepted/reached (this lab, SGLang)"),
    ("per_position_unconditional", "unconditional: accepted/rounds (vLLM, llama.cpp)"),
)


def token_text(tokenizer, token_ids: list[int]) -> str:
    """Decoded text of `token_ids`, or the ids themselves when there is no tokenizer."""
    if tokenizer is None:
        return " ".join(str(t) for t in token_ids)
    return tokenizer.decode(token_ids, skip_special_tokens=False)


def round_rows(result: GenerationResult, tokenizer=None) -> list[dict]:
    """One row per round: the round table (drafted, accepted, the target's token, running output)."""
    rows, produced = [], []
    for index, r in enumerate(result.rounds, start=1):
        produced.extend(r.emitted_token_ids)
        rows.append({
            "round": index,
            "k": r.k,
            "drafted by": r.draft_source or "-",
            "matches": "[" + ",".join("T" if m else "F" for m in r.matches) + "]",
            "accepted": r.num_accepted,
            "target token": token_text(tokenizer, [r.target_token_id]),
            "kind": "bonus" if r.is_bonus else "correction, a leaf" if r.leaf_passed else "correction",
            "produced": token_text(tokenizer, r.emitted_token_ids),
            "output so far": token_text(tokenizer, produced) if tokenizer is not None else "",
        })
    return rows


def format_table(rows: list[dict]) -> str:
    """Fixed-width text table of `rows` (all rows share the first row's keys)."""
    if not rows:
        return "(no rounds)"
    keys = list(rows[0])
    cells = [[str(row[k]).replace("\n", "⏎") for k in keys] for row in rows]
    widths = [min(40, max(len(k), *(len(c[i]) for c in cells))) for i, k in enumerate(keys)]
    line = lambda values: " | ".join(v[:w].ljust(w) for v, w in zip(values, widths))  # noqa: E731
    return "\n".join([line(keys), "-+-".join("-" * w for w in widths), *map(line, cells)])


def format_stats(stats: DecodeStats) -> str:
    """One line per STAT_LINES metric, then the per-position acceptance in both conventions."""
    lines = [f"{label}: {fmt.format(getattr(stats, name))}" for name, label, fmt in STAT_LINES]
    lines += [f"per-position acceptance, {convention}: " + (" ".join(f"{r:.3f}" for r in getattr(stats, name)) or "–")
              for name, convention in POSITION_CONVENTIONS]
    return "\n".join(lines)


def baseline_lines(result: GenerationResult, baseline: GenerationResult, greedy: bool, dtype: str,
                   tokenizer=None) -> list[str]:
    """Measured vs predicted speedup over the target alone and, when greedy, whether the outputs agree and why not."""
    speedup = measured_speedup(result.stats, baseline.stats)
    lines = [f"target alone: {baseline.stats.tokens_per_s:.2f} tokens/s; measured speedup: {speedup:.2f}x "
             f"(predicted {result.stats.predicted_speedup:.2f}x, Leviathan bound "
             f"{result.stats.leviathan_bound:.2f}x)"]
    if not greedy:
        lines.append("sampling: outputs differ run to run; the output law is the target's (lossless rejection sampling)")
        return lines
    divergence = explain_divergence(result, baseline, dtype)
    lines.append("output identical to the target alone" if divergence is None
                 else f"output differs from the target alone at {divergence.describe(tokenizer)}")
    return lines


def is_bug(divergence: Divergence | None) -> bool:
    """A greedy divergence that rounding noise does not explain."""
    return divergence is not None and not divergence.near_tie
