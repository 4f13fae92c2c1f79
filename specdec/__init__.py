"""specdec: a speculative-decoding lab — see, measure and fix speculative decoding.

Public API: `speculative_generate`, `autoregressive_generate`, the trace types `Round`,
`DecodeStats`, `GenerationResult`, the drafter interface, and `specdec.theory`.
"""
from . import theory
from .drafters import Drafter, ModelDrafter, NoDraft, Proposal, SamplingPolicy
from .engine import autoregressive_generate, speculative_generate
from .trace import DecodeStats, GenerationResult, Round

__all__ = [
    "speculative_generate", "autoregressive_generate", "GenerationResult", "Round", "DecodeStats",
    "Drafter", "ModelDrafter", "NoDraft", "Proposal", "SamplingPolicy", "theory",
]
