"""Recordings: a finished run of an app preset kept as JSON, so the Live tab shows a first look at once.

`python -m specdec record` runs each prompt preset (`specdec.lab.presets`) with the app's default pair and
settings through the engine's decode and then the target alone (`target_alone`, the app's baseline too), and
writes `assets/recordings/<preset slug>.json`: both runs as the engine returned them (`GenerationResult.to_dict`,
every figure as measured), the pair, k, each loaded model's weight format, the hardware
(`specdec.core.hardware.describe`), the date and the code version, and the texts the round table and the
status line decoded (`Transcript`), so a replay renders them with no model and no tokenizer loaded. A file that
is not a recording, of another format version, or damaged is refused with one line naming it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path

from specdec.core import files, hardware
from specdec.core.costmodel import CostModel
from specdec.core.engine import autoregressive_generate, speculative_generate
from specdec.core.limits import Budget
from specdec.core.trace import DecodeStats, GenerationResult, Round
from specdec.lab import presets
from specdec.lab.report import baseline_lines, round_rows

FORMAT = "specdec recording"  # the "format" field every recording carries
VERSION = 2  # bump when the fields change meaning (2: a round's leaves, the counts of leaves)
FOLDER = files.ASSETS / "recordings"  # where the app looks for them
REMEDY = "record one with `python -m specdec record`"  # what a refusal suggests


class Transcript:
    """A tokenizer's `decode` as the renderers call it, kept as texts: recorded through the real tokenizer, then
    read back without it. A sequence it did not see decodes as its tokens' own texts joined (what a byte-level
    BPE decodes, but where a character spans two tokens). Special tokens stay in, as the renderers ask."""

    def __init__(self, texts: dict[str, str], tokenizer=None):
        self.texts = texts  # token ids joined by "," -> their text
        self.tokenizer = tokenizer  # the real tokenizer while recording; None when read back

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        key = ",".join(str(int(t)) for t in ids)
        if key not in self.texts and self.tokenizer is not None:
            self.texts[key] = self.tokenizer.decode([int(t) for t in ids], skip_special_tokens=False)
        if key in self.texts:
            return self.texts[key]
        return "".join(self.texts.get(str(int(t)), f"<{int(t)}>") for t in ids)


@dataclass
class Recording:
    """A finished run of one preset and the target alone on it, and where and when they were measured."""

    preset: str  # the preset's name (`specdec.lab.presets.PROMPTS`)
    prompt: str  # its prompt text
    target: str  # the target's name
    draft: str  # the draft as given: a model name, "lookup", "self:L"
    k: int | str  # draft tokens per round asked for, or "auto"
    max_new_tokens: int  # new tokens at most
    temperature: float  # 0 = greedy
    formats: dict[str, str]  # each loaded model's name -> its weight format ("int8", "float32", ...)
    hardware: dict  # `specdec.core.hardware.describe()` of the machine it ran on
    date: str  # when it was measured, ISO 8601 UTC
    code_version: str  # `specdec.core.hardware.code_version()` of the code that measured it
    result: GenerationResult  # the speculative run, as the engine returned it
    baseline: GenerationResult  # the target alone on the same prompt, for as many new tokens
    texts: dict[str, str]  # what the renderers decoded: token ids joined by "," -> text (`Transcript`)
    source: str = field(default="", compare=False)  # the file it was read from ("" when made here)

    @property
    def machine(self) -> str:
        """The hardware in a few words (`hardware.label`)."""
        return hardware.label(self.hardware)

    @property
    def tokenizer(self) -> Transcript:
        """What the renderers decode with in place of the target's tokenizer."""
        return Transcript(self.texts)

    def to_dict(self) -> dict:
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "source"}
        data["result"], data["baseline"] = self.result.to_dict(), self.baseline.to_dict()
        return {"format": FORMAT, "version": VERSION, **data}


def target_alone(target, prompt, new_tokens: int, temperature: float = 0.0, top_p: float = 1.0, seed: int | None = 0,
                 on_round=None, budget: Budget = Budget()) -> GenerationResult:
    """The target alone on the same prompt and settings, for as many new tokens as the speculative run made (at
    least one): the measured speedup's baseline, the app's and its recordings'."""
    return autoregressive_generate(target, prompt, max_new_tokens=max(1, new_tokens), temperature=temperature,
                                   top_p=top_p, seed=seed, on_round=on_round, budget=budget)


def record(target, draft, draft_name: str, preset: str, k: int | str, max_new_tokens: int, costs: CostModel | None,
           formats: dict[str, str]) -> Recording:
    """Run `preset` greedily with the loaded pair (`draft_name` as given) and then the target alone, as the app's
    Live tab does with its defaults; `formats`: each loaded model's weight format."""
    prompt = presets.preset(preset)
    result = speculative_generate(target, draft, prompt, k=k, max_new_tokens=max_new_tokens, seed=0, costs=costs)
    baseline = target_alone(target, prompt, len(result.token_ids))
    transcript = Transcript({}, target.tokenizer)
    for token in sorted({t for r in result.rounds for t in (*r.draft_token_ids, r.target_token_id)}
                        | set(baseline.token_ids)):
        transcript.decode([token])  # each token's own text: what an unseen sequence is made of
    round_rows(result, transcript)
    baseline_lines(result, baseline, True, target.dtype, transcript)
    return Recording(preset, prompt, target.name, draft_name, k, max_new_tokens, 0.0, dict(formats),
                     hardware.describe(str(target.device)), datetime.now(timezone.utc).isoformat(timespec="seconds"),
                     hardware.code_version(), result, baseline, transcript.texts)


def path_of(preset: str, folder: str | Path = FOLDER) -> Path:
    """The recording file of `preset` in `folder`."""
    return Path(folder) / f"{presets.slug(preset)}.json"


def save_recording(recording: Recording, folder: str | Path = FOLDER) -> Path:
    """Write `recording` as `folder/<preset slug>.json` (atomically); returns the path."""
    path = path_of(recording.preset, folder)
    files.write_json(path, recording.to_dict())
    return path


def load_recording(path: str | Path) -> Recording:
    """The recording in `path`; a ValueError of one line naming the file when it is not one this version reads."""
    names = [f.name for f in fields(Recording) if f.name != "source"]
    data = files.read_json(Path(path), "recording", FORMAT, VERSION, names, REMEDY)
    try:
        runs = {name: result_of(data[name]) for name in ("result", "baseline")}
    except (TypeError, KeyError, AttributeError, ValueError) as error:
        raise ValueError(f"{path}: a damaged recording (its runs do not read: {type(error).__name__})") from None
    recording = Recording(**{**{name: data[name] for name in names}, **runs}, source=str(path))
    problem = _problem(recording)
    if problem:
        raise ValueError(f"{path}: a damaged recording ({problem})")
    return recording


def recorded(preset: str, folder: str | Path = FOLDER) -> Recording | None:
    """The recording of `preset` in `folder`, or None when there is none (a bad one: a ValueError naming it)."""
    path = path_of(preset, folder)
    return load_recording(path) if path.is_file() else None


def result_of(data: dict) -> GenerationResult:
    """A GenerationResult from its `to_dict()` form: the rounds and the stats as they were measured."""
    missing = {f.name for f in fields(DecodeStats)} - set(data["stats"])
    if missing:
        raise KeyError(sorted(missing)[0])
    rounds = [Round(**{name: value for name, value in r.items() if name != "is_bonus"}) for r in data["rounds"]]
    return GenerationResult(list(data["token_ids"]), rounds, DecodeStats(**data["stats"]), data["text"],
                            bool(data["stopped_early"]))


def _problem(recording: Recording) -> str | None:
    """What makes a read recording unusable (one phrase), or None."""
    for name, run in (("result", recording.result), ("baseline", recording.baseline)):
        if not all(_numbers(getattr(run.stats, f.name)) for f in fields(DecodeStats)):
            return f"the {name}'s stats must be numbers"
    if not all(isinstance(getattr(recording, name), str) for name in ("preset", "prompt", "target", "draft", "date")):
        return "preset, prompt, target, draft and date must be text"
    if not isinstance(recording.hardware, dict) or not isinstance(recording.formats, dict):
        return "hardware and formats must be objects"
    if not isinstance(recording.texts, dict) or not all(isinstance(t, str) for t in recording.texts.values()):
        return "texts must map token ids to text"
    return None


def _numbers(value) -> bool:
    """A finite number, or a list of them."""
    if isinstance(value, list):
        return all(_numbers(v) for v in value)
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
