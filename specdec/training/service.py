"""What the CLI and the dashboard call to make an aligned draft: transplant and register, distil into a folder and
register the result.
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

from specdec.core import files
from specdec.core.suites import available_suites, encode, load_suite
from specdec.models import cache, formats
from specdec.models.aligned import (NAME_CHARS, Card, check_name, folder, loaded_id, read_card, register,
                                    register_distilled, root)
from specdec.models.loading import load_model
from specdec.training.align import save_aligned, transplanted
from specdec.training.distill import DistillConfig, DistillReport, Example, cached_examples, distill, process_state


DISTILLED_SUFFIX = "-distilled"  # a distilled aligned draft is registered as <name>-distilled


def distilled_name(name: str) -> str:
    """The name the aligned draft `name` is registered under once distilled; a ValueError when it would be too long."""
    check_name(name)
    if len(name) + len(DISTILLED_SUFFIX) > NAME_CHARS:
        raise ValueError(f"an aligned draft to distil has a name of at most {NAME_CHARS - len(DISTILLED_SUFFIX)} "
                         f"characters (its result is registered as <name>{DISTILLED_SUFFIX}), got {len(name)}")
    return name + DISTILLED_SUFFIX


def transplant(target, source, *, name: str, domain: str = "", progress=None) -> Card:
    """Transplant `source` (a LoadedModel of another family) onto `target`'s tokenizer, no training, and
    register it as `name`; `progress(stage, fraction)` hears the stages. `source` itself is left untouched.
    Refused while `name` is being distilled (its run folder is that distillation's)."""
    distilled_name(name)  # a name that can be distilled later
    with cache.locked(runs_root() / name, busy=f"{name} is being distilled: wait for it to finish (or cancel it) "
                                              "before preparing it again"):
        if source.dtype in formats.CPU_ONLY:
            raise ValueError(f"{source.name} is loaded in {source.dtype}: a transplant rebuilds float weights (load "
                             "it with role 'train')")
        files.remove(runs_root() / name)  # an earlier distillation of that name trained other weights
        say = progress or (lambda stage, fraction: None)
        say(f"copying {source.name} and rebuilding its embeddings for the target's tokenizer", 0.1)
        aligned = transplanted(source, target, "string")
        card = Card(name=name, target=loaded_id(target), source=loaded_id(source), method="transplant", domain=domain)
        say("saving the aligned draft", 0.7)
        root().mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=root(), prefix=".scratch-") as scratch:
            register(save_aligned(aligned.model, target.tokenizer, Path(scratch) / "model"), card)
        say("registered", 1.0)
        return card


def runs_root() -> Path:
    """Where distillations of registered drafts keep their data and resumable checkpoints."""
    return cache.root() / "aligned-runs"


def distil(target, name: str, *, steps: int, max_new_tokens: int = 32, train_limit: int | None = None,
           eval_limit: int = 4, batch_size: int = 2, progress=None) -> Card:
    """Distil the registered aligned draft `name` towards `target` on its domain's prompt suite, then register
    the result as `<name>-distilled`. Checkpoints in `runs_root()/<name>` (a stopped run resumes there);
    `progress(step, steps, record)` hears every optimizer step. One distillation of `name` at a time (across
    processes); an exception raised by `progress` stops it after that step (the checkpoints stay, to resume)."""
    distilled = distilled_name(name)
    out = runs_root() / name
    with cache.locked(out, busy=f"{name} is already being distilled"):
        card = read_card(folder(name))
        if card.domain not in available_suites():
            raise ValueError(f"{name!r} has no prompt suite to distil on (domain {card.domain!r}); prepare it with "
                             f"one of {', '.join(available_suites())}")
        train, held_out = ([encode(p, target.tokenizer) for p in load_suite(card.domain, split=split, limit=limit)]
                           for split, limit in (("dev", train_limit), ("heldout", None)))
        config = DistillConfig(steps=steps, batch_size=batch_size, eval_every=0, checkpoint_every=max(1, steps // 4))
        dtype = "float32" if target.dtype in formats.CPU_ONLY else target.dtype  # an int8 model is not trained
        draft = load_model(card.spec, dtype=dtype, device=target.device)
        report = distill_to_folder(target, draft, train, held_out[:eval_limit], config, out,
                                   max_new_tokens=max_new_tokens, resume=True, on_step=progress)
        register_distilled(out / "draft", report, name=distilled, target=card.target, source=card.source,
                           domain=card.domain)
        return read_card(folder(distilled))


def distill_to_folder(target, draft, train: list[list[int]], held_out: list[list[int]], config: DistillConfig,
                      out: Path, *, max_new_tokens: int, on_policy: bool = False, resume: bool = False, on_step=None,
                      data: list[Example] | None = None) -> DistillReport:
    """Generate (or read) the data, distil with a progress bar, save draft/, report.json and loss.html.
    on_step(step, steps, record): called after every optimizer step too (the dashboard's job registry).
    data: training examples made by the caller (the aligned-draft recipe); else the target's greedy
    continuations of `train`, cached in out/data/."""
    from tqdm import tqdm

    state = process_state()
    with state.main_process_first():  # the main process generates the data; the others read its cache
        data = data if data is not None else cached_examples(target, train, out / "data",
                                                             max_new_tokens=max_new_tokens, model_name=target.name)
        if on_policy:
            data = data + cached_examples(draft, train, out / "data", max_new_tokens=max_new_tokens, source="draft",
                                    model_name=draft.name)
    bar = tqdm(total=config.steps, desc="distill", unit="step", disable=not state.is_main_process)
    def progress(step: int, steps: int, record: dict) -> None:
        bar.n = step
        bar.set_postfix(loss=f"{record['loss']:.3f}")
        if on_step is not None:
            on_step(step, steps, record)
    report = distill(target, draft, data, config=config, eval_prompts=held_out, checkpoint_dir=out / "checkpoint",
                     resume=resume, progress=progress)
    bar.close()
    if state.is_main_process:
        with files.atomic_path(out / "draft") as folder:
            save_aligned(draft.model, target.tokenizer, folder)
        files.write_text(out / "report.json", json.dumps(report.to_dict(), indent=1))
        write_plot(report, out / "loss.html")
    state.wait_for_everyone()  # every process returns once the folder is complete
    return report


def write_plot(report: DistillReport, path: Path) -> None:
    """Loss curve and held-out acceptance, one HTML file (plotly loaded here only)."""
    from plotly.subplots import make_subplots

    figure = make_subplots(rows=2, cols=1, shared_xaxes=True,
                           subplot_titles=("training loss (mean over continuation tokens)", "held-out greedy α̂"))
    steps = [r["step"] for r in report.losses]
    for name in ("loss", "ce", "divergence"):
        figure.add_scatter(x=steps, y=[r[name] for r in report.losses], name=name, row=1, col=1)
    figure.add_scatter(x=[e["step"] for e in report.evals], y=[e["acceptance_rate"] for e in report.evals],
                       name="α̂", mode="lines+markers", row=2, col=1)
    figure.update_xaxes(title_text="optimizer step", row=2, col=1)
    files.write_text(path, figure.to_html(include_plotlyjs=True))
