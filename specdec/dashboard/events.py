"""How the tabs wire their handlers: every UI event stays off the app's API (the API is `/speculate` alone),
events that run a model share one queue slot, and on a ZeroGPU Space that work runs under a GPU lease.

`spaces` is Hugging Face's ZeroGPU package: a Space provides it, nothing here installs it; without it
`on_gpu` leaves a handler as it is.
"""
from __future__ import annotations

try:
    import spaces  # optional: present on a Hugging Face Space
except ImportError:
    spaces = None

from specdec.dashboard.config import AppConfig

DECODE = "decode"  # concurrency id of every event that runs a model (SPECDEC_CONCURRENCY of them at once)
LOAD_S = 60  # lease time on top of the request's time limit: a first load of the pair and its calibration


def private(trigger, fn, inputs=None, outputs=None, **options):
    """`trigger(fn, inputs, outputs, **options)` (e.g. `button.click`, `event.then`) as an event no API client
    sees; returns the event, to chain on."""
    return trigger(fn, inputs, outputs, api_visibility="private", **options)


def on_gpu(fn, config: AppConfig):
    """`fn` under `@spaces.GPU` when `spaces` is importable, else `fn` itself.

    One lease covers the whole request: the time limit bounds the decode and the target-alone baseline together
    (they share one stop token), so the baseline runs in the same lease as the decode it is compared with."""
    if spaces is None:
        return fn
    return spaces.GPU(duration=config.time_limit_s + LOAD_S)(fn)
