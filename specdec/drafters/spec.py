"""What a user names: a draft spec parsed once into a `DraftSpec`, and how a model draft meets the target's ids.

The grammar (the CLI's `--draft`, the app's draft box, `specdec.drafters.from_spec`):

    spec  = base | base "+lookup"          prompt lookup where the base draft missed or starts it, or a copy is
                                           on track; else the base draft
    base  = "lookup" | "self:" L | MODEL | MODEL "@vocab=" FILE | MODEL "@vocab=all"

MODEL is a catalogue name, a folder, a .gguf file, a hub id or `aligned:NAME`. A catalogue draft drafts over the
frequent-token set shipped for its tokenizer family, where one ships (`specdec.models.loading.load_draft`);
`@vocab=all` keeps its whole vocabulary. "+lookup" ends a spec once; a spec is at most MAX_SPEC_CHARS characters.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

LOOKUP = "lookup"
SELF_PREFIX = "self:"
HYBRID_SUFFIX = "+lookup"
VOCAB_SEPARATOR = "@vocab="  # MODEL@vocab=FILE
WHOLE_VOCABULARY = "all"  # MODEL@vocab=all: the model's whole vocabulary, not a shipped set (a file called so: ./all)
MAX_SPEC_CHARS = 4096  # a long model path and a long vocabulary path fit
GRAMMAR = "a model, 'lookup', 'self:L', 'MODEL+lookup', 'MODEL@vocab=FILE' or 'MODEL@vocab=all'"


class Vocabulary(str, Enum):
    """How a model draft meets the target's token ids (the app's labels are these values)."""

    AUTO = "auto"  # through the text bridge only when the tokenizers differ
    AS_IS = "as is"  # ids used as they are: the engine refuses a different vocabulary
    BRIDGE = "text bridge"  # always through text (TextBridgeDrafter)
    NAIVE = "naive ids"  # ids fed across vocabularies (NaiveCrossVocabDrafter): acceptance collapses

    def __str__(self) -> str:
        return self.value  # what the app shows, and what f-strings print

    @classmethod
    def of(cls, value, what: str = "vocabulary mode") -> "Vocabulary":
        """`value` as a Vocabulary; a ValueError naming `what` and the choices otherwise."""
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"{what} must be one of {', '.join(repr(m.value) for m in cls)}, got {value!r}") from None


@dataclass(frozen=True)
class DraftSpec:
    """A parsed draft spec (module docstring): what to build, and from which model."""

    kind: str  # "lookup", "self" (the target's first layers), "model" or "pruned" (MODEL@vocab=FILE)
    model: str = ""  # the model to load ("" for lookup and self:L)
    layers: int = 0  # L of self:L
    vocabulary_file: str = ""  # FILE of MODEL@vocab=FILE
    whole_vocabulary: bool = False  # MODEL@vocab=all: never a shipped set
    hybrid: bool = False  # "+lookup": prompt lookup where this draft just missed or starts it, or a copy is on track

    @classmethod
    def parse(cls, text) -> "DraftSpec":
        """The DraftSpec of `text`; a one-line ValueError saying what is wrong otherwise."""
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"a draft spec must be a non-empty string: {GRAMMAR}")
        text = text.strip()
        if len(text) > MAX_SPEC_CHARS:
            raise ValueError(f"a draft spec is at most {MAX_SPEC_CHARS} characters, got {len(text)} "
                             f"({text[:40]!r}…)")
        base = text.removesuffix(HYBRID_SUFFIX)
        hybrid = base != text
        if hybrid and (not base or base.endswith(HYBRID_SUFFIX)):
            raise ValueError(f"{text[:60]!r}: '+lookup' follows one draft, once: MODEL+lookup")
        if base == LOOKUP:
            return cls("lookup", hybrid=hybrid)
        if base.startswith(SELF_PREFIX):
            return cls("self", layers=_layers(base), hybrid=hybrid)
        if VOCAB_SEPARATOR in base:
            model, _, vocabulary_file = base.rpartition(VOCAB_SEPARATOR)
            if not model or not vocabulary_file:
                raise ValueError(f"{base!r}: a pruned draft is MODEL@vocab=FILE, e.g. runs/finance/distill/draft"
                                 f"@vocab=runs/finance/prune/vocabulary.json")
            if vocabulary_file == WHOLE_VOCABULARY:
                return cls("model", model, whole_vocabulary=True, hybrid=hybrid)
            return cls("pruned", model, vocabulary_file=vocabulary_file, hybrid=hybrid)
        return cls("model", base, hybrid=hybrid)


def _layers(spec: str) -> int:
    """L of a "self:L" spec; ValueError with an example otherwise."""
    value = spec.removeprefix(SELF_PREFIX)
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"{spec!r}: self-speculation needs a positive number of target layers, e.g. self:8 "
                         "(self:auto, which calibrates L, is a `python -m specdec bench` draft)")
    return int(value)
