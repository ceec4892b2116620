"""vLLM and the DSpark bundle trtspec exports (speculative method dspark, a vanilla Markov head, chains as long as the
block). vLLM 0.32 runs method dspark only in its V2 model runner, which needs Triton and a GPU: its CPU build refuses
the config before it loads a weight. So here, in that build:

- the refusal, pinned word for word, and trtspec's own one-line refusal of the engine (stage and adapter);
- vLLM's own DSpark loader (Qwen3DSparkForCausalLM, with the refusal stepped over) reads the bundle's draft as trained:
  its architecture, target layers, mask token, block and the Markov head's weights, which it would not read under
  Model Optimizer's names;
- trtspec's runtime with the draft decodes exactly as the target alone.

When vLLM's CPU build runs DSpark, the pinned refusal fails: this file then takes test_vllm_dflash.py's comparison
(greedy outputs equal to the target's and the runtime's, vLLM's acceptance counters within 2% of the runtime's)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from vllm_harness import build_on_ci_data, eos_of, vllm_model

pytest.importorskip("vllm", reason="vLLM is not installed (bash scripts/setup.sh --engines vllm)")

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "build_configs" / "smollm2-135m-dflash-ci.yaml"
# DSpark's block of 8 drafts 8 (the anchor's row guesses too): TensorRT-LLM needs max_draft_len == block_size, and vLLM
# would draft from a block of num_speculative_tokens rows
OVERRIDES = ["dflash.projector=dspark", "dflash.markov_head=vanilla", "dflash.markov_rank=64", "draft.length=8"]
K, MAX_NEW = 8, 32
REFUSAL = "Model Runner V1 does not support: dspark speculative decoding"  # vllm/config/vllm.py, its CPU build


@pytest.fixture(scope="module")
def dspark_run(ci_run, tmp_path_factory) -> Path:
    """The DFlash CI recipe with a DSpark projector, up to the bundle, on the EAGLE-3 interop run's data stage."""
    return build_on_ci_data(ci_run, tmp_path_factory.mktemp("dspark") / "run", CONFIG, OVERRIDES)


@pytest.fixture(scope="module")
def bundle(dspark_run) -> Path:
    return dspark_run / "bundle"


def test_the_bundle_names_dspark_for_every_engine(bundle):
    import yaml

    cfg = json.loads((bundle / "draft" / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3DSparkModel", "DFlashDraftModel"] and cfg["block_size"] == K
    assert (cfg["markov_rank"], cfg["markov_head_type"], cfg["sample_from_anchor"]) == (64, "vanilla", True)
    assert cfg["dflash_config"]["projector_type"] == "dspark" and cfg["dflash_config"]["markov_rank"] == 64
    spec = yaml.safe_load((bundle / "llm_api_options.yaml").read_text())["speculative_config"]
    assert spec == {"decoding_type": "DSpark", "max_draft_len": K, "speculative_model": "./draft"}
    assert '"method": "dspark"' in (bundle / "snippets" / "vllm.sh").read_text()
    assert f"--speculative-algorithm DSPARK --speculative-draft-model-path ./draft --speculative-num-draft-tokens {K + 1}" in (
        bundle / "snippets" / "sglang.sh").read_text()


def test_vllms_cpu_build_refuses_dspark_and_trtspec_says_why(bundle):
    """vLLM's own refusal, pinned; trtspec's adapter refuses first, in one line naming vLLM and the reason."""
    import torch

    from trtspec.draft_families import speculative_method
    from trtspec.engines import vllm as vl
    from trtspec.errors import MissingDependency

    assert not torch.cuda.is_available()
    assert speculative_method(bundle / "draft") == "dspark"
    with pytest.raises(MissingDependency, match="^vLLM's CPU build cannot run a DSpark draft: .*V2 model runner"):
        vl.load(bundle / "target", bundle / "draft", K, 256, 2, method="dspark")
    from vllm import LLM

    with pytest.raises(ValueError, match=REFUSAL):  # pydantic's ValidationError of VllmConfig
        LLM(model=str(bundle / "target"), dtype=vl.target_dtype(bundle / "target"), max_model_len=256, max_num_seqs=2,
            enforce_eager=True, speculative_config={"method": "dspark", "model": str(bundle / "draft"), "num_speculative_tokens": K})


def test_vllms_dspark_loader_reads_the_draft_as_trained(bundle, monkeypatch):
    """vLLM's engine config and its Qwen3DSparkForCausalLM, built as its V2 runner builds them (the V1 runner's refusal
    stepped over): method dspark, K speculative tokens, the target layers it captures (trtspec's + 1: vLLM counts the
    state entering a layer), the mask token, the anchor's row sampled; every weight loaded as the file holds it. Under
    Model Optimizer's flat names (markov_w1/markov_w2) its loader would refuse the Markov head."""
    import torch
    from safetensors.torch import load_file
    from vllm.config import VllmConfig
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.models.qwen3_dspark import Qwen3DSparkForCausalLM
    from vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils import get_eagle3_aux_layers_from_config
    from vllm.v1.worker.gpu.spec_decode.utils import get_parallel_drafting_token_id

    from trtspec.engines import vllm as vl

    for key, value in vl.cpu_environment(1).items():
        monkeypatch.setenv(key, os.environ.get(key, value))
    monkeypatch.setattr(VllmConfig, "_validate_v1_model_runner", lambda self: None)
    args = EngineArgs(model=str(bundle / "target"), dtype=vl.target_dtype(bundle / "target"), max_model_len=256,
                      max_num_seqs=2, enforce_eager=True, seed=0,
                      speculative_config={"method": "dspark", "model": str(bundle / "draft"), "num_speculative_tokens": K})
    vc = args.create_engine_config()
    sc, draft = vc.speculative_config, json.loads((bundle / "draft" / "config.json").read_text())
    assert (sc.method, sc.num_speculative_tokens, sc.draft_model_config.architectures[0]) == ("dspark", K, "Qwen3DSparkModel")
    assert list(get_eagle3_aux_layers_from_config(sc)) == [i + 1 for i in draft["dflash_config"]["target_layer_ids"]]
    assert get_parallel_drafting_token_id(sc.draft_model_config.hf_config) == draft["dflash_config"]["mask_token_id"]
    assert sc.draft_model_config.hf_config.sample_from_anchor is True and vc.num_lookahead_tokens == K

    weights = load_file(str(bundle / "draft" / "model.safetensors"))
    with vllm_model(vc, Qwen3DSparkForCausalLM) as model:
        flat = {k.removeprefix("markov_head."): v for k, v in weights.items()}  # as Model Optimizer names them
        with pytest.raises(ValueError, match="markov_w1"):
            model.load_weights(flat.items())
        model.load_weights(weights.items())
        loaded = {"markov_head.markov_w1.weight": model.model.markov_head.markov_w1.weight,
                  "markov_head.markov_w2.weight": model.model.markov_head.markov_w2.weight,
                  "fc.weight": model.model.fc.weight, "norm.weight": model.model.norm.weight}
        for name, param in loaded.items():
            assert torch.equal(param.data, weights[name].to(param.dtype)), name


def test_the_runtime_serves_the_dspark_bundle_exactly(bundle):
    import torch

    from trtspec.chat import encode_prompt
    from trtspec.draft_families import load_drafter
    from trtspec.models import load_tokenizer
    from trtspec.runtime import DraftSpec, generate, load_transformer, speculative_on_prompts

    tok = load_tokenizer(bundle / "target")
    rows = [json.loads(line) for line in (bundle.parent / "data" / "train.jsonl").read_text().splitlines() if line.strip()]
    prompts = [encode_prompt(tok, r["messages"][:-1]) for r in rows[:4]]
    target, _ = load_transformer(bundle / "target")
    drafter = load_drafter(bundle / "draft", target)
    assert drafter.markov is not None and drafter.info.guesses == K
    eos = eos_of(bundle)
    outputs, stats = speculative_on_prompts(target, drafter, prompts, MAX_NEW, DraftSpec(k=K), eos)
    assert outputs == [generate(target, torch.tensor(p), MAX_NEW, eos).tokens for p in prompts]
    assert stats.acceptance_length() >= 1.0
