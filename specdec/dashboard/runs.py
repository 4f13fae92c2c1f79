"""Running the engine for the dashboard: request checks, a stop handle per session, streamed rounds.

The engine calls `on_round` after every round; the decode runs in a worker thread whose rounds
reach the (generator) handler through a queue, so the page updates while the target verifies.
Stop sets the session's `StopToken`; `on_round` then returns False and the engine ends cleanly
after the current round (result.stopped_early = True).
"""
from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from specdec import DecodeStats, GenerationResult, Round
from specdec.costs import CostModel
from specdec.schedule import mean_draft_length

from .config import K_RANGE, AppConfig

AUTO = "auto"  # the k that lets the engine choose per round

UPDATE_INTERVAL_S = 1.0  # at most one page update a second: rendering shares the CPU (and the GIL) with the decode


@dataclass
class DecodeRequest:
    """What one decode asks for (the API's inputs, checked)."""

    target: str  # catalogue name, or a folder / hub id when custom models are allowed
    draft: str  # catalogue name, "lookup", "self:L", or a custom folder / id
    prompt: str  # raw prompt text (no chat template)
    k: int | str  # draft tokens per round, or "auto" (the cost-aware controller of specdec.schedule)
    max_new_tokens: int  # new tokens at most
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0  # nucleus mass, 1 = off
    seed: int | None = 0  # sampling seed (None = random)

    def checked(self, config: AppConfig) -> "DecodeRequest":
        """Self, or a ValueError saying which input to change."""
        if not self.prompt or not self.prompt.strip():
            raise ValueError("empty prompt: type a prompt or pick a preset")
        if self.k != AUTO and (not isinstance(self.k, int) or not K_RANGE[0] <= self.k <= K_RANGE[1]):
            raise ValueError(f"k must be 'auto' or an integer in {K_RANGE[0]}..{K_RANGE[1]}, got {self.k!r}")
        if not isinstance(self.max_new_tokens, int) or not 1 <= self.max_new_tokens <= config.max_new_tokens_cap:
            raise ValueError(f"max new tokens must be an integer in 1..{config.max_new_tokens_cap} on this host "
                             f"(SPECDEC_MAX_NEW_TOKENS), got {self.max_new_tokens!r}")
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        return self

    @classmethod
    def from_inputs(cls, target, draft, prompt, k, max_new_tokens, temperature=0.0, top_p=1.0, seed=0):
        """From UI / API values (numbers may arrive as floats; a blank seed means random)."""
        k = AUTO if str(k).strip().lower() == AUTO else _as_int(k, "k")
        return cls(str(target or "").strip(), str(draft or "").strip(), prompt or "", k,
                   _as_int(max_new_tokens, "max new tokens"), float(temperature or 0.0), float(top_p or 1.0),
                   None if seed is None or seed == "" else _as_int(seed, "seed"))


class StopToken:
    """Stop flag of one decode; the Stop button sets it, `on_round` reads it."""

    def __init__(self):
        self.stopped = False  # True once Stop was pressed (or the page went away)


class RunControl:
    """A browser session's handle on its decode in flight (lives in a gr.State: one per session)."""

    def __init__(self):
        self.token = StopToken()  # the current decode's stop flag

    def start(self) -> StopToken:
        """A fresh flag for a new decode (an older decode keeps its own)."""
        self.token = StopToken()
        return self.token

    def stop(self) -> None:
        self.token.stopped = True


def stream(decode: Callable[[Callable[[Round], bool]], GenerationResult], token: StopToken,
           interval_s: float = UPDATE_INTERVAL_S) -> Iterator[list[Round] | GenerationResult]:
    """Run `decode(on_round)` in a worker thread; yield the rounds so far (batched), then the result.

    An engine error is re-raised here. If the consumer stops iterating, the decode is told to stop.
    """
    events: queue.Queue = queue.Queue()

    def on_round(round_: Round) -> bool:
        events.put(round_)
        return not token.stopped

    def work() -> None:
        try:
            events.put(decode(on_round))
        except Exception as error:  # noqa: BLE001 - handed to the consumer thread, which re-raises it
            events.put(error)

    threading.Thread(target=work, daemon=True, name="specdec-decode").start()
    rounds: list[Round] = []
    last_update = 0.0
    try:
        while True:
            item = events.get()
            if isinstance(item, Exception):
                raise item
            if isinstance(item, GenerationResult):
                yield item
                return
            rounds.append(item)
            if time.perf_counter() - last_update >= interval_s:
                last_update = time.perf_counter()
                yield list(rounds)
    finally:
        token.stopped = True  # normal end: no effect; consumer gone: the worker ends after its round


def partial_result(rounds: list[Round], k: int | str, costs: CostModel | None = None) -> GenerationResult:
    """The rounds seen so far as a GenerationResult (stats from the engine's own aggregation)."""
    token_ids = [t for r in rounds for t in r.emitted_token_ids]
    k = mean_draft_length(rounds) if k == AUTO else k
    return GenerationResult(token_ids, rounds, DecodeStats.from_rounds(rounds, k, costs))


def _as_int(value, name: str) -> int:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be an integer, got {value!r}") from None
    if number != int(number):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    return int(number)
