"""An in-process model pool shared by the app and the CLI: each model loaded once, within a memory budget.

Models are keyed by (name, dtype, device), a catalogue name in its catalogue spelling. The budget is
a share of the memory this process may use (a container's cgroup limit when there is one, else the
machine's RAM). A model's size is estimated before it loads (a catalogue entry's parameter count, a
folder's safetensors headers); the least recently used models are dropped first to make room, and a
model that cannot fit even alone is refused. A model of unknown size (a hub id not yet downloaded, a
new .gguf) is measured once loaded and the others dropped then (it always stays, even alone over
budget). A model still referenced elsewhere (a running generation) stays in memory until that
reference goes; the pool only stops holding it. Loads are thread-safe: two threads asking for the same
model wait for one load, while loads of different models proceed independently (each reserves its
estimate meanwhile).
"""
from __future__ import annotations

import functools
import json
import math
import os
import struct
import threading
from collections import OrderedDict
from pathlib import Path
from typing import NamedTuple

from specdec.models import entries
from specdec.models.loading import LoadedModel, load_draft, load_model, resolve_device, resolve_dtype

BUDGET_FRACTION = 0.6  # default budget: this share of the memory limit
CGROUP_LIMITS = (Path("/sys/fs/cgroup/memory.max"),  # cgroup v2
                 Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"))  # cgroup v1
DTYPE_BYTES = {"float32": 4, "bfloat16": 2,
               "int8": 1.25, "int8-dynamic": 1.25,  # int8: a byte a weight (fbgemm's packed copy), the head again
               "int4": 1, "int4-dynamic": 1,  # int4: 0.625 a weight on the compiled product (codes, float16 scales),
               # more on torch's kernel, whose head and 6-bit-and-wider layers stay int8: 1 bounds both
               "auto": 4}  # auto: not measured before the first load, so the widest format is reserved
SCALES = {"K": 1e3, "M": 1e6, "B": 1e9}  # suffixes of a catalogue entry's parameter count


def memory_limit() -> tuple[int, str]:
    """(bytes this process may use, what set it): the cgroup limit when lower than the RAM, else the RAM."""
    import psutil

    ram = psutil.virtual_memory().total
    for path in CGROUP_LIMITS:
        try:
            limit = int(path.read_text().strip())  # "max" (no limit) fails here
        except (OSError, ValueError):
            continue
        if limit < ram:
            return limit, "container memory limit"
    return ram, "RAM"


def default_budget_bytes() -> int:
    """$SPECDEC_POOL_GB if set, else BUDGET_FRACTION of `memory_limit()`."""
    if os.environ.get("SPECDEC_POOL_GB"):
        return int(float(os.environ["SPECDEC_POOL_GB"]) * 2**30)
    return int(memory_limit()[0] * BUDGET_FRACTION)


def pool_key(spec: str) -> str:
    """The name a model is held under: a catalogue name in its own spelling, else the spec stripped."""
    spec = spec.strip()
    entry = entries.find(spec)
    return entry.name if entry is not None else spec


def estimate_bytes(spec: str, dtype: str) -> int | None:
    """Memory of `spec`'s weights in `dtype`, known before loading it; None when not known yet."""
    entry = entries.find(spec)
    if entry is not None:
        return int(float(entry.parameters[:-1]) * SCALES[entry.parameters[-1].upper()] * DTYPE_BYTES[dtype])
    folder = Path(spec).expanduser()
    files = sorted(folder.glob("*.safetensors")) if folder.is_dir() else []
    try:
        return int(sum(_tensor_elements(f) for f in files) * DTYPE_BYTES[dtype]) if files else None
    except (OSError, ValueError, KeyError, TypeError, struct.error):  # a damaged header: the load says why
        return None


def _tensor_elements(path: Path) -> int:
    """Parameters stored in a safetensors file, read from its header (8-byte length, then JSON)."""
    with open(path, "rb") as file:
        (length,) = struct.unpack("<Q", file.read(8))
        header = json.loads(file.read(length))
    return sum(math.prod(t["shape"]) for name, t in header.items() if name != "__metadata__")


class NotLoaded(LookupError):
    """A model asked for from memory only (`ModelPool.get(..., held_only=True)`) that is not there."""


class Held(NamedTuple):
    """A model in the pool and what it was asked for."""

    spec: str  # the name it is held under (`pool_key`)
    dtype: str  # the format asked for: "auto" (measured fastest here for its role at load) or one of FORMATS
    role: str  # "target", "draft" or "train": the role "auto" chose its format for
    model: LoadedModel


def _gb(size: int) -> str:
    return f"{size / 2**30:.1f} GB"


class ModelPool:
    """Loaded models by (spec, dtype, device), least recently used first."""

    def __init__(self, budget_bytes: int | None = None, loader=load_model, estimate=estimate_bytes):
        self.budget_bytes = default_budget_bytes() if budget_bytes is None else budget_bytes
        self.loader = loader  # load_model, or a stand-in in tests
        self.estimate = estimate  # (spec, dtype) -> bytes or None, before loading
        self._models: OrderedDict[tuple, LoadedModel] = OrderedDict()
        self._lock = threading.Lock()  # guards _models, _key_locks and _reserved
        self._key_locks: dict[tuple, threading.Lock] = {}  # one load at a time per key
        self._reserved: dict[tuple, int] = {}  # estimates of the loads in progress

    def get(self, spec: str, *, dtype="auto", device: str = "auto", trust_remote_code: bool = False,
            progress=None, role: str = "target", held_only: bool = False) -> LoadedModel:
        """The model for `spec`, loaded on first use (dtype "auto": the format measured fastest here for `role`).
        `held_only`: only a model in memory already, its place in the least-recently-used order kept; NotLoaded
        otherwise."""
        if not isinstance(spec, str) or not spec.strip():
            raise ValueError(f"a model spec must be a non-empty string, got {spec!r}")
        device = resolve_device(device)
        dtype = dtype if dtype == "auto" else resolve_dtype(dtype, device)  # auto: measured at the first load
        key = (pool_key(spec), dtype, role, device, trust_remote_code)
        if held_only:
            with self._lock:
                if key not in self._models:
                    raise NotLoaded(f"{key[0]} is not in memory as a {role}")
                return self._models[key]
        with self._lock:
            key_lock = self._key_locks.setdefault(key, threading.Lock())
        with key_lock:
            with self._lock:
                if key in self._models:
                    self._models.move_to_end(key)
                    return self._models[key]
            self._make_room(key, self.estimate(key[0], key[1]))
            try:
                loaded = self.loader(key[0], dtype=dtype, device=device, trust_remote_code=trust_remote_code,
                                     progress=progress, role=role)
            finally:
                with self._lock:
                    self._reserved.pop(key, None)
            with self._lock:
                self._models[key] = loaded
                self._evict(keep=key)
            return loaded

    def draft(self, spec: str, target: LoadedModel, *, dtype="auto", bridge="auto", progress=None,
              held_only: bool = False):
        """`load_draft` through this pool (`held_only`: from models in memory only, as in `get`)."""
        return load_draft(spec, target, dtype=dtype, bridge=bridge, device=target.device,
                          load=functools.partial(self.get, held_only=held_only), progress=progress)

    def loaded(self) -> list[LoadedModel]:
        """Held models, least recently used first."""
        return [held.model for held in self.held()]

    def held(self) -> list[Held]:
        """Held models with what each was asked for, least recently used first."""
        with self._lock:
            return [Held(spec, dtype, role, model) for (spec, dtype, role, *_), model in self._models.items()]

    @property
    def used_bytes(self) -> int:
        return sum(m.memory_bytes for m in self.loaded())

    def describe(self) -> str:
        """One line for a status bar: what is held, the budget, and where the budget comes from."""
        limit, source = memory_limit()
        budget = ("SPECDEC_POOL_GB" if os.environ.get("SPECDEC_POOL_GB")
                  else f"{BUDGET_FRACTION:.0%} of the {_gb(limit)} {source}")
        return (f"models in memory: {_gb(self.used_bytes)} ({len(self.loaded())} models) of a "
                f"{_gb(self.budget_bytes)} budget ({budget})")

    def clear(self) -> None:
        with self._lock:
            self._models.clear()

    def _make_room(self, key: tuple, needed: int | None) -> None:
        """Refuse a model larger than the budget; drop least recently used ones until it fits; reserve it."""
        if needed is None:
            return
        if needed > self.budget_bytes:
            raise ValueError(f"{key[0]} needs about {_gb(needed)} in {key[1]}, more than the model memory budget "
                             f"of {_gb(self.budget_bytes)} on this host: pick a smaller model"
                             + (" or bfloat16" if key[1] == "float32" else ""))
        with self._lock:
            self._reserved[key] = needed
            self._evict(keep=key)

    def _evict(self, keep: tuple) -> None:
        """Drop least recently used models (never `keep`) while the held ones and the reservations exceed the budget."""
        used = sum(m.memory_bytes for m in self._models.values()) + sum(self._reserved.values())
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
