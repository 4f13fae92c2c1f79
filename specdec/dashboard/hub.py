"""Which models a visitor may pick, and the models behind the names (loaded once, shared by all sessions).

Loading goes through `specdec.models` (its process-wide pool keeps each model once); this module
only applies the host's allow-list (SPECDEC_ALLOWED_MODELS / SPECDEC_ALLOW_CUSTOM_MODELS, and per request
whether it came through a proxy: `specdec.dashboard.config`) and reports loading progress.
"""
from __future__ import annotations

from gradio.context import LocalContext

from specdec import models
from specdec.core.costmodel import CostModel
from specdec.core.limits import Budget
from specdec.costs.calibration import calibrate
from specdec.drafters import HYBRID_SUFFIX, DraftSpec, Vocabulary
from specdec.drafters.spec import MAX_SPEC_CHARS
from specdec.lab import presets
from specdec.models import aligned, entries

from specdec.dashboard.config import AppConfig, MODEL_DRAFTERS, proxied

VOCABULARIES = tuple(mode.value for mode in Vocabulary)  # the vocabulary modes the UI offers (specdec.drafters.spec)


class ModelHub:
    """Model names offered by this host and the loaded models behind them."""

    def __init__(self, config: AppConfig, pool=None):
        self.config = config  # host settings (allow-list, dtype, caps)
        self.pool = pool if pool is not None else models.default_pool()  # shared, loads each model once

    def catalogue_names(self, role: str) -> list[str]:
        """Catalogue names for `role` ("target", "draft" = any draft, "unaligned-draft"), allow-list applied."""
        wanted = {"target": ("target",), "draft": ("draft", "unaligned-draft")}.get(role, (role,))
        return [e.name for e in models.catalogue()
                if any(r in wanted for r in e.roles) and self._listed(e.name)]

    def choices(self, role: str) -> list[tuple[str, str]]:
        """(label, value) pairs for a dropdown: catalogue entries with their readiness, then model-free drafters."""
        entries = {e.name: e for e in models.catalogue()}
        pairs = [(f"{name} · {entries[name].parameters} · {entries[name].status}", name)
                 for name in self.catalogue_names(role)]
        if role == "draft":
            pairs += [(f"{name} · with prompt lookup where it misses or agrees", name + HYBRID_SUFFIX)
                      for name in self.catalogue_names("draft") if "draft" in entries[name].roles]
            pairs += [(f"{name} · {'prompt lookup (no model)' if name == 'lookup' else 'first layers of the target'}",
                       name) for name in MODEL_DRAFTERS]
            pairs += [(f"aligned · {aligned.label(card)}", card.spec) for card in self.aligned_drafts()]
        return pairs

    def aligned_drafts(self, target: str | None = None) -> list[aligned.Card]:
        """Aligned drafts in the model cache (all, or those for `target`) whose source and target this host allows."""
        return [card for card in aligned.list_aligned(target) if self._allowed(card)]

    def aligned_default(self, target: str) -> aligned.Card | None:
        """The aligned draft the compare tab shows for `target`: the newest distilled one, else the newest."""
        cards = self.aligned_drafts(target)
        return next((c for c in cards if "distill" in c.method), cards[0] if cards else None)

    def compare_defaults(self, target: str | None = None) -> list[tuple[str, str]]:
        """The compare tab's three (draft, vocabulary) columns for `target` (default: the host's).

        With an aligned draft for it: the same-family draft, the aligned draft's source with naive ids, the
        aligned draft; otherwise the same-family draft, then the first other-tokenizer draft naive and bridged."""
        card = self.aligned_default(target or self.default("target"))
        if card is not None:
            return [(self.default("draft"), Vocabulary.AS_IS), (card.source, Vocabulary.NAIVE),
                    (card.spec, Vocabulary.AS_IS)]
        other = self.default("unaligned-draft")
        return [(self.default("draft"), Vocabulary.AS_IS), (other, Vocabulary.NAIVE), (other, Vocabulary.BRIDGE)]

    def model(self, name: str, role: str = "draft", progress=None, load_as: str = "draft"):
        """A model (not a drafter) the host allows as `role`, through the shared pool, loaded in the format
        `load_as` takes ("draft", or "train" for a model to transplant or train: float32 under auto)."""
        return self.pool.get(self.check(name, role), dtype=self.config.dtype, progress=stages(progress),
                             role=load_as)

    def sources(self) -> list[str]:
        """Drafts an aligned draft can be made from: the catalogue's drafts of another tokenizer family."""
        return self.catalogue_names("unaligned-draft")

    def default(self, role: str) -> str:
        """The host's preselected name (SPECDEC_TARGET/DRAFT/UNALIGNED), else the catalogue's choice."""
        chosen = {"target": self.config.default_target, "draft": self.config.default_draft,
                  "unaligned-draft": self.config.default_unaligned}[role]
        if chosen:
            return chosen
        offered = self.catalogue_names(role)
        name = models.default_name(role) if role != "unaligned-draft" else (offered or [""])[0]
        return name if name in offered or not offered else offered[0]

    def default_drafter(self) -> str:
        """The live tab's preselected draft: the host's SPECDEC_DRAFT as it is, else the default draft model behind
        prompt lookup (`presets.live_draft`)."""
        return self.config.default_draft or presets.live_draft(self.default("draft"))

    def check(self, name: str, role: str) -> str:
        """`name` if this host lets a visitor load it as `role`; otherwise a ValueError saying what is allowed.

        A draft is read by `DraftSpec.parse` (the factory's own grammar); the model it names, if any, is checked."""
        if not name:
            raise ValueError(f"choose a {role} model")
        if role != "draft":
            if len(name) > MAX_SPEC_CHARS:  # a draft's length is DraftSpec.parse's to check
                raise ValueError(f"a {role} name is at most {MAX_SPEC_CHARS} characters, got {len(name)}")
            return self._check_model(name)
        spec = DraftSpec.parse(name)
        if spec.vocabulary_file and not self.allows("allow_custom_models"):
            raise ValueError(f"{name!r}: a draft vocabulary file is a custom path, disabled on this host "
                             "(SPECDEC_ALLOW_CUSTOM_MODELS=0)")
        if spec.model.startswith(aligned.PREFIX):
            offered = [card.spec for card in self.aligned_drafts()]  # unknown and not offered read the same
            if spec.model not in offered:
                raise ValueError(f"this host does not offer aligned draft {spec.model!r}; offered: "
                                 f"{', '.join(offered) or 'none'}")
        elif spec.model:
            self._check_model(spec.model)
        return name

    def _check_model(self, name: str) -> str:
        """A model name (catalogue entry, folder or id) this host offers."""
        if name.lower() in {e.name for e in models.catalogue()}:
            if not self._listed(name):
                raise ValueError(f"model {name!r} is not offered on this host; allowed: "
                                 f"{', '.join(self.config.allowed_models)} (SPECDEC_ALLOWED_MODELS)")
            return name
        if not self.allows("allow_custom_models"):
            raise ValueError(f"unknown model {name!r}: pick one of the list (custom model paths and ids are "
                             "disabled on this host, SPECDEC_ALLOW_CUSTOM_MODELS=0)")
        return name

    def target(self, name: str, progress=None, budget: Budget = Budget()):
        """The loaded target (a specdec LoadedModel); a first load reports its stages to `progress`.

        The request's `budget` is checked as each stage of a first load begins (`stages`: what the stages before
        stored stays, so the next request continues from there) and once the model is loaded."""
        name = self.check(name, "target")
        if progress is not None:
            progress(0.0, desc=f"loading target {name} (a first load can take a minute)…")
        loaded = self.pool.get(name, dtype=self.config.dtype, progress=stages(progress, budget, f"the target {name}"))
        budget.check("loading the target")
        return loaded

    def draft(self, name: str, target, bridge: Vocabulary | str = Vocabulary.AUTO, progress=None,
              budget: Budget = Budget()):
        """A draft for `target`; `bridge` (a Vocabulary) says how it meets the target's vocabulary; `budget` as in
        `target`."""
        name = self.check(name, "draft")
        vocabulary = Vocabulary.of(bridge)
        if progress is not None:
            progress(0.5, desc=f"loading draft {name}…")
        draft = self.pool.draft(name, target, dtype=self.config.dtype, bridge=vocabulary,
                                progress=stages(progress, budget, f"the draft {name}"))
        budget.check("loading the draft")
        return draft

    def costs(self, target, draft, progress=None, budget: Budget = Budget()) -> CostModel:
        """The pair's calibrated costs (v(n), c): measured once per machine and cached on disk."""
        if progress is not None:
            progress(0.9, desc="measuring what verification and drafting cost on this machine "
                               "(once per model pair, about (k+2)·3 target forwards)…")
        return calibrate(target, draft, budget=budget)

    def pair(self, target_name: str, draft_name: str, bridge: str = "auto", progress=None,
             budget: Budget = Budget()):
        """(target, draft) ready for specdec.speculative_generate."""
        target = self.target(target_name, progress, budget)
        return target, self.draft(draft_name, target, bridge=bridge, progress=progress, budget=budget)

    def loaded_pair(self, target_name: str, draft_name: str, bridge: str = "auto"):
        """(target, draft) as `pair` returns them, from the models in memory only: nothing is loaded
        (`specdec.models.pool.NotLoaded` when one is not there)."""
        target = self.pool.get(self.check(target_name, "target"), dtype=self.config.dtype, held_only=True)
        return target, self.pool.draft(self.check(draft_name, "draft"), target, dtype=self.config.dtype,
                                       bridge=Vocabulary.of(bridge), held_only=True)

    def memory(self) -> str:
        """One status line: the models held and the memory budget they share."""
        return self.pool.describe()

    def _listed(self, name: str) -> bool:
        return not self.config.allowed_models or name in self.config.allowed_models

    def _allowed(self, card: aligned.Card | None) -> bool:
        """An aligned draft is allowed when its source and its target are (catalogue allow-list, custom models)."""
        return card is not None and all(self._offered(name) for name in (card.source, card.target))

    def _offered(self, name: str) -> bool:
        """A catalogue name on the allow-list, or a folder / id where custom models are allowed."""
        entry = entries.find(name)  # the catalogue without its readiness checks: the job timer asks every 2 s
        return self._listed(entry.name) if entry is not None else self.allows("allow_custom_models")

    def allows(self, field: str) -> bool:
        """`AppConfig.allows` for the request being handled (public when it came through a proxy)."""
        return self.config.allows(field, request_proxied())


def request_proxied() -> bool:
    """Whether the Gradio event being handled came through a reverse proxy; False outside a request."""
    headers = getattr(LocalContext.request.get(None), "headers", None)
    return headers is not None and proxied({str(k).lower(): str(v) for k, v in headers.items()})


def stages(progress, budget: Budget = Budget(), loading: str = ""):
    """specdec.models' progress callback (stage, fraction) as a gr.Progress update, or None (no progress, no limit).

    With a time limit, `budget` is checked as each stage begins (a new stage message): the load's safe points,
    where every stage before it (assembling, converting, quantizing) is stored whole in the cache. A load past the
    limit stops there with one line (BudgetExceeded) instead of running its next stages, and the next request
    continues from what is stored. `loading` names the model for that line."""
    if progress is None and budget.seconds is None:
        return None
    begun = set()

    def report(stage: str, fraction: float) -> None:
        if progress is not None:
            progress(fraction, desc=stage)
        if stage not in begun:
            begun.add(stage)
            budget.check(f"loading {loading}, at: {stage}. What it finished is kept: ask again to continue")
    return report
