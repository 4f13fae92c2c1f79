"""An in-process model pool shared by the app and the CLI: each model loaded once, within a memory budget.

Models are keyed by (spec, dtype, device). When a new model pushes the pool over its budget, the
least recently used models are dropped (the new one always stays, even alone over budget). A model
still referenced elsewhere (a running generation) stays in memory until that reference goes; the
pool only stops holding it. Loads are thread-safe: two threads asking for the same model wait for
one load, while loads of different models proceed independently.
"""
from __future__ import annotations

import os
import threading
from collections import OrderedDict

from .loading import LoadedModel, load_draft, load_model, resolve_device, resolve_dtype

BUDGET_FRACTION = 0.6  # default budget: this share of the machine's RAM


def default_budget_bytes() -> int:
    """$SPECDEC_POOL_GB if set, else BUDGET_FRACTION of total memory."""
    if os.environ.get("SPECDEC_POOL_GB"):
        return int(float(os.environ["SPECDEC_POOL_GB"]) * 2**30)
    import psutil

    return int(psutil.virtual_memory().total * BUDGET_FRACTION)


class ModelPool:
    """Loaded models by (spec, dtype, device), least recently used first."""

    def __init__(self, budget_bytes: int | None = None, loader=load_model):
        self.budget_bytes = default_budget_bytes() if budget_bytes is None else budget_bytes
        self.loader = loader  # load_model, or a stand-in in tests
        self._models: OrderedDict[tuple, LoadedModel] = OrderedDict()
        self._lock = threading.Lock()  # guards _models and _key_locks
        self._key_locks: dict[tuple, threading.Lock] = {}  # one load at a time per key

    def get(self, spec: str, *, dtype="auto", device: str = "auto", trust_remote_code: bool = False,
            progress=None) -> LoadedModel:
        """The model for `spec`, loaded on first use."""
        device = resolve_device(device)
        key = (spec.strip() if isinstance(spec, str) else spec, resolve_dtype(dtype, device), device,
               trust_remote_code)
        with self._lock:
            key_lock = self._key_locks.setdefault(key, threading.Lock())
        with key_lock:
            with self._lock:
                if key in self._models:
                    self._models.move_to_end(key)
                    return self._models[key]
            loaded = self.loader(spec, dtype=key[1], device=device, trust_remote_code=trust_remote_code,
                                 progress=progress)
            with self._lock:
                self._models[key] = loaded
                self._evict(keep=key)
            return loaded

    def draft(self, spec: str, target: LoadedModel, *, dtype="auto", bridge="auto", progress=None):
        """`load_draft` through this pool."""
        return load_draft(spec, target, dtype=dtype, bridge=bridge, device=target.device, pool=self,
                          progress=progress)

    def loaded(self) -> list[LoadedModel]:
        """Held models, least recently used first."""
        with self._lock:
            return list(self._models.values())

    @property
    def used_bytes(self) -> int:
        return sum(m.memory_bytes for m in self.loaded())

    def clear(self) -> None:
        with self._lock:
            self._models.clear()

    def _evict(self, keep: tuple) -> None:
        used = sum(m.memory_bytes for m in self._models.values())
        for key in [k for k in self._models if k != keep]:
            if used <= self.budget_bytes:
                break
            used -= self._models.pop(key).memory_bytes


_default_pool: ModelPool | None = None
_default_lock = threading.Lock()


def default_pool() -> ModelPool:
    """The process-wide pool (created on first use)."""
    global _default_pool
    with _default_lock:
        if _default_pool is None:
            _default_pool = ModelPool()
        return _default_pool
