"""The EAGLE-3 head's section of the build config (`convert`): which target layers feed it, its vocabulary, its
layers, EAGLE-3.1's two switches and any other eagle_architecture_config field."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from trtspec.sections import VOCAB_MAX, LayerId, Section, key


class ConvertSection(Section):
    aux_layers: list[LayerId] | None = key(None, "target layers whose hidden states feed the head; null = "
                                           "TensorRT-LLM's {1, L//2-1, L-4}", min_length=1, max_length=16)
    draft_vocab_size: int | None = key(None, "the head's output vocabulary: the most frequent training tokens, "
                                       "mapped back by d2t; null = the target's full vocabulary", ge=16, le=VOCAB_MAX)
    num_layers: int = key(1, "decoder layers in the head (EAGLE-3 uses 1; engines load only 1)", ge=1, le=8)
    init_from_target: bool = key(
        False, "start the head from the target's layer after the deepest aux layer, its final norm and lm_head rows "
        "instead of modelopt's random init: exact for Llama/Mistral/Qwen2; Qwen3's q/k norms have no place in the "
        "head (listed in convert's metrics: init_not_copied)")
    fc_norm: bool = key(False, "EAGLE-3.1: an RMSNorm on each auxiliary hidden state before the fusion layer fc (vLLM's "
                        "llama_eagle3 reads `fc_norm`); the target's layers differ in scale, the norms even them out")
    norm_output: bool = key(False, "EAGLE-3.1: a draft step hands the next step its output after the final norm, not "
                            "before (vLLM's `norm_output`)")
    overrides: dict[str, Any] = Field(default_factory=dict, description="any other eagle_architecture_config field, applied last "
                                    "(e.g. intermediate_size: 1536)")
