"""The quantize stage on the tiny Llama: up-front checks, PTQ formats, and that the saved state rebuilds the model."""

from __future__ import annotations

import json

import pytest
from stagekit import make_data, stage_ctx, tiny_config

from trtspec import ptq
from trtspec.errors import ConfigError, MissingDependency
from trtspec.stages import quantize


def test_block_size_picks_largest_that_divides_every_layer():
    assert ptq.pick_block_size({"a": 4096, "b": 14336}, None) == 128
    # SmolLM2: hidden 576 = 9 * 64, not a multiple of 128
    assert ptq.pick_block_size({"q_proj": 576, "down_proj": 1536}, None) == 64
    assert ptq.pick_block_size({"q_proj": 576}, 32) == 32


def test_block_size_errors_name_the_layers():
    with pytest.raises(ConfigError, match=r"block_size 128.*q_proj \(576\)") as e:
        ptq.pick_block_size({"model.layers.0.self_attn.q_proj": 576, "mlp.down_proj": 1536}, 128)
    assert "down_proj" not in e.value.message  # 1536 is a multiple of 128: only the layer that fails is named
    with pytest.raises(ConfigError, match=r"odd \(100\)"):
        ptq.pick_block_size({"odd": 100, "even": 128}, None)


class Q:  # a QuantizeSection stand-in for the checks
    def __init__(self, **kw):
        self.format, self.block_size, self.quantize_lm_head = kw.get("format", "fp8"), kw.get("block_size"), kw.get("lm", False)


def test_nvfp4_needs_cuda(monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    with pytest.raises(MissingDependency, match="nvfp4 needs a CUDA GPU"):
        ptq.check_quant_config(Q(format="nvfp4"))


def test_config_checks():
    with pytest.raises(ConfigError, match="block_size applies to int4_awq and w4a8_awq"):
        ptq.check_quant_config(Q(format="fp8", block_size=64))

    class Tied:
        tie_word_embeddings = True

    with pytest.raises(ConfigError, match="shares its weights with the embeddings"):
        ptq.check_quant_config(Q(format="fp8", lm=True), Tied())


def test_quant_config_sets_block_kv_and_lm_head():
    cfg = ptq.quant_config("w4a8_awq", "fp8", 64, quantize_lm_head=True)
    weight = next(e for e in cfg["quant_cfg"] if e.get("quantizer_name") == "*weight_quantizer")
    assert weight["cfg"][0]["block_sizes"][-1] == 64
    names = [e.get("quantizer_name") for e in cfg["quant_cfg"]]
    assert "*[kv]_bmm_quantizer" in names and "*lm_head*" not in names
    # the preset itself is untouched
    assert "*lm_head*" in [e.get("quantizer_name") for e in ptq.quant_config("w4a8_awq", "none", 64, False)["quant_cfg"]]


def test_format_none_writes_quant_json(tmp_path, tiny_model_dir):
    ctx = stage_ctx(tiny_config(tiny_model_dir, tmp_path), tmp_path / "run", "quantize", {})
    metrics = quantize.run(ctx)
    assert json.loads((ctx.out / "quant.json").read_text()) == {"format": "none"}
    assert "not quantized" in metrics["headline"]


@pytest.fixture(scope="module")
def fp8_run(tmp_path_factory, tiny_model_dir):
    run = tmp_path_factory.mktemp("q") / "run"
    data = make_data(run, tiny_model_dir)
    cfg = tiny_config(tiny_model_dir, run.parent, quantize={"format": "fp8", "kv_cache": "fp8", "calib_samples": 4},
                      eval={"num_prompts": 2, "max_new_tokens": 8})
    ctx = stage_ctx(cfg, run, "quantize", {"data": data})
    return ctx, quantize.run(ctx)


def test_fp8_metrics_and_state(fp8_run):
    ctx, m = fp8_run
    info = json.loads((ctx.out / "quant.json").read_text())
    assert info["format"] == "fp8" and info["kv_cache"] == "fp8" and info["quantized_layers"] == 4 * 7
    for f in info["files"]:
        assert (ctx.out / f).is_file()
    assert m["perplexity_before"] > 1 and m["perplexity_after"] > 1
    assert 0 <= m["greedy_agreement"] <= 1 and 0 <= m["identical_outputs"] <= 2
    assert m["restore_max_logit_diff"] == 0.0
    assert "perplexity" in m["headline"] and "agreement" in m["headline"]


def test_restore_rebuilds_a_quantized_model(fp8_run, tiny_model_dir):
    import torch

    from trtspec.models import load_model

    ctx, _ = fp8_run
    base = load_model(tiny_model_dir, "float32", "cpu")
    ids = torch.randint(0, 1000, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        plain = base(ids).logits
        restored = ptq.restore_quantized(load_model(tiny_model_dir, "float32", "cpu"), ctx.out)
        quantized = restored(ids).logits
    q = restored.model.layers[0].self_attn.k_proj
    assert q.weight_quantizer.is_enabled and q.input_quantizer.amax is not None
    assert restored.model.layers[0].self_attn.k_bmm_quantizer.is_enabled  # fp8 KV cache
    assert not restored.lm_head.weight_quantizer.is_enabled  # lm_head stays unquantized
    assert 0 < (plain - quantized).abs().max() < 1.0  # quantization changed the logits, a little
    with torch.no_grad():
        folded = ptq.fold_weights(restored)(ids).logits
    assert torch.allclose(folded, quantized, atol=1e-5)  # folding the weights changes speed, not numbers


def test_weights_modelopt_cannot_fold_stay_quantized_on_every_forward():
    """GPT-OSS's experts: modelopt's fold asserts that each `*_weight_quantizer` has its `*_weight` (transformers 5
    names them `down_proj`, `gate_up_proj`), and the quantize stage failed as an internal error. Folding skips them,
    and the numbers stay those of the quantized model."""
    import torch
    from transformers import AutoModelForCausalLM

    from trtspec.targets.tiny import tiny_config

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config("gpt_oss", 256, dict(bos_token_id=1, eos_token_id=2)), dtype=torch.float32).eval()
    ids = torch.randint(3, 256, (1, 12), generator=torch.Generator().manual_seed(0))
    model = ptq.calibrate(model, ptq.quant_config("fp8", "none", None, False), [(ids, None)])
    with torch.no_grad():
        quantized = model(ids).logits
        folded = ptq.fold_weights(model)(ids).logits
    assert torch.allclose(folded, quantized, atol=1e-5)
    experts = next(m for m in model.modules() if type(m).__name__.endswith("GptOssExperts"))
    assert experts.down_proj_weight_quantizer.is_enabled  # not folded: quantizing on every forward
    assert not model.model.layers[0].self_attn.q_proj.weight_quantizer.is_enabled  # folded


def test_int4_awq_picks_block_and_exports(tmp_path, tiny_model_dir):
    """The tiny model's widths are 64 and 128: block 64, and modelopt's exporter accepts it."""
    from modelopt.torch.export import export_hf_checkpoint

    from trtspec.models import load_model

    run = tmp_path / "run"
    data = make_data(run, tiny_model_dir)
    cfg = tiny_config(tiny_model_dir, tmp_path, quantize={"format": "int4_awq", "calib_samples": 2},
                      eval={"num_prompts": 1, "max_new_tokens": 4})
    ctx = stage_ctx(cfg, run, "quantize", {"data": data})
    m = quantize.run(ctx)
    assert m["block_size"] == 64 and "int4_awq/block 64" in m["headline"]
    model = ptq.restore_quantized(load_model(tiny_model_dir, "float32", "cpu"), ctx.out)
    export_hf_checkpoint(model, export_dir=tmp_path / "exported")
    algo = json.loads((tmp_path / "exported" / "hf_quant_config.json").read_text())["quantization"]
    assert algo["quant_algo"] == "W4A16_AWQ" and algo["group_size"] == 64


def test_block_size_that_does_not_divide_fails_before_calibration(tmp_path, tiny_model_dir):
    run = tmp_path / "run"
    cfg = tiny_config(tiny_model_dir, tmp_path, quantize={"format": "int4_awq", "block_size": 48})
    ctx = stage_ctx(cfg, run, "quantize", {"data": run / "data-not-needed"})
    with pytest.raises(ConfigError, match="block_size 48"):
        quantize.run(ctx)


def test_block_size_is_checked_against_the_layers_before_the_first_stage(tmp_path, tiny_model_dir):
    """The preflight builds the model on the meta device (no weights) and checks the block size against its layers:
    the tiny Gemma 4's 16-wide per-layer projections refused int4_awq only in the quantize stage, after training."""
    from transformers import AutoConfig

    from trtspec.models import tiny_model

    cfg = tiny_config(tiny_model_dir, tmp_path, quantize={"format": "int4_awq", "block_size": 48})
    with pytest.raises(ConfigError, match="block_size 48"):
        quantize.preflight(cfg, AutoConfig.from_pretrained(tiny_model_dir))
    gemma4 = AutoConfig.from_pretrained(tiny_model("gemma4"))
    with pytest.raises(ConfigError, match=r"block_size 32: 4 layer\(s\) .*per_layer_projection \(16\)"):
        quantize.preflight(tiny_config(tiny_model_dir, tmp_path, quantize={"format": "int4_awq"}), gemma4)
    quantize.preflight(tiny_config(tiny_model_dir, tmp_path, quantize={"format": "fp8"}), gemma4)  # no block: no check
