"""What TensorRT-LLM's sources serve for each target family (trtspec.targets names the families).

Read from NVIDIA/TensorRT-LLM's tensorrt_llm/_torch/models (../shared/TRTLLM.md lists what was read): a target that
subclasses SpecDecOneEngineForCausalLM serves one-model drafts; a decoder layer that calls
spec_metadata.maybe_capture_hidden_states serves two-model ones; DFlash runs one-model only, on the targets its tests
or support matrix list. docs/families.md has the evidence."""

from __future__ import annotations

ONE_AND_TWO = "one-model and two-model"
TWO_UNTESTED = "two-model (the hidden-state capture is in its model file; no upstream test)"

EAGLE3: dict[str, str] = {  # family -> how it serves an EAGLE-3 draft; a family not listed serves none
    "llama": ONE_AND_TWO,
    "mistral": TWO_UNTESTED,
    "qwen2": TWO_UNTESTED,
    "qwen3": ONE_AND_TWO,
    "qwen3_moe": ONE_AND_TWO,
    "gpt_oss": ONE_AND_TWO,
    "deepseek_v3": "one-model for DeepSeek-V3 (code and unit test; its support matrix says no; V2 not served)",
}
DFLASH: frozenset[str] = frozenset({"qwen3", "gpt_oss"})  # targets its DFlash (one-model) lists


def eagle3(family: str) -> str | None:
    return EAGLE3.get(family)


def refusal_for(family: str, method: str) -> str | None:
    """Why TensorRT-LLM serves no `method` draft (eagle3, dflash, dspark) for the family, or None."""
    if method == "eagle3" and family not in EAGLE3:
        return f"TensorRT-LLM's sources serve no EAGLE-3 draft for {family} targets (no hidden-state capture in its model)"
    if method in ("dflash", "dspark") and "one-model" not in EAGLE3.get(family, ""):
        return (f"TensorRT-LLM's DFlash runs one-model only, and its {family} target serves no one-model draft "
                "(it does not subclass SpecDecOneEngineForCausalLM)")
    return None
