"""Every limit in one place: on the draft length k (the engine, the k controller, the advisor, the dashboard and
the CLI import these; nothing else states a largest k), and on what one request may spend (`Budget`)."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

K_MAX = 16  # largest fixed k the engine, the CLI and the advisor accept (verification of <= 17 tokens)
K_AUTO_START = 4  # k of the first round of k="auto", before anything is measured
K_AUTO_MAX = 8  # largest k the k="auto" controller may choose (and the largest size `specdec.costs.calibration` calibrates)
LEAVES_MAX = 2  # greedy, k="auto": most leaves (a draft's second choices) a verification reads beside the chain
K_UI_MAX = 10  # largest k the dashboard offers (its k slider, the theory tab's sweep and axis)


class BudgetExceeded(ValueError):
    """A request went past its `Budget` (a ValueError: one clear line, like any refused input)."""


@dataclass(frozen=True)
class Budget:
    """What one request may spend: prompt tokens, and wall seconds from its start (loading, calibration, prefill,
    every decode). Work checks it between pieces (`check`); a decode's rounds stop once it `expired`.
    Budget() is no limit."""

    seconds: float | None = None  # wall time from `started`; None = no limit
    prompt_tokens: int | None = None  # longest prompt in the target's tokens; None = no cap
    started: float = field(default_factory=time.monotonic)  # time.monotonic() when the request started

    @property
    def deadline(self) -> float:
        """time.monotonic() past which the request stops."""
        return math.inf if self.seconds is None else self.started + self.seconds

    def expired(self) -> bool:
        return time.monotonic() > self.deadline

    def check(self, doing: str) -> None:
        """BudgetExceeded, naming what the request was `doing`, once the deadline has passed."""
        if self.expired():
            raise BudgetExceeded(f"stopped at the time limit of {self.seconds:g} s while {doing}")

    def check_prompt(self, tokens: int) -> None:
        """BudgetExceeded when a prompt of `tokens` tokens is over the cap (before anything reads it)."""
        if self.prompt_tokens is not None and tokens > self.prompt_tokens:
            raise BudgetExceeded(f"prompt is {tokens} tokens; at most {self.prompt_tokens} are allowed here: "
                                 "shorten it")
