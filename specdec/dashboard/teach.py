"""The step-through's runner: a decode that pauses after every round until it is asked for the next one.

`Stepper` runs the engine's own decode in a worker thread that pauses after every round (`on_round` blocks
until the next call; returning False ends the decode), so "Next round" costs exactly one engine round. The
step-through section (`specdec.dashboard.tabs.step`) holds one per browser session.
"""
from __future__ import annotations

import queue
import threading
from typing import Callable

from specdec.core.trace import GenerationResult, Round

IDLE_S = 600.0  # a paused step-through ends (its worker thread returns) after this long without a click; its
# session state is deleted (`tabs.step.StepSession.close`: models and KV cache let go) as long after the last click


class Stepper:
    """A decode that advances one engine round per `next_round` call.

    run(on_round) starts the decode (e.g. `speculative_generate(..., on_round=on_round)`); it runs in a
    worker thread that blocks inside on_round after every round until the next call (or `close`).
    """

    def __init__(self, run: Callable[[Callable[[Round], bool]], GenerationResult], idle_s: float = IDLE_S):
        self._run = run
        self._events: queue.Queue = queue.Queue()  # rounds, then the GenerationResult (or an exception)
        self._go = threading.Semaphore(0)  # one permit per "next round"
        self._thread: threading.Thread | None = None
        self.idle_s = idle_s
        self.closed = False
        self.rounds: list[Round] = []  # rounds so far, in order
        self.result: GenerationResult | None = None  # set once the engine returned

    def next_round(self) -> Round | None:
        """Run one more round and return it; None once the decode has ended (then `result` is set)."""
        if self.result is not None or self.closed:
            return None
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, daemon=True, name="specdec-step")
            self._thread.start()
        else:
            self._go.release()
        item = self._events.get()
        if isinstance(item, BaseException):
            self.closed = True
            raise item
        if isinstance(item, GenerationResult):
            self.result = item
            return None
        self.rounds.append(item)
        return item

    def close(self) -> None:
        """End the decode after the round it is paused on."""
        self.closed = True
        self._go.release()

    def _on_round(self, round_: Round) -> bool:
        self._events.put(round_)
        return self._go.acquire(timeout=self.idle_s) and not self.closed

    def _work(self) -> None:
        try:
            self._events.put(self._run(self._on_round))
        except BaseException as error:  # noqa: BLE001 - handed to the caller's thread, which re-raises it
            self._events.put(error)
