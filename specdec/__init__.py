"""specdec: a speculative-decoding lab — see, measure and fix speculative decoding.

Public API: `speculative_generate`, `autoregressive_generate`, `speculative_rounds` (the decode as a generator of
rounds), the trace types `Round`, `DecodeStats`, `GenerationResult`, the drafter interface, and
`specdec.core.theory`.
"""
from specdec.core import theory
from specdec.core.drafter import Drafter, ModelDrafter, NoDraft, Proposal, SamplingPolicy
from specdec.core.engine import autoregressive_generate, speculative_generate, speculative_rounds
from specdec.core.trace import DecodeStats, GenerationResult, Round

__all__ = [
    "speculative_generate", "autoregressive_generate", "speculative_rounds", "GenerationResult", "Round",
    "DecodeStats",
    "Drafter", "ModelDrafter", "NoDraft", "Proposal", "SamplingPolicy", "theory",
]
