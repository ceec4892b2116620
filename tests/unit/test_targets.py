"""Target families: every model a user brings is either a declared family or refused in one line naming it."""

from __future__ import annotations

import json

import pytest

from trtspec.errors import ModelError
from trtspec.targets import (
    BY_MODEL_TYPE,
    FAMILIES,
    default_aux_layers,
    draft_dims,
    family_of,
    read_family,
)
from trtspec.targets.tiny import SHAPES, TINY, tiny_config

SPECIAL = dict(bos_token_id=1, eos_token_id=2, pad_token_id=0)


def test_every_tiny_model_is_a_declared_family_and_back():
    assert {BY_MODEL_TYPE[model_type].name for model_type, _ in TINY.values()} == {f.name for f in FAMILIES}


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", list(TINY))
def test_draft_dims_come_from_the_config(name, shape):
    cfg = tiny_config(name, 1000, SPECIAL, shape)
    dims = draft_dims(cfg)
    assert dims["hidden_size"] == cfg.hidden_size and dims["vocab_size"] == 1000
    assert dims["num_attention_heads"] % dims["num_key_value_heads"] == 0
    assert dims["rope_parameters"]["rope_type"] and dims["rope_parameters"]["rope_theta"] > 0
    assert family_of(cfg).name == BY_MODEL_TYPE[TINY[name][0]].name


@pytest.mark.parametrize("name", list(TINY))
def test_every_family_builds_and_generates_in_its_deep_shape(name):
    """The second shape of each family (6 layers, 8 query heads over 2 KV heads, alternating layer types) is a model
    transformers builds and runs, and its draft takes its sizes (the matrix's full tier runs it through the pipeline)."""
    import torch
    from transformers import AutoModelForCausalLM

    base, cfg = tiny_config(name, 600, SPECIAL), tiny_config(name, 600, SPECIAL, "deep")
    assert cfg.num_hidden_layers == 6 != base.num_hidden_layers and cfg.num_attention_heads == 8
    if types := getattr(cfg, "layer_types", None):
        assert types != getattr(base, "layer_types", None) and len(types) == 6
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([[1, 5, 7, 9]]), max_new_tokens=3, do_sample=False, pad_token_id=0)
    assert out.shape == (1, 7)
    assert draft_dims(cfg)["num_attention_heads"] == 8


def test_draft_dims_of_special_layouts():
    qwen3 = draft_dims(tiny_config("qwen3", 1000, SPECIAL))
    assert qwen3["head_dim"] == 64 != qwen3["hidden_size"] // qwen3["num_attention_heads"]  # head_dim kept as given
    mla = draft_dims(tiny_config("deepseek_v3", 1000, SPECIAL))
    assert mla["head_dim"] == mla["hidden_size"] // mla["num_attention_heads"]  # MLA has no single head size
    gemma = tiny_config("gemma3", 1000, SPECIAL)
    assert draft_dims(gemma)["rope_parameters"] == {**gemma.rope_parameters["full_attention"], "rope_theta": float(
        gemma.rope_parameters["full_attention"]["rope_theta"])}
    llama3 = draft_dims(tiny_config("llama3", 1000, SPECIAL))["rope_parameters"]
    assert llama3["rope_type"] == "llama3" and llama3["factor"] == 8.0
    gemma4 = tiny_config("gemma4", 1000, SPECIAL)  # a wider head on its full-attention layer, which transformers
    with pytest.raises(RuntimeError, match="per-layer attribute"):  # refuses to read as one value
        getattr(gemma4, "head_dim")  # noqa: B009
    assert draft_dims(gemma4)["head_dim"] == 32  # the model-wide value: the draft is a layer of its own
    assert gemma4.vocab_size_per_layer_input == 1000  # its per-layer embeddings sized by the tokenizer too


def test_default_aux_layers_follow_tensorrt_llm():
    assert default_aux_layers(30) == [1, 14, 26] and default_aux_layers(32) == [1, 15, 28]
    assert default_aux_layers(4) == [0, 1]


@pytest.mark.parametrize("raw, words", [
    ({"model_type": "t5", "architectures": ["T5ForConditionalGeneration"], "is_encoder_decoder": True}, "encoder-decoder"),
    ({"model_type": "llava", "architectures": ["LlavaForConditionalGeneration"], "vision_config": {"model_type": "clip"},
      "text_config": {"model_type": "llama"}}, "multimodal"),
    ({"model_type": "bert", "architectures": ["BertModel"]}, "not a causal LM"),
    ({"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "auto_map": {"AutoModelForCausalLM": "x.Y"}}, "trust_remote_code"),
    ({"model_type": "falcon_h9", "architectures": ["FalconH9ForCausalLM"]}, "model_type 'falcon_h9'"),
])
def test_models_no_family_serves_are_refused_in_one_line(tmp_path, raw, words):
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ModelError) as e:
        read_family(tmp_path)
    assert words in e.value.message and "\n" not in e.value.message


def test_vllm_refusals_are_its_support_tables():
    from trtspec.engines.vllm.support import refusal_for

    assert "SupportsEagle3" in refusal_for("gemma3", "eagle3", on_gpu=False)
    assert refusal_for("qwen3_moe", "eagle3", on_gpu=True) is None
    assert "KV block size" in refusal_for("deepseek_v3", "eagle3", on_gpu=False)
    assert refusal_for("deepseek_v3", "eagle3", on_gpu=True) is None


def test_vllm_cpu_head_sizes_as_its_files_compute_them():
    """vLLM's CPU attention runs some head sizes only; Qwen2's file takes hidden / heads whatever head_dim says."""
    from types import SimpleNamespace as C

    from transformers import AutoConfig

    from trtspec.engines.vllm.support import cpu_head_refusal, head_sizes
    from trtspec.models import tiny_model
    from trtspec.targets.tiny import TINY, overrides

    assert head_sizes(C(hidden_size=128, num_attention_heads=8, head_dim=32), "qwen2") == [16]
    assert head_sizes(C(hidden_size=128, num_attention_heads=8, head_dim=32), "llama") == [32]
    assert head_sizes(C(hidden_size=576, num_attention_heads=9, head_dim=None), "llama") == [64]
    assert head_sizes(C(hidden_size=128, num_attention_heads=4, kv_lora_rank=32), "deepseek_v3") == []
    # Gemma 4's wider full-attention heads (transformers 5.19 refuses a model-wide head_dim read: an internal error)
    gemma4 = AutoConfig.from_pretrained(tiny_model("gemma4"))
    assert head_sizes(gemma4, "gemma4") == [32, 64] and cpu_head_refusal(gemma4, "gemma4") is None
    assert cpu_head_refusal(C(hidden_size=128, num_attention_heads=4, head_dim=32, per_layer_config={"3": {"head_dim": 48}}),
                            "gemma4").endswith("this target's are 48")
    assert "this target's are 16 (hidden_size / num_attention_heads" in cpu_head_refusal(
        C(hidden_size=128, num_attention_heads=8, head_dim=32), "qwen2")
    assert cpu_head_refusal(C(hidden_size=896, num_attention_heads=14, head_dim=None), "qwen2") is None  # Qwen2.5-0.5B
    for family in TINY:  # every tiny shape runs in vLLM's CPU build
        for shape in ("base", "deep", "wide"):
            assert cpu_head_refusal(C(**overrides(family, shape)), family) is None, (family, shape)


def test_every_engine_declares_every_family():
    """A family added to trtspec.targets without a line in each engine's support table fails here, not in a build."""
    from trtspec.engines import ENGINES, matrix_rows

    for short, eng in ENGINES.items():
        for f in FAMILIES:
            assert isinstance(eng.support_row(f.name), dict), (short, f.name)
    assert {r["family"] for r in matrix_rows()} == {f.name for f in FAMILIES}


def test_vllm_states_follow_the_familys_eagle3_capture():
    from trtspec.engines import matrix_rows

    rows = {r["family"]: r for r in matrix_rows()}
    assert rows["qwen3_moe"]["vllm_states"] and not rows["mixtral"]["vllm_states"]


def test_the_wide_shape_routes_as_the_mixtures_users_bring():
    """tiny:FAMILY:wide: 512 wide, and every mixture of experts routes each token to 8 of 64 experts."""
    from trtspec.targets.tiny import EXPERTS

    for name in TINY:
        cfg = tiny_config(name, 1000, SPECIAL, "wide")
        assert cfg.hidden_size == 512
        experts = [getattr(cfg, k) for k in EXPERTS if k in TINY[name][1]]
        assert experts in ([], [64]) and (not experts or cfg.num_experts_per_tok == 8), name
    assert sum(bool(set(EXPERTS) & set(extra)) for _, extra in TINY.values()) == 5  # qwen3_moe, qwen2_moe, mixtral, gpt_oss, deepseek_v3
