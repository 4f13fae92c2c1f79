"""Drafts whose tokenizer is not the target's: through text (lossless), or naively across ids (to see it fail).

`TextBridgeDrafter` is the idea of Hugging Face's Universal Assisted Decoding (Timor et al. 2025): the draft
reads the target context as *text* in its own tokenization, continues it greedily, and its continuation is
re-tokenised with the target tokenizer. The target verifies those target ids as usual, so greedy output is
the target's own and sampling stays lossless (a deterministic proposal is a point mass p_draft; the
verifier's min(1, p_target/p_draft) rule then needs nothing else).

`NaiveCrossVocabDrafter` is what happens without any alignment: target ids go straight into the draft
model (wrapped modulo the draft's vocabulary), and the draft's ids come back as if they were target ids.
It runs, and acceptance collapses (a domain word such as "QuantLib" is one token for one tokenizer, two for the
other, so even the right word arrives as the wrong ids).

Pass either as the `draft` of `specdec.speculative_generate`, or name it through `specdec.drafters.from_spec`.
"""
from __future__ import annotations

from specdec.core.drafter import ModelDrafter, Proposal, SamplingPolicy
from specdec.core.inputs import unwrap, vocab_size
from specdec.core.timing import Timer
from specdec.drafters.tokenizers import decode_text

EXTRA_DRAFT_TOKENS = 2  # draft tokens generated beyond n per round, so the n-th target token is complete
ANCHOR_TOKENS = 4  # context tokens decoded with a continuation, so its leading space/merge is read in context


class TextBridgeDrafter(ModelDrafter):
    """A draft model with its own tokenizer, proposing target tokens through text.

    Each round: (1) decode the target context to text and tokenise it with the draft tokenizer; the draft's
    KV cache keeps the common prefix with the previous round (the rollback rule of `specdec.core.kv`), so a
    re-tokenisation that changes the last few draft tokens only re-feeds those; (2) the draft continues
    greedily; (3) its continuation is decoded and re-tokenised with the target tokenizer after the last
    few target tokens of the context; (4) target tokens are proposed only when a later target token follows them
    (or the draft ended its text), so a word cut at the end of the draft text is never proposed half-done.
    """

    def __init__(self, draft_loaded, target_tokenizer, draft_tokenizer=None):
        model, draft_tokenizer = unwrap(draft_loaded, draft_tokenizer)
        if draft_tokenizer is None or target_tokenizer is None:
            raise ValueError("the text bridge needs both tokenizers: pass a LoadedModel or draft_tokenizer=...")
        super().__init__(model)
        self.target_tokenizer = target_tokenizer
        self.draft_tokenizer = draft_tokenizer
        self.draft_vocab = len(draft_tokenizer)  # ids beyond the tokenizer are padding rows: never proposed
        self.draft_eos = {draft_tokenizer.eos_token_id} - {None}
        self.empty_context = [draft_tokenizer.bos_token_id or draft_tokenizer.eos_token_id or 0]  # for "" text

    # forwards, model, cost_key ("TextBridgeDrafter": the draft's forwards plus each round's re-tokenisation): a
    # ModelDrafter's; prefill and propose go through text

    def prefill(self, prompt_ids: list[int]) -> float:
        return self.lm.prefill(self._draft_context(prompt_ids))

    def propose(self, context_ids: list[int], n: int, policy: SamplingPolicy) -> Proposal:
        with Timer(self.lm.device) as timer:  # time_s includes the (re-)tokenisation, not just the forwards
            draft_context = self._draft_context(context_ids)
            feed = self.lm.pending(draft_context)
            continuation, ended = [], False
            proposal: list[int] = []
            while not ended and len(proposal) < n and len(continuation) < n + EXTRA_DRAFT_TOKENS:
                logits, _ = self.lm.forward(feed)
                token = int(logits[-1, :self.draft_vocab].argmax())
                continuation.append(token)
                ended = token in self.draft_eos
                text = _text_after(self.draft_tokenizer, draft_context[-ANCHOR_TOKENS:], continuation)
                if not ended:
                    text = text.rstrip("\ufffd")  # a character whose bytes are not all drafted yet
                target_ids = _tokens_after(self.target_tokenizer, context_ids[-ANCHOR_TOKENS:], text)
                proposal = target_ids if ended else target_ids[:-1]  # the last one may be a word cut short
                feed = [token]
        return Proposal(proposal[:n], None, timer.seconds, len(continuation))

    def _draft_context(self, context_ids: list[int]) -> list[int]:
        """The draft tokenization of the decoded target context."""
        text = decode_text(self.target_tokenizer, context_ids)
        return self.draft_tokenizer(text, add_special_tokens=False)["input_ids"] or self.empty_context


def _text_after(tokenizer, anchor_ids: list[int], new_ids: list[int]) -> str:
    """Text that `new_ids` add after `anchor_ids` (decoded together: SentencePiece drops a leading space
    of the first token decoded, and byte pieces only make characters together)."""
    anchor = decode_text(tokenizer, anchor_ids)
    joined = decode_text(tokenizer, anchor_ids + new_ids)
    return joined[len(anchor):] if joined.startswith(anchor) else decode_text(tokenizer, new_ids)


def _tokens_after(tokenizer, anchor_ids: list[int], text: str) -> list[int]:
    """Ids of `text` tokenised after `anchor_ids`; standalone when the text merges into the anchor's tokens."""
    joined = tokenizer(decode_text(tokenizer, anchor_ids) + text, add_special_tokens=False)["input_ids"]
    if joined[:len(anchor_ids)] == anchor_ids:
        return joined[len(anchor_ids):]
    return tokenizer(text, add_special_tokens=False)["input_ids"]


class NaiveCrossVocabDrafter(ModelDrafter):
    """A draft fed target ids as if they were its own, for teaching why alignment is needed.

    A target id t >= V_draft is fed as t mod V_draft; the draft's logits are cut or padded to the target's
    vocabulary (`specdec.drafters.to_target_vocab`) so its proposals are read as target ids. Nothing here is
    meaningful unless the two tokenizers happen to agree: the point is to measure the collapse.
    """

    def __init__(self, draft_loaded):
        model, _ = unwrap(draft_loaded, None)
        super().__init__(model)
        self.draft_vocab = vocab_size(model)

    def prefill(self, prompt_ids: list[int]) -> float:
        return super().prefill(self._wrap(prompt_ids))

    def propose(self, context_ids: list[int], n: int, policy: SamplingPolicy) -> Proposal:
        return super().propose(self._wrap(context_ids), n, policy)

    def _wrap(self, ids: list[int]) -> list[int]:
        return [t % self.draft_vocab for t in ids]
