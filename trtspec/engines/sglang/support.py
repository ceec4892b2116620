"""What SGLang serves for each target family (trtspec.targets names the families), read from sgl-project/sglang's
python/sglang/srt/models (the stored versions named below; newer releases may serve more): a target class that
defines set_eagle3_layers_to_capture hands its hidden states to an EAGLE-3 draft, one that defines
set_dflash_layers_to_capture to a DFlash one (DSPARK falls back to the DFlash hook; SGLang refuses DFLASH for a
target without it)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SglangSupport:
    file: str  # the SGLang model file whose class serves the target, and the commit read
    eagle3: bool  # set_eagle3_layers_to_capture, its own or inherited
    dflash: bool = False  # set_dflash_layers_to_capture


SUPPORT: dict[str, SglangSupport] = {
    "llama": SglangSupport("llama.py @0023954", True),
    "mistral": SglangSupport("mistral.py @64825b8 (a LlamaForCausalLM)", True),
    "qwen2": SglangSupport("qwen2.py @038c87d", True),
    "qwen3": SglangSupport("qwen3.py @01b5f57", True, dflash=True),
    "qwen3_moe": SglangSupport("qwen3_moe.py @008af3a", True, dflash=True),
    "qwen2_moe": SglangSupport("qwen2_moe.py @0115497", False),
    "mixtral": SglangSupport("mixtral.py @7f1f5bc", False),
    "gemma3": SglangSupport("gemma3_causal.py @038c87d", True),
    "gemma4": SglangSupport("gemma4_causal.py @03826cd", True),
    "phi3": SglangSupport("llama.py @0023954 (Phi3ForCausalLM, a LlamaForCausalLM)", True),
    "gpt_oss": SglangSupport("gpt_oss.py @009c680", True),
    "deepseek_v3": SglangSupport("deepseek_v2.py @3e4a39e (DeepseekV3ForCausalLM)", True),
    "granite": SglangSupport("granite.py @0b8c97e", False),
    "olmo2": SglangSupport("olmo2.py @067ed0c", False),
    "smollm3": SglangSupport("smollm3.py @58fd814 (a LlamaForCausalLM)", True),
}


def refusal_for(family: str, method: str) -> str | None:
    """Why SGLang's model for the family serves no `method` draft (eagle3, dflash, dspark), or None."""
    s = SUPPORT[family]
    if not s.eagle3 and method == "eagle3":
        return f"SGLang's {s.file} has no set_eagle3_layers_to_capture: it serves no EAGLE-3 draft for {family} targets"
    if not s.dflash and method in ("dflash", "dspark"):
        return f"SGLang's {s.file} has no set_dflash_layers_to_capture: it serves no {method} draft for {family} targets"
    return None
