"""What a measurement ran on: CPU model and feature flags, threads, GPU, torch, and the code that measured it.
One description, used by every cache key and every report that says where a number comes from; `features()` and
`kernel_level()` name the CPU's vector features for reports (a path is chosen by measurement, never by them)."""
from __future__ import annotations

import functools
import platform
import subprocess
from pathlib import Path

import torch

REPOSITORY = Path(__file__).resolve().parents[2]  # the checkout this package runs from (its code version)
VECTOR_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx_vnni", "avx512_bf16",
                "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8", "neon", "asimd", "sve")  # the flags reports show


@functools.cache
def cpu() -> dict:
    """{"model": the CPU's model name, "flags": its feature flags (sorted)} from /proc/cpuinfo where there is one."""
    model, flags = platform.processor() or platform.machine(), []
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        text = ""
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == "model name" and value.strip():
            model = value.strip()
        elif name.strip() in ("flags", "Features") and not flags:
            flags = sorted(set(value.split()))
    return {"model": model, "flags": flags}


def features() -> list[str]:
    """The CPU's vector features among VECTOR_FLAGS, in that order, as the OS lists them (/proc/cpuinfo)."""
    have = set(cpu()["flags"])
    return [flag for flag in VECTOR_FLAGS if flag in have]


def kernel_level() -> str:
    """The CPU kernels torch dispatches to, as torch reports them: "AVX512", "AVX2", "DEFAULT", ..."""
    return torch.backends.cpu.get_cpu_capability()


def gpu(device: str = "cuda") -> str | None:
    """The GPU's name, or None without CUDA."""
    return torch.cuda.get_device_name(torch.device(device)) if torch.cuda.is_available() else None


def describe(device: str = "cpu") -> dict:
    """Everything a timing depends on besides the model: CPU model and all its flags, threads, GPU, torch."""
    about = {"cpu": cpu()["model"], "cpu_flags": cpu()["flags"], "threads": torch.get_num_threads(),
             "torch": torch.__version__, "device": device}
    if device != "cpu":
        about["gpu"] = gpu(device)
    return about


def label(description: dict) -> str:
    """One line naming a `describe()` result (read back from a file, say): its GPU when it has one, else its CPU
    and threads."""
    if description.get("gpu"):
        return str(description["gpu"])
    return f"{description.get('cpu', 'unknown CPU')}, {description.get('threads', '?')} threads"


@functools.cache
def code_version() -> str:
    """The git commit this package runs from (`-dirty` with uncommitted changes), or "unknown" outside a checkout."""
    try:
        done = subprocess.run(["git", "-C", str(REPOSITORY), "describe", "--always", "--dirty", "--abbrev=12"],
                              capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return done.stdout.strip() if done.returncode == 0 and done.stdout.strip() else "unknown"
