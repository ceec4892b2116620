"""What each engine reads from a bundle (trtspec/deploy/compat.py): aux-layer numbering, vocab maps, legacy config keys,
and the per-engine verdict on a draft."""

from __future__ import annotations

import pytest
import torch

from trtspec.deploy.compat import engine_problems, legacy_config_keys, t2d_from_d2t, vllm_aux_ids
from trtspec.errors import ConfigError

TARGET = {"hidden_size": 64, "vocab_size": 100, "num_hidden_layers": 30}
DRAFT = {"hidden_size": 64, "vocab_size": 100, "draft_vocab_size": 10, "num_hidden_layers": 1,
         "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 14, 26]}, "eagle_aux_hidden_state_layer_ids": [2, 15, 27]}
TENSORS = {"fc.weight", "d2t", "t2d"}


def test_vllm_numbers_the_state_entering_a_layer():
    # TensorRT-LLM's default {1, L//2-1, L-4} and vLLM's (2, L//2, L-3) are the same layers for L = 30
    assert vllm_aux_ids([1, 14, 26]) == [2, 15, 27]


def test_t2d_marks_the_target_ids_d2t_reaches():
    d2t = torch.tensor([0, 2, 5])  # draft ids 0, 1, 2 -> target ids 0, 3, 7
    assert t2d_from_d2t(d2t, 8).nonzero().flatten().tolist() == [0, 3, 7]


def test_legacy_keys_equal_the_transformers5_ones():
    plain = {"rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"}, "dtype": "bfloat16"}
    assert legacy_config_keys(plain) == {"rope_theta": 100000.0, "rope_scaling": None, "torch_dtype": "bfloat16"}
    llama3 = {"rope_parameters": {"rope_theta": 500000.0, "rope_type": "llama3", "factor": 8.0}}
    assert legacy_config_keys(llama3) == {"rope_theta": 500000.0,
                                          "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "type": "llama3"}}
    assert legacy_config_keys({"rope_theta": 1e4}) == {}  # a transformers-4 config: nothing to add


def test_a_draft_every_engine_loads():
    assert engine_problems(DRAFT, TARGET, TENSORS) == {"TensorRT-LLM": [], "vLLM": [], "SGLang": [], "speculators": []}


@pytest.mark.parametrize(("change", "tensors", "engines", "text"), [
    ({"eagle_aux_hidden_state_layer_ids": None}, TENSORS, {"vLLM"}, "top-level eagle_aux_hidden_state_layer_ids"),
    ({"num_hidden_layers": 2}, TENSORS, {"TensorRT-LLM", "SGLang", "speculators"}, "num_hidden_layers 2"),
    ({"hidden_size": 32}, TENSORS, {"TensorRT-LLM", "vLLM", "SGLang", "speculators"}, "hidden_size 32 != the target's 64"),
    ({}, {"fc.weight", "d2t"}, {"speculators"}, "no t2d"),
    ({}, {"fc.weight"}, {"TensorRT-LLM", "vLLM", "SGLang", "speculators"}, "no d2t"),
    ({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 29]}, "eagle_aux_hidden_state_layer_ids": [2, 30]},
     TENSORS, {"TensorRT-LLM", "vLLM", "SGLang", "speculators"}, "[29] outside the target's layers 0..28"),
    ({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 3, 4]}, "eagle_aux_hidden_state_layer_ids": [2, 3, 4, 5]},
     TENSORS, {"speculators"}, "4 aux layers"),
])
def test_each_engine_names_what_it_cannot_load(change, tensors, engines, text):
    problems = engine_problems({**DRAFT, **change}, TARGET, tensors)
    assert {e for e, p in problems.items() if p} == engines
    assert all(any(text in line for line in problems[e]) for e in engines)


def test_export_refuses_multi_layer_heads_before_any_stage(tmp_path):
    from trtspec.config import config_from_dict
    from trtspec.stages import export

    cfg = config_from_dict({"data": {"sources": [{"kind": "jsonl", "path": "x.jsonl"}]}, "convert": {"num_layers": 2}})
    with pytest.raises(ConfigError, match="TensorRT-LLM expects hidden_norm on every draft layer"):
        export.preflight(cfg, None)


def test_export_refuses_for_required_engines_and_skips_the_others_launchers(tmp_path):
    """TensorRT-LLM (and the engine stage's engine) must load the draft; another that cannot gets no launcher."""
    import json

    from trtspec.deploy.compat import check_engines_load
    from trtspec.deploy.serving import write_snippets
    from trtspec.eagle.family import EAGLE3
    from trtspec.errors import ArtifactError

    for name, cfg in (("draft", {**DRAFT, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 26]},
                                 "eagle_aux_hidden_state_layer_ids": [2, 27]}), ("target", TARGET)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(cfg))
    not_served = check_engines_load(tmp_path / "draft", tmp_path / "target", list(TENSORS), {"TensorRT-LLM"})
    assert list(not_served) == ["speculators"] and "2 aux layers" in not_served["speculators"][0]
    with pytest.raises(ArtifactError, match="speculators: 2 aux layers"):
        check_engines_load(tmp_path / "draft", tmp_path / "target", list(TENSORS), {"TensorRT-LLM", "speculators"})
    options = {"speculative_config": {"decoding_type": "Eagle3", "max_draft_len": 3, "eagle3_layers_to_capture": [1, 26]}}
    written = write_snippets(tmp_path / "snippets", options, EAGLE3, "float32", skip=set(not_served))
    assert sorted(p.name for p in written) == ["sglang.sh", "vllm.sh"]
