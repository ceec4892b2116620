"""A DFlash2 bundle against vLLM 0.32's own code: its CPU build refuses the draft (pinned: DFlash2 drafts only in the
V2 GPU model runner), its qwen3_dflash2 model loads every weight trtspec exports as exported, and its convolution and
candidate-scoring code compute what trtspec's runtime computes."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from stagekit import export_random_dflash2, rerandomized
from vllm_harness import vllm_model

pytest.importorskip("vllm", reason="vLLM is not installed (bash scripts/setup.sh --engines vllm)")
pytest.importorskip("speculators", reason="speculators is not installed (bash scripts/setup.sh --engines vllm)")

K = 7
REFUSAL = "Model Runner V1 does not support: DFlash candidate-head drafts"  # vllm/config/vllm.py, its CPU build


@pytest.fixture(scope="module")
def bundle(tmp_path_factory, tiny_model_dir) -> Path:
    root = tmp_path_factory.mktemp("dflash2") / "bundle"
    target = rerandomized(tiny_model_dir, root / "target", seed=0)
    export_random_dflash2(target, root / "draft")
    shutil.rmtree(root / "train")
    return root


def engine_args(bundle: Path):
    from vllm.engine.arg_utils import EngineArgs

    from trtspec.engines import vllm as vl

    return EngineArgs(model=str(bundle / "target"), dtype=vl.target_dtype(bundle / "target"), max_model_len=256,
                      max_num_seqs=2, enforce_eager=True, seed=0,
                      speculative_config={"method": "dflash", "model": str(bundle / "draft"), "num_speculative_tokens": K})


def test_vllms_cpu_build_refuses_the_dflash2_draft(bundle, monkeypatch):
    """vLLM's own refusal, pinned: why trtspec's bundle has no launcher and its engine stage is skipped."""
    import torch

    from trtspec.dflash2.family import DFLASH2
    from trtspec.engines import vllm as vl

    assert not torch.cuda.is_available()
    assert REFUSAL in DFLASH2.no_engine
    for key, value in vl.cpu_environment(1).items():
        monkeypatch.setenv(key, os.environ.get(key, value))
    with pytest.raises(ValueError, match=REFUSAL):  # pydantic's ValidationError of VllmConfig
        engine_args(bundle).create_engine_config()


def test_vllms_dflash2_model_loads_the_draft_and_computes_as_the_runtime(bundle, monkeypatch):
    """vLLM's engine config and its DFlash2Qwen3ForCausalLM, built as its V2 runner builds them (the V1 runner's
    refusal stepped over): every weight loaded as the file holds it; its convolution (`_grouped_conv`, the torch path
    it takes off CUDA) and its candidate scores walked greedily (`_score_edges`, as `_selector_walk_kernel` walks
    them) give what trtspec's runtime gives on the same rows."""
    import torch
    import torch.nn.functional as F
    from safetensors.torch import load_file
    from vllm.config import VllmConfig
    from vllm.model_executor.models.qwen3_dflash2 import DFlash2Qwen3ForCausalLM, _grouped_conv, _score_edges

    from trtspec.dflash2.runtime import load_dflash2_drafter
    from trtspec.engines import vllm as vl
    from trtspec.runtime.model import load_transformer

    for key, value in vl.cpu_environment(1).items():
        monkeypatch.setenv(key, os.environ.get(key, value))
    monkeypatch.setattr(VllmConfig, "_validate_v1_model_runner", lambda self: None)
    vc = engine_args(bundle).create_engine_config()
    assert vc.speculative_config.draft_model_config.architectures[0] == "DFlash2DraftModel"
    weights = load_file(str(bundle / "draft" / "model.safetensors"))
    with vllm_model(vc, DFlash2Qwen3ForCausalLM) as model:
        model.load_weights(weights.items())
    vm = model.model
    for name in ("layers.1.attention_conv.base_kernel", "layers.0.mlp_conv.kernel_projection.weight",
                 "candidate_selector.predecessor_codebook", "candidate_selector.hidden_projection.weight", "fc.weight"):
        assert torch.equal(vm.get_parameter(name).data, weights[name].to(vm.get_parameter(name).dtype)), name

    target = load_transformer(bundle / "target")[0]
    drafter = load_dflash2_drafter(bundle / "draft", target, weights="float32")
    g = torch.Generator().manual_seed(0)
    rows = torch.randn(K + 1, target.args.hidden_size, generator=g)
    ours, theirs = drafter.net.layers[1].attention_conv, vm.layers[1].attention_conv

    def vllm_conv(x, side):  # DFlashGroupedConv.prepare / finish, its projection's weight applied by hand (vLLM's
        # CPU linear is set up by its model runner, not here)
        delta = F.linear(x, theirs.kernel_projection.weight.float()).reshape(K + 1, 2, theirs.taps, theirs.num_groups)
        return _grouped_conv(x, delta[:, side], theirs.base_kernel[side].float(), K + 1, theirs.num_groups,
                             theirs.group_size, theirs.taps)

    mine, kernel = ours.prepare(rows)
    assert torch.allclose(mine, vllm_conv(rows, 0), atol=1e-5)
    assert torch.allclose(ours.finish(rows, ours.prepare(rows)[1]), vllm_conv(rows, 1), atol=1e-5)

    hid = torch.randn(K, target.args.hidden_size, generator=g)
    logits = torch.randn(K, target.args.vocab_size, generator=g) * 4
    selector, root = vm.candidate_selector, 33
    unary, candidates = logits.topk(selector.top_k, dim=-1)
    edges = _score_edges(selector.predecessor_codebook.float(), selector.successor_codebook.float(), candidates[None],
                         unary[None], F.linear(hid, selector.hidden_projection.weight.float())[None],
                         torch.tensor([root]), selector.top_k)[0]  # [K, previous candidate, candidate]
    walk, previous = [], 0
    for step in range(K):
        previous = int(edges[step, previous].argmax())
        walk.append(int(candidates[step, previous]))
    assert drafter.selector.walk(root, logits, hid, 0.0)[0] == walk
