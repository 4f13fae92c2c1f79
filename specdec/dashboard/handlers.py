"""Handlers the tabs share: plain functions from input values to output values (testable without a browser).

Each tab's own handlers live in its module (`specdec.dashboard.tabs`); these are the pieces more than one tab
(or the API) uses. The first parameter of each model handler is the `ModelHub` (bound with functools.partial
where the event is wired). Bad input raises ValueError inside; `user_errors` turns it into a visible gr.Error.
"""
from __future__ import annotations

import functools
import inspect

import gradio as gr

from specdec.core.engine import run_rounds
from specdec.core.limits import Budget
from specdec.core.trace import GenerationResult
from specdec.costs.waterfall import Step
from specdec.lab import plots as figures
from specdec.lab.recording import target_alone
from specdec.models import cache

from specdec.dashboard.hub import ModelHub
from specdec.dashboard.runs import DecodeRequest, StopToken

NO_DRAFT = ("(none)", "")  # the choice that leaves a compare column empty


def user_errors(handler):
    """Show a ValueError (bad input, with the engine's message) as a gr.Error, without the cache's location
    (`cache.redact`); the app keeps serving."""
    if inspect.isgeneratorfunction(handler):
        @functools.wraps(handler)
        def generator(*args, **kwargs):
            try:
                yield from handler(*args, **kwargs)
            except ValueError as error:
                raise gr.Error(cache.redact(str(error)), print_exception=False) from error
        return generator

    @functools.wraps(handler)
    def plain(*args, **kwargs):
        try:
            return handler(*args, **kwargs)
        except ValueError as error:
            raise gr.Error(cache.redact(str(error)), print_exception=False) from error
    return plain


def model_choices(hub: ModelHub, compare_columns: int):
    """Fresh dropdown choices (each label says ready / needs assembly / needs download as it is now): the live
    tab's target and draft, the compare tab's target and its `compare_columns` drafts."""
    targets, drafts = hub.choices("target"), hub.choices("draft")
    return (gr.update(choices=targets), gr.update(choices=drafts), gr.update(choices=targets),
            *[gr.update(choices=drafts + [NO_DRAFT]) for _ in range(compare_columns)])


@user_errors
def speculate(hub: ModelHub, target, draft, prompt, k, max_new_tokens, temperature, seed) -> dict:
    """API `speculate`: one speculative decode as JSON (GenerationResult.to_dict(): token ids, text, rounds, stats)."""
    request = DecodeRequest.from_inputs(target, draft, prompt, k, max_new_tokens, temperature, 1.0,
                                        seed).checked(hub.config)
    token = StopToken(hub.config.request_budget())
    target_model, draft_model = hub.pair(request.target, request.draft, budget=token.budget)
    check_prompt(target_model, request, token.budget)
    costs = hub.costs(target_model, draft_model, budget=token.budget)
    return run_speculative(target_model, draft_model, request, token.running, costs, token.budget).to_dict()


def run_speculative(target_model, draft_model, request: DecodeRequest, on_round=None, costs=None,
                    budget: Budget = Budget()) -> GenerationResult:
    """The engine's speculative decode of `request` with a loaded pair, within the request's `budget`."""
    return run_rounds(request.rounds(target_model, draft_model, costs, budget), on_round)


def run_baseline(target_model, request: DecodeRequest, new_tokens: int, token: StopToken) -> GenerationResult:
    """The target alone on the same prompt and settings, for `new_tokens` tokens, within the request's budget."""
    return target_alone(target_model, request.prompt, new_tokens, request.temperature, request.top_p, request.seed,
                        token.running, token.budget)


def check_prompt(target_model, request: DecodeRequest, budget: Budget) -> None:
    """The request's prompt within the budget's token cap, in the target's tokens (before any draft or prefill)."""
    budget.check_prompt(len(target_model.tokenizer(request.prompt)["input_ids"]))


def waterfall_figure(steps: list[Step], title: str = "from the bound to the measurement"):
    """The steps as a waterfall: the first bar absolute, then each step's change, the last a total."""
    top = max([s.value for s in steps] + [1.0])
    return figures.figure(title, "", "speedup over the target alone",
                          [figures.Series("speedup", [s.label for s in steps], [s.value for s in steps],
                                          kind="waterfall", text=[f"{s.value:.2f}×" for s in steps],
                                          hover=[s.formula for s in steps])], y_range=(0, top * 1.3))
