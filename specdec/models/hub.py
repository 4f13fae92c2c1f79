"""Model folders from the Hugging Face hub and ModelScope, local caches first, failing fast offline.

A hub id resolves to a local snapshot folder. The local cache is always tried first (no network);
a download is attempted only when the service answers a probe (an HTTP HEAD with a short timeout),
so an offline machine gets a clear ValueError in about a second instead of a long hang of retries. `modelscope` is optional and imported only when a ModelScope download is needed.
"""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path
import urllib.error
import urllib.request

PROBE_TIMEOUT_S = 1.5  # a reachable hub answers a TCP connect well within this
PROBE_MEMORY_S = 60.0  # reuse a probe's answer for this long
MODELSCOPE_URL = "https://www.modelscope.cn"
WEIGHT_PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken", "*.jinja"]  # never pickles

_probes: dict[str, tuple[float, bool]] = {}  # host -> (time probed, reachable)


def cached_snapshot(repo_id: str) -> Path | None:
    """The folder of an already downloaded Hugging Face snapshot of `repo_id`, or None (no network)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        folder = Path(snapshot_download(repo_id, local_files_only=True, allow_patterns=WEIGHT_PATTERNS))
    except (LocalEntryNotFoundError, OSError, ValueError):
        return None
    return folder if (folder / "config.json").is_file() else None


def download_hub(repo_id: str) -> Path:
    """A local folder for Hugging Face repo `repo_id`: the cached snapshot, else a download."""
    folder = cached_snapshot(repo_id)
    if folder is not None:
        return folder
    _require_network("the Hugging Face hub", _hub_url(), repo_id,
                     f"on a connected machine run `huggingface-cli download {repo_id}` (then copy "
                     "~/.cache/huggingface here) or download the folder and pass its path")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id, allow_patterns=WEIGHT_PATTERNS))
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError) as error:
        raise ValueError(f"could not download {repo_id} from the Hugging Face hub: {error}") from error


def modelscope_cached(model_id: str) -> Path | None:
    """The folder of an already downloaded ModelScope model (works without the modelscope package)."""
    base = Path(os.environ.get("MODELSCOPE_CACHE") or Path.home() / ".cache" / "modelscope" / "hub")
    org, _, name = model_id.partition("/")
    for folder_name in (name, name.replace(".", "___")):  # ModelScope spells dots as "___" on disk
        for folder in (base / "models" / org / folder_name, base / org / folder_name):
            if (folder / "config.json").is_file():
                return folder
    return None


def download_modelscope(model_id: str) -> Path:
    """A local folder for ModelScope model `model_id`: the local cache, else `modelscope.snapshot_download`."""
    folder = modelscope_cached(model_id)
    if folder is not None:
        return folder
    try:
        import modelscope
    except ImportError:
        raise ValueError(
            f"modelscope:{model_id} is not in the local ModelScope cache and the optional `modelscope` package "
            "is not installed: `pip install modelscope` on a machine that reaches ModelScope, or download the "
            "model folder elsewhere and pass its path") from None
    _require_network("ModelScope", _modelscope_url(), f"modelscope:{model_id}",
                     "download the model folder on a connected machine (modelscope.snapshot_download) and pass its path")
    return Path(modelscope.snapshot_download(model_id, allow_patterns=WEIGHT_PATTERNS))


def _require_network(service: str, url: str, what: str, advice: str) -> None:
    offline = _offline_flag()
    if offline or not reachable(url):
        reason = f"{offline} is set" if offline else f"{url} does not answer from this machine"
        raise ValueError(f"{what} is not downloaded here and {service} cannot be used ({reason}): {advice}")


def _offline_flag() -> str | None:
    """Name of the environment variable that declares this machine offline, if any."""
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "SPECDEC_OFFLINE"):
        if os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on"):
            return name
    return None


def _modelscope_url() -> str:
    domain = os.environ.get("MODELSCOPE_DOMAIN")
    return f"https://{domain}" if domain else MODELSCOPE_URL


def _hub_url() -> str:
    from huggingface_hub import constants

    return constants.ENDPOINT


def reachable(url: str) -> bool:
    """Whether `url` answers an HTTP HEAD (any status) within PROBE_TIMEOUT_S, memoised briefly.

    An HTTP answer, not just a TCP connect: a transparent proxy accepts any connection and then
    never answers. The probe runs in a daemon thread because a DNS lookup ignores socket timeouts.
    """
    now = time.monotonic()
    if url in _probes and now - _probes[url][0] < PROBE_MEMORY_S:
        return _probes[url][1]
    answer: list[bool] = []

    def probe() -> None:
        try:
            urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=PROBE_TIMEOUT_S).close()
            answer.append(True)
        except urllib.error.HTTPError:  # an HTTP status is an answer
            answer.append(True)
        except (OSError, ValueError):
            answer.append(False)

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(PROBE_TIMEOUT_S + 0.5)
    _probes[url] = (now, bool(answer and answer[0]))
    return _probes[url][1]
