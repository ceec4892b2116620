"""What vLLM 0.32 serves for each target family (trtspec.targets names the families): the model file whose class
serves it, and the one-line reason where it serves no draft, no DFlash draft, or does not run on its CPU build.

Read from vLLM 0.32's sources (a target that implements `SupportsEagle3` hands its hidden states to a draft: EAGLE-3,
DFlash and DSpark alike) and measured by scripts/family_matrix.py (the CPU column)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class VllmSupport:
    file: str  # the vLLM model file whose class serves the target
    eagle3: str | None = None  # None: it hands its hidden states to a draft (EAGLE-3, DFlash); else why not
    dflash: str | None = None  # None: it serves a DFlash draft (given the above); else why not
    cpu: str | None = None  # None: vLLM's CPU build runs it; else why not


NO_EAGLE3 = ("vLLM 0.32's {file} does not implement SupportsEagle3 (the target's hidden states for a draft): it "
             "serves no EAGLE-3 or DFlash draft for this target")
TRANSFORMERS_BACKEND = "transformers/base.py (its Transformers backend)"
SLIDING_DFLASH = ("vLLM 0.32 asserts that a DFlash draft's layers share one KV cache group, which its sliding-window "
                  "and full-attention layers do not")

# TensorRT-LLM's decoding_type (a bundle's llm_api_options.yaml) -> vLLM's speculative method for the same draft
METHODS = {"Eagle3": "eagle3", "DFlash": "dflash", "DSpark": "dspark"}

SUPPORT: dict[str, VllmSupport] = {
    "llama": VllmSupport("llama.py"),
    "mistral": VllmSupport("mistral.py (a LlamaForCausalLM)"),
    "qwen2": VllmSupport("qwen2.py"),
    "qwen3": VllmSupport("qwen3.py"),
    "qwen3_moe": VllmSupport("qwen3_moe.py"),
    "qwen2_moe": VllmSupport("qwen2_moe.py", eagle3=NO_EAGLE3.format(file="qwen2_moe.py")),
    "mixtral": VllmSupport("mixtral.py", eagle3=NO_EAGLE3.format(file="mixtral.py")),
    "gemma3": VllmSupport("gemma3.py", eagle3=NO_EAGLE3.format(file="gemma3.py")),
    "gemma4": VllmSupport("gemma4.py", dflash=SLIDING_DFLASH),
    "phi3": VllmSupport("phi3.py (a LlamaForCausalLM)"),
    "gpt_oss": VllmSupport("gpt_oss.py", dflash=SLIDING_DFLASH),
    "deepseek_v3": VllmSupport("deepseek_v2.py", cpu="vLLM 0.32's CPU build finds no KV block size for an MLA target "
                               "beside a Llama-layer draft (its MLA attention takes 16, its other attention multiples "
                               "of 32)"),
    "granite": VllmSupport("granite.py"),
    "olmo2": VllmSupport(TRANSFORMERS_BACKEND),
    "smollm3": VllmSupport(TRANSFORMERS_BACKEND),
}


def support(family: str) -> VllmSupport:
    return SUPPORT[family]


def refusal_for(family: str, method: str, on_gpu: bool) -> str | None:
    """Why vLLM cannot serve a `method` draft (its speculative method: eagle3, dflash, dspark) for the family here."""
    s = SUPPORT[family]
    if s.eagle3:  # every draft trtspec trains reads the target's hidden states
        return f"{family}: {s.eagle3}"
    if method in ("dflash", "dspark") and s.dflash:
        return f"{family}: {s.dflash}"
    if s.cpu and not on_gpu:
        return f"{family}: {s.cpu}"
    return None


def patches_transformers(family: str) -> bool:
    """vLLM serves the family through its Transformers backend, which rewrites transformers' layers in the process it
    runs in: a later HF load in the same process fails."""
    return SUPPORT[family].file.startswith("transformers/")
