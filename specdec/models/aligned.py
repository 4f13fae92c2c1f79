"""Aligned drafts: drafts of another family moved onto a target's tokenizer, kept in the model cache.

An aligned draft is a folder `<cache>/aligned/<name>/` holding the model (safetensors, config, the
target's tokenizer) and `card.json` (a `Card`: what it was made from and how well it drafts). Anything
that loads a model loads one by the spec `aligned:<name>` (`specdec.models.load_model`, so also
`load_draft` and `specdec.drafters.from_spec`). `python -m specdec align` / `distill`, the aligned-draft
recipe and the dashboard register what they make here.

    card = Card(name="smollm-finance", target="qwen2.5-coder-1.5b-instruct", source="smollm2-135m-instruct",
                method="transplant+distill", domain="finance", steps=200, held_out_acceptance=0.62)
    register("runs/align-distill/finance/distill/draft", card)
    load_draft("aligned:smollm-finance", target)
"""
from __future__ import annotations

import json
import re
import shutil
import time
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from specdec.core import files
from specdec.models import cache, entries

PREFIX = "aligned:"  # spec prefix naming a registered aligned draft
CARD = "card.json"  # the card's file inside an aligned draft's folder
METHODS = ("transplant", "transplant+distill", "distill")
NAME_CHARS = 80  # longest registry name
NAME = re.compile(rf"^[A-Za-z0-9][A-Za-z0-9._-]{{0,{NAME_CHARS - 1}}}$")  # a folder name on every file system


@dataclass
class Card:
    """What an aligned draft is: made from which model, for which target, how, and how well it drafts."""

    name: str  # registry name: load it as `aligned:<name>`
    target: str  # the target whose tokenizer it speaks (catalogue name, or an absolute folder)
    source: str  # the original draft model it was made from (catalogue name, or an absolute folder)
    method: str  # "transplant" (embeddings only, no training), "transplant+distill", or "distill" (same tokenizer)
    domain: str = ""  # prompt suite or domain it was distilled on ("" when not trained)
    steps: int = 0  # distillation optimizer steps (0 when not trained)
    held_out_acceptance: float | None = None  # α̂ on held-out prompts after distillation, None when not measured
    created: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))  # UTC

    def __post_init__(self):
        check_name(self.name)
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {', '.join(METHODS)}, got {self.method!r}")

    @property
    def spec(self) -> str:
        """What a model box or `load_model` takes."""
        return PREFIX + self.name


def root() -> Path:
    return cache.root() / "aligned"


def folder(name: str) -> Path:
    """The folder of the aligned draft `name` (a ValueError naming the registered ones when missing)."""
    path = root() / check_name(name)
    if not (path / CARD).is_file():
        known = ", ".join(c.name for c in list_aligned()) or "none yet"
        raise ValueError(f"no aligned draft called {name!r} (registered: {known}); make one with "
                         "`python -m specdec align` or the dashboard's compare tab")
    return path


def check_name(name: str) -> str:
    if not isinstance(name, str) or not NAME.match(name):
        raise ValueError(f"an aligned draft's name is 1-{NAME_CHARS} letters, digits, '.', '_' or '-', got {name!r}")
    return name


def name_for(text: str) -> str:
    """A registry name made from free text (a folder name, "source-domain"): other characters become "-"."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-._")[:NAME_CHARS] or "aligned"


def model_id(spec: str) -> str:
    """How a card names a model: a catalogue name as spelled there, a local folder as its absolute path."""
    entry = entries.find(spec)
    if entry is not None:
        return entry.name
    path = Path(spec).expanduser()
    return str(path.resolve()) if path.exists() else spec


def loaded_id(loaded) -> str:
    """`model_id` of a LoadedModel: its catalogue name, else the folder its weights came from."""
    return loaded.name if entries.find(loaded.name) or loaded.name.startswith(PREFIX) else model_id(str(loaded.path))


def register(model_folder, card: Card) -> Path:
    """Copy `model_folder` and write `card` as the aligned draft `card.name` (replacing one of that name).

    The folder appears whole or not at all (`files.atomic_path`); returns it."""
    model_folder = Path(model_folder)
    if not any(model_folder.glob("*.safetensors")):
        raise ValueError(f"{model_folder} holds no *.safetensors weights to register")
    final = root() / card.name
    with cache.locked(final), files.atomic_path(final) as partial:
        shutil.copytree(model_folder, partial)
        (partial / CARD).write_text(_card_json(card), encoding="utf-8")
    return final


def set_acceptance(name: str, acceptance: float) -> Card:
    """Record a held-out α̂ measured after registration (the aligned-draft recipe's measure stage) on `name`'s card."""
    path = folder(name)
    card = replace(read_card(path), held_out_acceptance=acceptance)
    files.write_text(path / CARD, _card_json(card))
    return card


def _card_json(card: Card) -> str:
    return json.dumps(asdict(card), indent=1, ensure_ascii=False)


def read_card(path: Path) -> Card | None:
    """The card in folder `path`, or None when it is missing or unreadable (skipped by listings)."""
    try:
        data = json.loads((path / CARD).read_text(encoding="utf-8"))
        return Card(**{f.name: data[f.name] for f in fields(Card) if f.name in data})
    except (OSError, ValueError, TypeError):
        return None


def list_aligned(target: str | None = None) -> list[Card]:
    """Registered aligned drafts (all, or those for `target`), newest first."""
    if not root().is_dir():
        return []
    finished = [p for p in root().iterdir() if NAME.match(p.name) and not files.in_progress(p)]  # not being written
    cards = [c for p in finished if (c := read_card(p)) is not None]
    if target is not None:
        cards = [c for c in cards if c.target == model_id(target)]
    return sorted(cards, key=lambda c: (c.created, c.name), reverse=True)


def find(spec: str) -> Card | None:
    """The card behind an `aligned:<name>` spec, or None for any other spec."""
    if not spec.startswith(PREFIX):
        return None
    return read_card(folder(spec.removeprefix(PREFIX)))


def label(card: Card) -> str:
    """One dropdown line, e.g. "smollm2-135m-instruct → qwen2.5-coder-1.5b-instruct · finance · distilled 200 steps
    · held-out α̂ 0.62"."""
    parts = [f"{Path(card.source).name} → {Path(card.target).name}"]
    if card.domain:
        parts.append(card.domain)
    parts.append(f"distilled {card.steps} steps" if card.steps else "transplanted, not trained")
    if card.held_out_acceptance is not None:
        parts.append(f"held-out α̂ {card.held_out_acceptance:.2f}")
    return " · ".join(parts)


def register_distilled(draft_folder, report, *, name: str, target: str, source: str, domain: str = "",
                       transplanted: bool = True) -> Path:
    """Register a distillation's draft folder with a card read off its report (a DistillReport, or its report.json
    as a dict): steps done and the last held-out α̂."""
    report = report if isinstance(report, dict) else report.to_dict()
    evals = report.get("evals") or [{"acceptance_rate": None}]
    card = Card(name=name, target=model_id(target), source=model_id(source),
                method="transplant+distill" if transplanted else "distill", domain=domain,
                steps=report.get("steps_done", 0), held_out_acceptance=evals[-1]["acceptance_rate"])
    return register(draft_folder, card)


