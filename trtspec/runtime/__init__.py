"""The project's own PyTorch speculative-decoding runtime: loads the exported bundle (target/ + draft/), decodes
with a static KV cache, draft-target and n-gram drafters, chain and tree drafts, greedy and lossless sampling
verification. Used by the validate stage anywhere (CPU included). The drafters of the draft families (EAGLE-3, DFlash,
DFlash2) are in their packages and run through this one's ModelDrafter; trtspec.draft_families loads the one a bundle's
draft declares (load_drafter)."""

from trtspec.runtime.decode import Generation, Stats, generate, speculative_decode, speculative_on_prompts
from trtspec.runtime.drafters import (
    DraftSpec,
    LMDrafter,
    NgramDrafter,
    load_draft_target,
)
from trtspec.runtime.hf_target import HFTarget, load_target
from trtspec.runtime.model import Transformer, compile_steps, load_transformer

__all__ = [
    "DraftSpec",
    "Generation",
    "HFTarget",
    "LMDrafter",
    "NgramDrafter",
    "Stats",
    "Transformer",
    "compile_steps",
    "generate",
    "load_draft_target",
    "load_target",
    "load_transformer",
    "speculative_decode",
    "speculative_on_prompts",
]
