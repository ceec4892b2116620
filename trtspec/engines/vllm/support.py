"""What vLLM 0.32 serves for each target family (trtspec.targets names the families): the model file whose class
serves it, and the one-line reason where it serves no draft, no DFlash draft, or does not run on its CPU build.

Read from vLLM 0.32's sources (a target that implements `SupportsEagle3` hands its hidden states to a draft: EAGLE-3,
DFlash and DSpark alike) and measured by scripts/family_matrix.py (the CPU column)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


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


# vLLM 0.32's CPU attention (v1/attention/backends/cpu_attn.py: CPUAttentionBackend.get_supported_head_sizes); a
# head of another size fails inside the engine ("Unsupported CPU attention configuration")
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
HEADS_FROM_WIDTH = ("qwen2", "qwen2_moe")  # their vLLM files take hidden_size / num_attention_heads, not head_dim


def head_sizes(text: Any, family: str) -> list[int]:
    """The attention head sizes vLLM gives the target's layers (`text`: its decoder config): the model-wide one and
    any a layer sets for itself (Gemma 4's per_layer_config: wider heads on its full-attention layers); none for MLA
    (heads of their own sizes) or a config without heads."""
    heads = getattr(text, "num_attention_heads", None)
    if getattr(text, "kv_lora_rank", None) or not heads:
        return []
    from trtspec.targets import global_attr

    if family in HEADS_FROM_WIDTH:
        return [text.hidden_size // heads]
    layers = getattr(text, "per_layer_config", None) or []  # transformers' view: each layer's config; in JSON a dict
    layers = layers.values() if isinstance(layers, dict) else layers
    dims = [global_attr(text, "head_dim")] + [c.get("head_dim") if isinstance(c, dict) else getattr(c, "head_dim", None)
                                              for c in layers]
    return sorted({int(d) for d in dims if d} or {text.hidden_size // heads})


def cpu_head_refusal(text: Any, family: str) -> str | None:
    """Why vLLM's CPU build cannot run the target's attention (`text`: its decoder config), or None."""
    bad = [size for size in head_sizes(text, family) if size not in CPU_HEAD_SIZES]
    if not bad:
        return None
    how = " (hidden_size / num_attention_heads, as vLLM's file for this family takes it)" if family in HEADS_FROM_WIDTH else ""
    return (f"{family}: vLLM 0.32's CPU attention runs heads of size {', '.join(map(str, CPU_HEAD_SIZES))}; this "
            f"target's are {', '.join(map(str, bad))}{how}")


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
