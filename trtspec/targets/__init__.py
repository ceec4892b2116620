"""Target families: what trtspec knows of each decoder family a user brings, declared in one place.

A family is read from the model's HF config (`model_type`), never typed in a recipe. Each declares:
  runtime      which path of trtspec's runtime serves it in validate: "native" (runtime/model.py's Llama-style
               decoder with its native kernels) or "hf" (the model's own forward and cache, runtime/hf_target.py)
  note         what sets the family apart, for reports and the bundle README
What each engine serves for a family is the engine's own table (trtspec.engines: engines/<name>/support.py).

What the draft derives from the target (`draft_dims`: sizes, rope, positions, norms) and the default auxiliary
layers (`default_aux_layers`) are read from the config the same way for every family; the few per-family facts
(MLA's head sizes, MoE's widths, nested rope per layer type) live in `draft_dims`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtspec.errors import ModelError


@dataclass(frozen=True)
class TargetFamily:
    name: str
    model_types: tuple[str, ...]  # HF config.model_type values of this family
    runtime: str  # "native" | "hf"
    note: str = ""  # what sets the family apart, for reports and the bundle README


FAMILIES: tuple[TargetFamily, ...] = (
    TargetFamily("llama", ("llama",), "native", note="Llama 2/3 (llama3 rope scaling), SmolLM2, TinyLlama"),
    TargetFamily("mistral", ("mistral",), "native"),
    TargetFamily("qwen2", ("qwen2",), "native", note="q/k/v biases"),
    TargetFamily("qwen3", ("qwen3",), "native", note="q/k norms"),
    TargetFamily("qwen3_moe", ("qwen3_moe",), "hf", note="mixture of experts"),
    TargetFamily("qwen2_moe", ("qwen2_moe",), "hf", note="mixture of experts with a shared expert"),
    TargetFamily("mixtral", ("mixtral",), "hf", note="mixture of experts"),
    TargetFamily("gemma3", ("gemma3_text",), "hf", note="sliding-window layers, scaled embeddings, GELU"),
    TargetFamily("gemma4", ("gemma4_text",), "hf", note="sliding-window layers, per-layer embeddings"),
    TargetFamily("phi3", ("phi3",), "hf", note="Phi-3, Phi-4: fused qkv and gate_up"),
    TargetFamily("gpt_oss", ("gpt_oss",), "hf", note="mixture of experts, attention sinks, sliding-window layers"),
    TargetFamily("deepseek_v3", ("deepseek_v3", "deepseek_v2"), "hf",
                 note="multi-head latent attention (MLA), mixture of experts"),
    TargetFamily("granite", ("granite",), "hf", note="embedding, residual, attention and logit multipliers"),
    TargetFamily("olmo2", ("olmo2",), "hf", note="norms after attention and MLP"),
    TargetFamily("smollm3", ("smollm3",), "hf", note="NoPE layers"),
)

BY_MODEL_TYPE = {t: f for f in FAMILIES for t in f.model_types}


def text_config(config: Any) -> Any:
    """The decoder's config (a multimodal wrapper's text_config, else the config itself)."""
    return getattr(config, "text_config", None) or config


def family_of(config: Any) -> TargetFamily:
    """The family of an HF config, or one line saying why trtspec cannot draft for this model."""
    refuse_non_decoder(config)
    model_type = getattr(text_config(config), "model_type", None)
    if model_type not in BY_MODEL_TYPE:
        raise ModelError(f"model_type '{model_type}' is not a decoder family trtspec knows",
                         f"known: {', '.join(sorted(BY_MODEL_TYPE))} (trtspec.targets.FAMILIES)")
    return BY_MODEL_TYPE[model_type]


def refuse_non_decoder(config: Any) -> None:
    """Vision-language, encoder-decoder and embedding checkpoints: one line naming the architecture and what to do."""
    archs = getattr(config, "architectures", None) or []
    arch = archs[0] if archs else type(config).__name__
    model_type = getattr(config, "model_type", "?")
    if getattr(config, "is_encoder_decoder", False):
        raise ModelError(f"'{arch}' ({model_type}) is an encoder-decoder model: speculative decoding here drafts for "
                         "decoder-only causal LMs", "give a decoder-only checkpoint (…ForCausalLM)")
    if getattr(config, "vision_config", None) is not None or getattr(config, "audio_config", None) is not None:
        raise ModelError(f"'{arch}' ({model_type}) is a multimodal model: trtspec drafts for text decoders only",
                         "give the text-only checkpoint of the same family (…ForCausalLM)")
    if archs and not any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in archs):
        raise ModelError(f"'{arch}' ({model_type}) is not a causal LM (an embedding or classification model?)",
                         "give a checkpoint whose architectures name a …ForCausalLM")


def family_if_known(model_dir: Path) -> TargetFamily | None:
    """read_family, or None where the folder's config names no family (an engine then says what it can do)."""
    config = config_if_known(model_dir)
    return None if config is None else family_of(config)


def config_if_known(model_dir: Path) -> Any:
    """read_config where its family is known, else None."""
    try:
        config = read_config(model_dir)
        family_of(config)
        return config
    except ModelError:
        return None


def read_family(model_dir: Path) -> TargetFamily:
    """The family of the HF folder `model_dir` from its config.json alone (no transformers import): the preflight's
    check, before any stage spends time."""
    return family_of(read_config(model_dir))


def read_config(model_dir: Path) -> Any:
    """The HF folder's config.json as attributes (text_config too), read without transformers. Models that ship their
    own code need trust_remote_code, which trtspec does not set: refused by name."""
    from types import SimpleNamespace

    try:
        raw = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise ModelError(f"cannot read '{Path(model_dir) / 'config.json'}': {e.__class__.__name__}") from None
    if raw.get("auto_map"):
        raise ModelError(f"model '{model_dir}' ships its own modelling code (auto_map in config.json), which needs "
                         "trust_remote_code", "use a checkpoint of a family transformers implements natively")
    text = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else None
    ns = SimpleNamespace(**raw)
    if text is not None:
        ns.text_config = SimpleNamespace(**text)
    return ns


def rope_parameters(text: Any) -> dict:
    """The rope the draft uses: the target's full-attention rope (transformers 5 nests rope per layer type for
    sliding-window families; 4.x kept rope_theta + rope_scaling apart), rope_type and rope_theta always set."""
    params = dict(getattr(text, "rope_parameters", None) or getattr(text, "rope_scaling", None) or {})
    if isinstance(params.get("full_attention"), dict):
        params = dict(params["full_attention"])
    params.setdefault("rope_type", params.pop("type", "default"))
    params["rope_theta"] = float(params.get("rope_theta", getattr(text, "rope_theta", None) or 10000.0))
    return params


def global_attr(config: Any, name: str, default: Any = None) -> Any:
    """config.name as the config states it for the whole model, also where transformers (5.19+) refuses to read an
    attribute that varies by layer (Gemma 4's per_layer_config: a wider head on its full-attention layers). The
    draft is a layer of its own, sized by the model-wide value."""
    try:
        return getattr(config, name, default)
    except RuntimeError:  # AmbiguousGlobalPerLayerAttributeError
        return vars(config).get(name, default)


def draft_dims(config: Any) -> dict:
    """The sizes a draft layer takes from its target: a Llama-style layer as wide as the target's residual stream.

    MLA (DeepSeek) has no single head_dim: the draft's heads are hidden / heads wide. A mixture-of-experts target
    gives its dense width (intermediate_size) where it has one, else experts_per_token x the expert width."""
    text = text_config(config)
    heads = text.num_attention_heads
    head_dim = global_attr(text, "head_dim")
    if getattr(text, "kv_lora_rank", None):  # MLA: qk and v head sizes differ
        head_dim = None
    intermediate = global_attr(text, "intermediate_size")
    if not intermediate:
        per_expert = getattr(text, "moe_intermediate_size", None) or 4 * text.hidden_size
        intermediate = per_expert * (getattr(text, "num_experts_per_tok", None) or 1)
    return {
        "hidden_size": text.hidden_size,
        "num_attention_heads": heads,
        "num_key_value_heads": global_attr(text, "num_key_value_heads") or heads,
        "head_dim": head_dim or text.hidden_size // heads,
        "intermediate_size": intermediate,
        "vocab_size": text.vocab_size,
        "max_position_embeddings": text.max_position_embeddings,
        "rms_norm_eps": getattr(text, "rms_norm_eps", None) or 1e-6,
        "rope_parameters": rope_parameters(text),
    }


def default_aux_layers(num_layers: int) -> list[int]:
    """TensorRT-LLM's default eagle3_layers_to_capture: {1, L//2-1, L-4} (clamped for tiny models)."""
    return sorted({min(1, num_layers - 1), max(0, num_layers // 2 - 1), max(0, num_layers - 4)})
