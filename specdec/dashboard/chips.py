"""The decoded text as coloured chips, one per token, grouped by round (SpeculatoViz-style).

Kinds of chip (CSS class `chip-<kind>`):
- accepted: a draft token the target kept;
- rejected: the first draft token the target refused, struck through (greedy: not the target's top-1;
  sampling: its uniform draw u was >= min(1, p_target/p_draft));
- unreached: draft tokens after the first rejection, never verified, struck through and faded;
- correction: the target's own token at the first rejection;
- bonus: the target's extra token when every draft token of the round was accepted;
- leaf: the target's token after a correction that was a leaf (the draft's second choice there, verified in the
  same forward as a row of its own), read from that row.
Hovering a chip shows the round, the position and, for draft tokens, p_draft, p_target and the rule
that decided. Special tokens (`<|im_start|>`, `</s>`) show as ⟨im_start⟩, ⟨/s⟩ markers.
"""
from __future__ import annotations

import html
import re

from specdec.core.trace import Round

KIND_HELP = {  # chip kind -> legend text
    "accepted": "accepted draft token",
    "rejected": "rejected draft token (first refusal of the round)",
    "unreached": "drafted after the rejection, never verified",
    "correction": "target's correction",
    "bonus": "bonus token (all drafts accepted)",
    "leaf": "target's token after a leaf (the correction was the draft's second choice, verified too)",
}
PIECE_WINDOW = 8  # tokens of left context used to decode one token's text (byte-level BPE pieces need it)
SPECIAL = re.compile(r"<\|[^|<>\s]{1,40}\|>|</?s>")  # chat-template and sentence markers: <|im_start|>, </s>

CSS = """
.chips { line-height: 2.1; font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 0.95rem; }
.chip { border-radius: 4px; padding: 1px 3px; margin: 0 1px; white-space: pre-wrap; cursor: help; }
.chip-accepted { background: #c6f0c2; color: #114d0e; }
.chip-rejected { background: #f8c9c4; color: #8a1c12; text-decoration: line-through; }
.chip-unreached { background: #eeeeee; color: #8a8a8a; text-decoration: line-through; }
.chip-correction { background: #ffd98a; color: #6b4500; font-weight: 600; }
.chip-bonus { background: #bcd7ff; color: #0b3d91; font-weight: 600; }
.chip-leaf { background: #dcc8f5; color: #4a1a7a; font-weight: 600; }
.round-sep { color: #b0b0b0; font-size: 0.7rem; vertical-align: super; margin: 0 2px; }
.chips-prompt { color: #666; }
.legend .chip { margin-right: 10px; }
.special-token { font-size: 0.75rem; border: 1px solid currentColor; border-radius: 3px; padding: 0 2px; opacity: 0.8; }
"""


def legend_html() -> str:
    chips = "".join(f'<span class="chip chip-{kind}">{html.escape(text)}</span>' for kind, text in KIND_HELP.items())
    return f'<div class="chips legend">{chips}</div>'


def chips_html(rounds: list[Round], tokenizer, prompt: str = "") -> str:
    """All rounds as chips after the (grey) prompt; `tokenizer` turns ids into text pieces."""
    emitted: list[int] = []  # output so far, the left context of each piece
    parts = [f'<span class="chips-prompt">{_escape(prompt)}</span>'] if prompt else []
    for index, round_ in enumerate(rounds, start=1):
        parts.append(f'<span class="round-sep" title="round {index}">{index}</span>')
        for kind, token, tooltip in _round_chips(index, round_):
            text = _piece(tokenizer, emitted, token)
            parts.append(f'<span class="chip chip-{kind}" title="{html.escape(tooltip)}">{_escape(text)}</span><wbr>')
            if kind in ("accepted", "correction", "bonus", "leaf"):
                emitted.append(token)
    return f'<div class="chips" id="chips">{"".join(parts)}</div>'


def _round_chips(index: int, r: Round) -> list[tuple[str, int, str]]:
    """(kind, token id, hover text) for each token of round `index`, in display order."""
    chips = []
    for position, token in enumerate(r.draft_token_ids):
        kind = "accepted" if position < r.num_accepted else "rejected" if position == r.num_accepted else "unreached"
        probabilities = f"p_draft = {r.draft_probs[position]:.3f}\np_target = {r.target_probs[position]:.3f}"
        if position < len(r.uniforms) and kind != "unreached":  # sampling: the rule decided with this draw
            accept = min(1.0, r.target_probs[position] / r.draft_probs[position]) if r.draft_probs[position] else 1.0
            probabilities += f"\nkept iff u < min(1, p_target/p_draft) = {accept:.3f}; u = {r.uniforms[position]:.3f}"
        elif not r.uniforms and kind != "unreached":  # greedy: the ranking decides, not the probabilities
            probabilities += "\ngreedy: kept iff it is the target's top-1 here"
        chips.append((kind, token, f"round {index}, draft position {position + 1}: {KIND_HELP[kind]}\n{probabilities}"))
    kind = "bonus" if r.is_bonus else "correction"
    leaf = " — the draft's second choice here, verified as a leaf" if r.leaf_passed else ""
    chips.append((kind, r.target_token_id, f"round {index}: {KIND_HELP[kind]} (token id {r.target_token_id}){leaf}"))
    for token in r.emitted_token_ids[r.num_accepted + 1:]:  # a leaf passed: the token its row gave
        chips.append(("leaf", token, f"round {index}: {KIND_HELP['leaf']} (token id {token})"))
    return chips


def _piece(tokenizer, context: list[int], token: int) -> str:
    """Text that `token` adds after `context` (decoding it alone breaks multi-byte characters)."""
    if tokenizer is None:
        return f"{token} "
    left = context[-PIECE_WINDOW:]
    before = tokenizer.decode(left, skip_special_tokens=False)
    after = tokenizer.decode(left + [token], skip_special_tokens=False)
    return after[len(before):] if after.startswith(before) else tokenizer.decode([token], skip_special_tokens=False)


def token_label(tokenizer, token: int) -> str:
    """A token's text for labels: special tokens as ⟨name⟩ markers, whitespace visible."""
    text = str(token) if tokenizer is None else tokenizer.decode([token], skip_special_tokens=False)
    text = SPECIAL.sub(lambda m: f"⟨{m.group(0)[1:-1].strip('|')}⟩", text)
    return text.replace("\n", "⏎").replace(" ", "␣") or "∅"


def _escape(text: str) -> str:
    """HTML-escape, make newlines visible as ⏎ (keeping the line break) and special tokens readable markers."""
    parts, last = [], 0
    for match in SPECIAL.finditer(text):
        parts.append(html.escape(text[last:match.start()]).replace("\n", "⏎\n"))
        parts.append(f'<span class="special-token">⟨{html.escape(match.group(0)[1:-1].strip("|"))}⟩</span>')
        last = match.end()
    parts.append(html.escape(text[last:]).replace("\n", "⏎\n"))
    return "".join(parts) or "∅"
