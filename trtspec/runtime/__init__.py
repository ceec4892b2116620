"""The project's own PyTorch speculative-decoding runtime: loads the exported bundle (target/ + draft/), decodes
with a static KV cache, EAGLE-3 / draft-target / n-gram drafters, chain and tree drafts, greedy and lossless
sampling verification. Used by the validate stage anywhere (CPU included)."""

from trtspec.runtime.decode import Generation, Stats, generate, speculative_decode, speculative_on_prompts
from trtspec.runtime.drafters import (
    DraftSpec,
    Eagle3Drafter,
    LMDrafter,
    NgramDrafter,
    load_draft_target,
    load_eagle3_drafter,
)
from trtspec.runtime.hf_target import HFTarget, load_target
from trtspec.runtime.model import Transformer, compile_steps, load_transformer

__all__ = [
    "DraftSpec",
    "Eagle3Drafter",
    "Generation",
    "HFTarget",
    "LMDrafter",
    "NgramDrafter",
    "Stats",
    "Transformer",
    "compile_steps",
    "generate",
    "load_draft_target",
    "load_eagle3_drafter",
    "load_target",
    "load_transformer",
    "speculative_decode",
    "speculative_on_prompts",
]
