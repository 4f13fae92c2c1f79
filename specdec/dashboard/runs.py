"""Running the engine for the dashboard: request checks, a stop handle per session, streamed rounds.

The decode is the engine's own generator (`DecodeRequest.rounds`, `specdec.core.engine.speculative_rounds`),
resumed by the (generator) handler in its own thread: `stream` yields the rounds so far between two rounds, so
the page updates while nothing else runs, and the engine leaves that time out of its measurement. Stop sets the
session's `StopToken`, and so does the request's `Budget` once its time limit passes; the next round is then
sent False and the engine ends cleanly after the current round (result.stopped_early = True). Work before the
first round (loading, calibration, prefill) checks the same budget and stops with a BudgetExceeded. An error,
or a consumer that goes away, closes the decode where it paused, so a slot is always released.
"""
from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass

from specdec.core.costmodel import CostModel
from specdec.core.engine import Rounds, speculative_rounds
from specdec.core.limits import Budget
from specdec.core.schedule import mean_draft_length
from specdec.core.trace import DecodeStats, GenerationResult, Round

from specdec.dashboard.config import AppConfig, K_RANGE

AUTO = "auto"  # the k that lets the engine choose per round

UPDATE_INTERVAL_S = 1.0  # at most one page update a second: rendering shares the CPU (and the GIL) with the decode
TEMPERATURE_RANGE = (0.01, 10.0)  # sampling temperatures besides 0 (below 0.01, logits / T overflow to NaN)
SEED_MAX = 2**53  # largest seed: every JSON client (JavaScript included) holds it exactly


@dataclass
class DecodeRequest:
    """What one decode asks for (the API's inputs, checked)."""

    target: str  # catalogue name, or a folder / hub id when custom models are allowed
    draft: str  # catalogue name, "lookup", "self:L", or a custom folder / id
    prompt: str  # raw prompt text (no chat template)
    k: int | str  # draft tokens per round, or "auto" (the cost-aware controller of specdec.core.schedule)
    max_new_tokens: int  # new tokens at most
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0  # nucleus mass, 1 = off
    seed: int | None = 0  # sampling seed (None = random)

    def checked(self, config: AppConfig) -> "DecodeRequest":
        """Self, or a ValueError saying which input to change."""
        if not isinstance(self.prompt, str):
            raise ValueError(f"prompt must be text, got {type(self.prompt).__name__}")
        if not self.prompt.strip():
            raise ValueError("empty prompt: type a prompt or pick a preset")
        if len(self.prompt) > config.max_prompt_chars:
            raise ValueError(f"prompt is {len(self.prompt)} characters; this host takes at most "
                             f"{config.max_prompt_chars} (SPECDEC_MAX_PROMPT_CHARS)")
        if _unencodable(self.prompt):
            raise ValueError("prompt is not valid Unicode text (it has unpaired surrogates)")
        if self.k != AUTO and (not isinstance(self.k, int) or not K_RANGE[0] <= self.k <= K_RANGE[1]):
            raise ValueError(f"k must be 'auto' or an integer in {K_RANGE[0]}..{K_RANGE[1]}, got {self.k!r}")
        if not isinstance(self.max_new_tokens, int) or not 1 <= self.max_new_tokens <= config.max_new_tokens_cap:
            raise ValueError(f"max new tokens must be an integer in 1..{config.max_new_tokens_cap} on this host "
                             f"(SPECDEC_MAX_NEW_TOKENS), got {self.max_new_tokens!r}")
        if self.temperature != 0 and not TEMPERATURE_RANGE[0] <= self.temperature <= TEMPERATURE_RANGE[1]:
            raise ValueError(f"temperature must be 0 (greedy) or in {TEMPERATURE_RANGE[0]}..{TEMPERATURE_RANGE[1]}, "
                             f"got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top-p must be in (0, 1], got {self.top_p}")
        if self.seed is not None and not 0 <= self.seed <= SEED_MAX:
            raise ValueError(f"seed must be an integer in 0..{SEED_MAX} (2**53), got {self.seed}")
        return self

    def rounds(self, target_model, draft_model, costs: CostModel | None = None, budget: Budget = Budget()) -> Rounds:
        """This decode as the engine's generator of rounds, not started yet (`speculative_rounds`), within `budget`."""
        return speculative_rounds(target_model, draft_model, self.prompt, k=self.k, max_new_tokens=self.max_new_tokens,
                                  temperature=self.temperature, top_p=self.top_p, seed=self.seed, costs=costs,
                                  budget=budget)

    @classmethod
    def from_inputs(cls, target, draft, prompt, k, max_new_tokens, temperature=0.0, top_p=1.0, seed=0):
        """From UI / API values (numbers may arrive as floats; a blank seed means random)."""
        k = AUTO if str(k).strip().lower() == AUTO else _as_int(k, "k")
        return cls(str(target or "").strip(), str(draft or "").strip(), prompt or "", k,
                   _as_int(max_new_tokens, "max new tokens"), _as_float(temperature or 0.0, "temperature"),
                   _as_float(1.0 if top_p is None else top_p, "top-p"),
                   None if seed is None or seed == "" else _as_int(seed, "seed"))


class StopToken:
    """Stop flag of one request's decodes; the Stop button or the budget's time limit sets it, `running` reads it."""

    def __init__(self, budget: Budget = Budget()):
        self.budget = budget  # the request's prompt-token cap and deadline
        self.stopped = False  # True once Stop was pressed, the page went away or the time limit passed
        self.reason = "stopped by you"  # what the status line says when stopped

    def running(self, _round: Round | None = None) -> bool:
        """The engine's `on_round`: False once stopped (the time limit is checked here)."""
        if not self.stopped and self.budget.expired():
            self.stopped, self.reason = True, "stopped at this host's time limit (SPECDEC_TIME_LIMIT_S)"
        return not self.stopped


class RunControl:
    """A browser session's handle on its decode in flight (lives in a gr.State: one per session)."""

    def __init__(self):
        self.token = StopToken()  # the current request's stop flag
        self.waiting = False  # a request of this session is in the queue, not started yet
        self.stopped_while_waiting = False  # Stop was pressed during that wait

    def queued(self) -> "RunControl":
        """Run was clicked (called at once, before the request waits in the queue); returns itself, so Gradio
        keeps it as the session's state (and deletes it, `delete_callback`, once the session has ended)."""
        self.waiting, self.stopped_while_waiting = True, False
        return self

    def start(self, budget: Budget = Budget()) -> StopToken:
        """A fresh flag for a starting request (already set if Stop came while it was queued)."""
        self.token = StopToken(budget)
        if self.stopped_while_waiting:
            self.token.stopped, self.token.reason = True, "stopped by you before it started"
        self.waiting = self.stopped_while_waiting = False
        return self.token

    def stop(self) -> None:
        self.token.stopped = True
        self.stopped_while_waiting = self.waiting


def stream(rounds: Rounds, token: StopToken,
           interval_s: float = UPDATE_INTERVAL_S) -> Iterator[list[Round] | GenerationResult]:
    """Run the decode `rounds` here; yield the rounds so far (at most one update per interval_s), then the result.

    Each round is followed by `token.running()` (False: the engine stops after it). An engine error is raised
    here; a consumer that stops iterating closes the decode where it paused.
    """
    seen: list[Round] = []
    last_update = 0.0
    with contextlib.closing(rounds):
        try:
            round_ = next(rounds)
            while True:
                seen.append(round_)
                if time.perf_counter() - last_update >= interval_s:
                    last_update = time.perf_counter()
                    yield list(seen)
                round_ = rounds.send(token.running())
        except StopIteration as end:
            result = end.value
    yield result


def partial_result(rounds: list[Round], k: int | str, costs: CostModel | None = None) -> GenerationResult:
    """The rounds seen so far as a GenerationResult (stats from the engine's own aggregation)."""
    token_ids = [t for r in rounds for t in r.emitted_token_ids]
    k = mean_draft_length(rounds) if k == AUTO else k
    return GenerationResult(token_ids, rounds, DecodeStats.from_rounds(rounds, k, costs))


def _as_int(value, name: str) -> int:
    """An exact integer (ints and integer strings are never rounded through a float); else a ValueError."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lstrip("+-").isdigit() and len(value) < 40:
        return int(value)
    try:
        number = _as_float(value, name)
    except ValueError:
        number = math.nan
    if not math.isfinite(number) or number != int(number):
        raise ValueError(f"{name} must be an integer, got {_shown(value)}")
    return int(number)


def _as_float(value, name: str) -> float:
    """A finite float from a number or a numeric string; else a ValueError naming the input."""
    try:
        number = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError, OverflowError):
        number = math.nan
    if not math.isfinite(number):
        raise ValueError(f"{name} must be a finite number, got {_shown(value)}")
    return number


def _shown(value) -> str:
    """`value` for an error message, cut short (a visitor may send megabytes)."""
    text = repr(value)
    return text if len(text) <= 40 else text[:40] + "…"


def _unencodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False
