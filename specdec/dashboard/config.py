"""Dashboard configuration: one dataclass, read from environment variables (12-factor style).

Every knob a host needs (a laptop, a free CPU Hugging Face Space) is an environment variable:

| variable | field | default |
|---|---|---|
| SPECDEC_HOST, else Gradio's GRADIO_SERVER_NAME | host | 127.0.0.1 (0.0.0.0 on a Space) |
| SPECDEC_PORT, else Gradio's GRADIO_SERVER_PORT | port | 7860 |
| SPECDEC_ALLOWED_MODELS | allowed_models | empty = every catalogue model |
| SPECDEC_ALLOW_CUSTOM_MODELS | allow_custom_models | 1 where the app is private (see below), else 0 |
| SPECDEC_MAX_NEW_TOKENS | max_new_tokens_cap | 256 |
| SPECDEC_MAX_PROMPT_CHARS | max_prompt_chars | 4000 |
| SPECDEC_MAX_PROMPT_TOKENS | max_prompt_tokens | 1024 |
| SPECDEC_TIME_LIMIT_S | time_limit_s | 120 |
| SPECDEC_CONCURRENCY | concurrency | 1 |
| SPECDEC_QUEUE_SIZE | queue_size | 16 |
| SPECDEC_SESSIONS | sessions | 100 |
| SPECDEC_DTYPE | dtype | auto (the target's and each draft's format measured on this machine); or one format for all |
| SPECDEC_TARGET / SPECDEC_DRAFT | default_target / default_draft | the default pair (live tab: MODEL+lookup) |
| SPECDEC_UNALIGNED | default_unaligned | the catalogue's first unaligned draft |
| SPECDEC_ALLOW_TRAINING | allow_training | 1 where the app is private, else 0 (preparing, distilling aligned drafts) |
| SPECDEC_MAX_DISTILL_STEPS | max_distill_steps | 200 |
| SPECDEC_MAX_DISTILL_JOBS | max_distill_jobs | 1 |

The app is private only when every signal says so: a loopback host (127.x, localhost, ::1), no share link
(GRADIO_SHARE), not a Hugging Face Space (SPACE_ID), and, per request, no reverse proxy in front of it (a
request with X-Forwarded-For / X-Forwarded-Host / Forwarded / X-Real-IP headers, or a Host header that is not a
loopback name, is public). Where it is public, custom models (and `MODEL@vocab=FILE` files) and training are off
unless the host sets their variable explicitly.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from specdec.core.limits import K_UI_MAX, Budget
from specdec.lab.presets import PROMPTS  # noqa: F401  (the presets the tabs offer: defined with their recordings)

K_RANGE = (1, K_UI_MAX)  # draft tokens per round offered by the dashboard (specdec.core.limits)
K_CHOICES = ["auto", *range(K_RANGE[0], K_RANGE[1] + 1)]  # the k dropdowns' options
MODEL_DRAFTERS = ("lookup", "self:4", "self:8", "self:14")  # need no second model: prompt lookup, first L target layers
DTYPES = ("auto", "float32", "bfloat16", "int8", "int4")
PROXY_HEADERS = ("x-forwarded-for", "x-forwarded-host", "forwarded", "x-real-ip")  # added by reverse proxies
EXPLICIT = {"allow_custom_models": "SPECDEC_ALLOW_CUSTOM_MODELS", "allow_training": "SPECDEC_ALLOW_TRAINING"}


@dataclass(frozen=True)
class AppConfig:
    """How the dashboard is served and what a visitor may ask for."""

    host: str = "127.0.0.1"  # interface to bind; 0.0.0.0 to serve other machines
    port: int = 7860  # TCP port
    allowed_models: tuple[str, ...] = ()  # catalogue names offered; empty = the whole catalogue
    allow_custom_models: bool = True  # accept free-text model folders / .gguf paths / hub ids / vocabulary files
    max_new_tokens_cap: int = 256  # largest max_new_tokens a visitor may ask for
    max_prompt_chars: int = 4000  # longest prompt text a visitor may send (checked before it is tokenized)
    max_prompt_tokens: int = 1024  # longest prompt in the target's tokens (prefilled, then again for the baseline)
    time_limit_s: int = 120  # wall time of one request: loading, calibration, prefill and every decode of it
    concurrency: int = 1  # decodes running at once (each holds the CPU); the rest wait in the queue
    queue_size: int = 16  # requests waiting at most; one more is refused with a "busy" message
    sessions: int = 100  # sessions whose state the server keeps (~0.3 MB each, an hour after they close); oldest go
    dtype: str = "auto"  # weights dtype of every model the app loads (auto: specdec.models.resolve_dtype)
    default_target: str = ""  # preselected target ("" = the catalogue's default pair)
    default_draft: str = ""  # preselected draft ("" = the catalogue's default pair; live tab: MODEL+lookup)
    default_unaligned: str = ""  # preselected other-tokenizer draft of the compare tab ("" = the catalogue's first)
    allow_training: bool = True  # visitors may prepare (transplant) and distil aligned drafts: CPU and disk heavy
    max_distill_steps: int = 200  # most optimizer steps one distillation started from the app may run
    max_distill_jobs: int = 1  # distillations running at once (each takes the CPU for minutes)
    public: bool = False  # served beyond this machine: a non-loopback host, a share link or a Space
    explicit: tuple[str, ...] = ()  # allow_* fields the host set by their variable: they hold for proxied requests too

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> "AppConfig":
        """Read the SPECDEC_* variables (and Gradio's own for host and port); bad values raise ValueError naming
        the variable."""
        on_space = "SPACE_ID" in environ  # set by Hugging Face Spaces
        host = environ.get(_variable(environ, "SPECDEC_HOST", "GRADIO_SERVER_NAME"),
                           "0.0.0.0" if on_space else cls.host)
        public = on_space or not loopback(host) or _flag(environ, "GRADIO_SHARE", False)
        config = cls(
            host=host,
            port=_integer(environ, _variable(environ, "SPECDEC_PORT", "GRADIO_SERVER_PORT"), cls.port, 1, 65535),
            allowed_models=tuple(n.strip() for n in environ.get("SPECDEC_ALLOWED_MODELS", "").split(",") if n.strip()),
            allow_custom_models=_flag(environ, "SPECDEC_ALLOW_CUSTOM_MODELS", not public),
            max_new_tokens_cap=_integer(environ, "SPECDEC_MAX_NEW_TOKENS", cls.max_new_tokens_cap, 1, 4096),
            max_prompt_chars=_integer(environ, "SPECDEC_MAX_PROMPT_CHARS", cls.max_prompt_chars, 1, 1_000_000),
            max_prompt_tokens=_integer(environ, "SPECDEC_MAX_PROMPT_TOKENS", cls.max_prompt_tokens, 1, 1_000_000),
            time_limit_s=_integer(environ, "SPECDEC_TIME_LIMIT_S", cls.time_limit_s, 1, 86_400),
            concurrency=_integer(environ, "SPECDEC_CONCURRENCY", cls.concurrency, 1, 64),
            queue_size=_integer(environ, "SPECDEC_QUEUE_SIZE", cls.queue_size, 1, 10_000),
            sessions=_integer(environ, "SPECDEC_SESSIONS", cls.sessions, 1, 100_000),
            dtype=environ.get("SPECDEC_DTYPE", cls.dtype),
            default_target=environ.get("SPECDEC_TARGET", ""),
            default_draft=environ.get("SPECDEC_DRAFT", ""),
            default_unaligned=environ.get("SPECDEC_UNALIGNED", ""),
            allow_training=_flag(environ, "SPECDEC_ALLOW_TRAINING", not public),
            max_distill_steps=_integer(environ, "SPECDEC_MAX_DISTILL_STEPS", cls.max_distill_steps, 1, 100_000),
            max_distill_jobs=_integer(environ, "SPECDEC_MAX_DISTILL_JOBS", cls.max_distill_jobs, 1, 64),
            public=public,
            explicit=tuple(field for field, name in EXPLICIT.items() if environ.get(name, "").strip()),
        )
        if config.dtype not in DTYPES:
            raise ValueError(f"SPECDEC_DTYPE must be one of {', '.join(DTYPES)}, got {config.dtype!r}")
        return config

    def allows(self, field: str, proxied: bool = False) -> bool:
        """Whether `field` ("allow_custom_models" or "allow_training") is on for a request. `proxied`: the request
        came through a reverse proxy (`proxied(headers)`), so it is public whatever the host: only an explicit
        setting holds."""
        return getattr(self, field) and (not proxied or field in self.explicit)

    def request_budget(self) -> Budget:
        """The budget of a request starting now: this host's time limit and prompt-token cap."""
        return Budget(self.time_limit_s, self.max_prompt_tokens)


def loopback(host: str) -> bool:
    """Whether `host` serves this machine only (127.x, localhost, ::1): one of the signals of a private app."""
    return host.startswith("127.") or host.lower() in ("localhost", "::1", "[::1]")


def proxied(headers: Mapping[str, str]) -> bool:
    """Whether a request with these (lower-case) HTTP headers reached the app through a proxy or a public name."""
    host = headers.get("host", "localhost")  # host[:port], or [v6]:port
    name = host.partition("]")[0] + "]" if host.startswith("[") else host.partition(":")[0]
    return any(header in headers for header in PROXY_HEADERS) or not loopback(name)


def _variable(environ: Mapping[str, str], *names: str) -> str:
    """The first of `names` that is set (ours before Gradio's), else the first: the variable to read."""
    return next((name for name in names if environ.get(name, "") != ""), names[0])


def _integer(environ: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    raw = environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name} must be an integer in {low}..{high}, got {raw!r}") from None
    if not low <= value <= high:
        raise ValueError(f"{name} must be an integer in {low}..{high}, got {value}")
    return value


def _flag(environ: Mapping[str, str], name: str, default: bool) -> bool:
    raw = environ.get(name, "").strip().lower()
    if raw == "":
        return default
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{name} must be 1/0 (or true/false), got {raw!r}")
