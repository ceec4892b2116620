"""Tiny random decoders of every family, built in code from each family's HF config class (seconds each), with a real
tokenizer and chat template (the embedded demo model's): `model.source: tiny:<family>`. They exercise each family's
own layers (MoE routing, sliding windows, MLA, qk-norm, fused projections, scaled embeddings) through the whole
pipeline without a hub; their weights are random, so acceptance on them measures nothing but exactness."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

HIDDEN = 128  # 4 heads of 32: the smallest head vLLM's CPU attention takes
LAYERS = 4
COMMON = dict(hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=2,
              intermediate_size=256, max_position_embeddings=2048)

# family -> (HF model_type, overrides of COMMON and the family's defaults). Each shows what sets the family apart.
TINY = {
    "llama3": ("llama", dict(head_dim=32, tie_word_embeddings=False, rope_parameters={
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 256})),
    "qwen2": ("qwen2", dict(tie_word_embeddings=True)),  # q/k/v biases
    "qwen3": ("qwen3", dict(head_dim=64, tie_word_embeddings=True)),  # qk-norm; head_dim != hidden / heads
    "qwen3_moe": ("qwen3_moe", dict(head_dim=32, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                    decoder_sparse_step=1, mlp_only_layers=[0], tie_word_embeddings=False)),
    "qwen2_moe": ("qwen2_moe", dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                    shared_expert_intermediate_size=64, tie_word_embeddings=False)),
    "mistral": ("mistral", dict(num_key_value_heads=1, head_dim=32, tie_word_embeddings=False)),  # MQA
    "mixtral": ("mixtral", dict(num_local_experts=4, num_experts_per_tok=2, tie_word_embeddings=False)),
    "gemma3": ("gemma3_text", dict(head_dim=32, sliding_window=16, layer_types=[
        "sliding_attention", "sliding_attention", "sliding_attention", "full_attention"], query_pre_attn_scalar=32)),
    "gemma4": ("gemma4_text", dict(head_dim=32, sliding_window=16, layer_types=[  # per-layer embeddings, a wider full-attention head
        "sliding_attention", "sliding_attention", "sliding_attention", "full_attention"], hidden_size_per_layer_input=16,
        per_layer_config={"03": {"head_dim": 64}})),
    "phi3": ("phi3", dict(num_key_value_heads=4, tie_word_embeddings=False)),  # fused qkv and gate_up projections
    "gpt_oss": ("gpt_oss", dict(head_dim=32, num_local_experts=4, num_experts_per_tok=2, sliding_window=16,
                                layer_types=["sliding_attention", "full_attention"] * 2, tie_word_embeddings=False,
                                rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 8.0,
                                                 "original_max_position_embeddings": 256, "beta_fast": 32.0, "beta_slow": 1.0})),
    "deepseek_v3": ("deepseek_v3", dict(num_key_value_heads=4, q_lora_rank=64, kv_lora_rank=32, qk_rope_head_dim=16,
                                        qk_nope_head_dim=32, v_head_dim=32, n_routed_experts=4, n_shared_experts=1,
                                        num_experts_per_tok=2, moe_intermediate_size=32, first_k_dense_replace=1,
                                        n_group=1, topk_group=1, tie_word_embeddings=False,
                                        topk_method="noaux_tc", scoring_func="sigmoid")),  # MLA; V3's routing, as its config.json says
    "granite": ("granite", dict(embedding_multiplier=2.0, residual_multiplier=0.7, logits_scaling=2.0,
                                attention_multiplier=0.03125, tie_word_embeddings=False)),
    "olmo2": ("olmo2", dict(tie_word_embeddings=False)),  # norms after attention and MLP
    "smollm3": ("smollm3", dict(no_rope_layers=[1, 1, 1, 0], tie_word_embeddings=True)),  # NoPE layers
}


# A second shape of every family (`tiny:FAMILY:deep`), so that the matrix tests the family, not one model of it:
# 6 layers, 8 query heads of 32 over 2 KV heads (groups of 4, against 2; 256 wide where the family's heads are hidden
# / heads wide), sliding and full attention alternating (GPT-OSS's own pattern, against three sliding then one full),
# the per-layer lists (NoPE layers, a wider full-attention head) drawn anew for 6 layers.
# A third (`tiny:FAMILY:wide`): 512 wide, and a mixture of experts routed as the ones users bring (Qwen3-30B-A3B sends
# each token to 8 of 128 experts) with 64 experts, top 8: a target whose cost is in its experts, not in per-call
# overhead as at 128 wide with 4 experts (scripts/bench_states.py compares HF's and vLLM's states on it).
SHAPES = ("base", "deep", "wide")
EXPERTS = ("num_experts", "num_local_experts", "n_routed_experts")  # each family's name for its routed experts


def deep(family: str, extra: dict) -> dict:
    """The family's overrides in the deep shape."""
    layers = 6
    shaped = {**extra, "num_hidden_layers": layers, "num_attention_heads": 8, "num_key_value_heads": 2}
    if "kv_lora_rank" in extra:  # MLA: heads of their own sizes, one KV head per query head
        shaped["num_key_value_heads"] = 8
    elif "head_dim" in extra:
        shaped["head_dim"] = 32
    else:  # heads of hidden / heads, as the family's releases have them (vLLM's Qwen2 reads no other head_dim)
        shaped["hidden_size"] = 8 * 32
    if "layer_types" in extra:
        shaped["layer_types"] = ["sliding_attention", "full_attention"] * (layers // 2)
    if "per_layer_config" in extra:
        shaped["per_layer_config"] = {f"{i:02d}": {"head_dim": 64} for i in range(1, layers, 2)}
    if "no_rope_layers" in extra:
        shaped["no_rope_layers"] = [1, 1, 0] * (layers // 3)
    return shaped


def wide(family: str, extra: dict) -> dict:
    """The family's overrides in the wide shape."""
    shaped = {**extra, "hidden_size": 512, "num_attention_heads": 8, "num_key_value_heads": 8 if "kv_lora_rank" in extra
              else 4, "intermediate_size": 1024}
    if "head_dim" in extra:
        shaped["head_dim"] = 64
    if experts := [k for k in EXPERTS if k in extra]:
        shaped |= {experts[0]: 64, "num_experts_per_tok": 8}
        if "moe_intermediate_size" in extra:
            shaped["moe_intermediate_size"] = 128
        else:  # Mixtral's and GPT-OSS's experts are intermediate_size wide
            shaped["intermediate_size"] = 128
    return shaped


def split_source(name: str) -> tuple[str, str]:
    """`FAMILY` or `FAMILY:SHAPE` (tiny:qwen3:deep) -> (family, shape)."""
    family, _, shape = name.partition(":")
    return family, shape or "base"


def overrides(family: str, shape: str = "base") -> dict:
    """The family's config fields in `shape`, COMMON's included (vocabulary and special tokens come from the tokenizer)."""
    extra = TINY[family][1]
    return {**COMMON, **({"deep": deep, "wide": wide}[shape](family, extra) if shape != "base" else extra)}


def fingerprint(family: str, shape: str = "base") -> str:
    """8 hex digits of the family's definition in `shape`: its cache folder is named by it, so a definition changed
    since an earlier build is built anew, never read from that build."""
    import hashlib

    text = json.dumps([TINY[family][0], overrides(family, shape)], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def tiny_config(family: str, vocab_size: int, special: dict[str, int], shape: str = "base") -> Any:
    from transformers import CONFIG_MAPPING

    config = CONFIG_MAPPING[TINY[family][0]](vocab_size=vocab_size, **overrides(family, shape), **special)
    if hasattr(config, "vocab_size_per_layer_input"):  # Gemma 4's per-layer embeddings: the tokenizer's vocabulary too
        config.vocab_size_per_layer_input = vocab_size
    return config


def build_tiny(family: str, out: Path, tok: Any, seed: int = 0, shape: str = "base") -> Path:
    """A tiny random `family` decoder of `shape` saved as an HF folder at `out` (atomically), with the tokenizer `tok`."""
    import torch
    from transformers import AutoModelForCausalLM

    if out.is_dir() and (out / "config.json").is_file():
        return out
    special = dict(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(family, len(tok), special, shape), dtype=torch.float32)
    with torch.no_grad():  # random init of this size gives near-uniform logits: spread them so argmax is well defined
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.08)
    model.generation_config.update(**special)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    (tmp / "trtspec-source.json").write_text(json.dumps({"tiny": family, "shape": shape, "seed": seed}) + "\n")
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return out
