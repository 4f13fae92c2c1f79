"""The model catalogue (`assets/models.json`): names, role hints, tokenizer families, licences, sources.

Each entry lists its sources in the order they are tried: the converted-weights cache, an installed
package that ships the GGUF in chunks, the Hugging Face hub, ModelScope. `catalogue()` adds a
readiness status computed from what is on this machine now:

- "ready": loads offline now in about a second (converted safetensors or an int8 / int4 store in the cache, each
  named in `detail` with its size on disk, or a hub snapshot already downloaded);
- "needs assembly": its package is installed; the first load assembles the GGUF and converts or quantizes it
  (about a minute, offline; `python -m specdec models --prepare NAME` does it ahead of time). The assembled GGUF
  is not kept once something made from it is stored (`specdec.models.loading`);
- "needs download": nothing local; install its package or load it once with network access.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from specdec.core import files
from specdec.models import cache as weights_cache, hub

CATALOGUE_PATH = files.ASSETS / "models.json"
CONFIGS = files.ASSETS / "configs"  # <name>.json: a catalogue model's architecture (transformers config), shipped
VOCABULARIES = files.ASSETS / "vocabularies"  # <tokenizer family>.json: the frequent-token set its drafts draft over
STATUSES = ("ready", "needs assembly", "needs download")


@dataclass(frozen=True)
class PackageSource:
    """A GGUF shipped in chunks inside PyPI packages (never imported: only located)."""

    parts: int  # number of chunks, concatenated in order
    module: str  # importable name of the package holding chunk n, with {n} (1-based) / {i} (0-based)
    file: str  # chunk path inside that package, with {n} / {i}
    pip: str  # requirement of chunk n's package, with {n}
    gguf: str  # file name of the assembled GGUF in the cache
    sha256: str  # of the assembled GGUF
    size_mb: int | None = None  # download size hint

    def chunk(self, n: int) -> tuple[str, str]:
        """(module, relative file) of chunk n, 1-based."""
        return self.module.format(n=n, i=n - 1), self.file.format(n=n, i=n - 1)

    def requirements(self) -> list[str]:
        return list(dict.fromkeys(self.pip.format(n=n) for n in range(1, self.parts + 1)))

    def chunk_paths(self) -> list[Path | None]:
        """Where each chunk is installed (None for a missing package or file)."""
        return [_installed_file(*self.chunk(n)) for n in range(1, self.parts + 1)]

    def installed(self) -> bool:
        return all(path is not None for path in self.chunk_paths())


@dataclass(frozen=True)
class CatalogueEntry:
    """One named model of the catalogue."""

    name: str  # what users type: `--target qwen2.5-coder-1.5b-instruct`
    title: str  # human name
    roles: tuple[str, ...]  # hints: "target", "draft", "unaligned-draft" (another tokenizer than the targets)
    tokenizer: str  # tokenizer family; equal families share token ids
    licence: str
    parameters: str  # e.g. "1.5B"
    default_for: str | None  # "target" / "draft" for the default pair, else None
    package: PackageSource | None  # chunked GGUF inside pip packages, if any
    hub_id: str | None  # Hugging Face repo id
    modelscope_id: str | None  # ModelScope model id
    status: str = "needs download"  # one of STATUSES, filled in by `catalogue()`
    detail: str = ""  # why, and what to do

    @property
    def sources(self) -> list[str]:
        """Source kinds in the order they are tried."""
        kinds = ["cache"] + (["package"] if self.package else [])
        return kinds + (["hub"] if self.hub_id else []) + (["modelscope"] if self.modelscope_id else [])

    def how_to_get(self) -> str:
        """What a user can do to make this model loadable."""
        ways = []
        if self.package:
            ways.append(f"install its package: pip install --no-deps {' '.join(self.package.requirements())}")
        if self.hub_id:
            ways.append(f"load it once with network access to the Hugging Face hub ({self.hub_id})")
        if self.modelscope_id:
            ways.append(f"or through ModelScope (modelscope:{self.modelscope_id})")
        return "; ".join(ways)


@cache
def _entries() -> tuple[CatalogueEntry, ...]:
    data = json.loads(CATALOGUE_PATH.read_text(encoding="utf-8"))
    return tuple(_parse(item) for item in data["models"])


def _parse(item: dict) -> CatalogueEntry:
    sources = {source["kind"]: source for source in item["sources"]}
    package = sources.get("package")
    return CatalogueEntry(
        name=item["name"], title=item["title"], roles=tuple(item["roles"]), tokenizer=item["tokenizer"],
        licence=item["licence"], parameters=item["parameters"], default_for=item.get("default_for"),
        package=PackageSource(**{k: v for k, v in package.items() if k != "kind"}) if package else None,
        hub_id=sources.get("hub", {}).get("id"), modelscope_id=sources.get("modelscope", {}).get("id"))


def names() -> list[str]:
    return [entry.name for entry in _entries()]


def find(name: str) -> CatalogueEntry | None:
    """The catalogue entry called `name` (case-insensitive), or None."""
    return next((entry for entry in _entries() if entry.name == name.lower()), None)


def shipped_config(name: str) -> Path | None:
    """The shipped architecture of catalogue model `name` (its config.json), or None where none ships."""
    path = CONFIGS / f"{name}.json"
    return path if path.is_file() else None


def draft_vocabulary(draft: str, target: str) -> Path | None:
    """The frequent-token set shipped for catalogue draft `draft` drafting for catalogue target `target` (both of
    one tokenizer family; `python -m specdec vocabulary` made it), or None."""
    draft_entry, target_entry = find(draft), find(target)
    if draft_entry is None or target_entry is None or draft_entry.tokenizer != target_entry.tokenizer:
        return None
    path = VOCABULARIES / f"{draft_entry.tokenizer}.json"
    return path if path.is_file() else None


def default_name(role: str) -> str:
    """Name of the default "target" or "draft"."""
    return next(entry.name for entry in _entries() if entry.default_for == role)


def catalogue() -> list[CatalogueEntry]:
    """All entries, each with its readiness status on this machine now."""
    return [with_status(entry) for entry in _entries()]


def with_status(entry: CatalogueEntry) -> CatalogueEntry:
    stored = weights_cache.stored(entry.name)
    if stored:
        sizes = ", ".join(f"{name} {weights_cache.size_text(size)}" for name, size in stored.items())
        return dataclasses.replace(entry, status="ready", detail=f"in the cache: {sizes}{_assembled(entry)}")
    if entry.hub_id and hub.cached_snapshot(entry.hub_id):
        return dataclasses.replace(entry, status="ready", detail="downloaded in the Hugging Face cache")
    if entry.modelscope_id and hub.modelscope_cached(entry.modelscope_id):
        return dataclasses.replace(entry, status="ready", detail="downloaded in the ModelScope cache")
    if entry.package and entry.package.installed():
        return dataclasses.replace(entry, status="needs assembly",
                                   detail="package installed; the first load assembles it and converts or "
                                          f"quantizes it offline{_assembled(entry)}")
    return dataclasses.replace(entry, status="needs download", detail=entry.how_to_get())


def _assembled(entry: CatalogueEntry) -> str:
    """"; its GGUF assembled (SIZE)" while the cache holds the entry's assembled GGUF, else ""."""
    try:
        size = weights_cache.gguf_path(entry.package.gguf).stat().st_size if entry.package else None
    except FileNotFoundError:
        size = None
    return f"; its GGUF assembled ({weights_cache.size_text(size)})" if size is not None else ""


def _installed_file(module: str, relative: str) -> Path | None:
    """Path of a data file inside an installed package, found without importing the package."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / relative
    return path if path.is_file() else None
