"""The step-through's runner: a decode that advances one engine round per click.

`Stepper` resumes the engine's own decode (`specdec.core.engine.speculative_rounds`, a generator paused after
every round) once per call, so "Next round" costs exactly one engine round and nothing runs between clicks.
The step-through section (`specdec.dashboard.tabs.step`) holds one per browser session.
"""
from __future__ import annotations

from specdec.core.engine import Rounds
from specdec.core.trace import GenerationResult, Round

IDLE_S = 600.0  # a paused step-through's session state is deleted (`tabs.step.StepSession.close`: the paused
# decode closed, models and KV cache let go) this long after its last click


class Stepper:
    """A decode that advances one engine round per `next_round` call.

    `rounds` is the engine's generator of the decode (e.g. `DecodeRequest.rounds`); each call resumes it for one
    round. Between calls it holds its caches and runs nothing.
    """

    def __init__(self, rounds: Rounds):
        self._rounds = rounds
        self.closed = False
        self.rounds: list[Round] = []  # rounds so far, in order
        self.result: GenerationResult | None = None  # set once the engine returned

    def next_round(self) -> Round | None:
        """Run one more round and return it; None once the decode has ended (then `result` is set)."""
        if self.result is not None or self.closed:
            return None
        try:
            round_ = next(self._rounds)
        except StopIteration as end:
            self.result = end.value
            return None
        except BaseException:
            self.close()
            raise
        self.rounds.append(round_)
        return round_

    def close(self) -> None:
        """End the decode where it paused (after its last round)."""
        self.closed = True
        self._rounds.close()
