"""The export stage on the tiny Llama: bundle layout, the draft key/shape table, ONNX vs PyTorch, movability."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from stagekit import make_data, make_train, stage_ctx, tiny_config

from trtspec.eagle.checkpoint import check_draft_checkpoint, expected_keys
from trtspec.errors import ArtifactError, ConfigError
from trtspec.stages import export, quantize
from trtspec.training.acceptance import EVAL_SEQS

TEXT_SUFFIXES = {".json", ".yaml", ".yml", ".md", ".sh", ".txt", ".pbtxt", ".jinja", ".py", ""}


def _export(tmp: Path, model_dir: Path, quant: dict) -> tuple:
    run = tmp / "run"
    data = make_data(run, model_dir)
    train = make_train(run, model_dir)
    cfg = tiny_config(model_dir, tmp, quantize={"calib_samples": 2, **quant},
                      eval={"num_prompts": 1, "max_new_tokens": 4}, draft={"length": 2})
    qctx = stage_ctx(cfg, run, "quantize", {"data": data})
    quantize.run(qctx)
    ctx = stage_ctx(cfg, run, "export", {"train": train, "convert": train, "quantize": qctx.out})
    return ctx, export.run(ctx)


@pytest.fixture(scope="module")
def plain(tmp_path_factory, tiny_model_dir):
    return _export(tmp_path_factory.mktemp("plain"), tiny_model_dir, {"format": "none"})


@pytest.fixture(scope="module")
def fp8(tmp_path_factory, tiny_model_dir):
    return _export(tmp_path_factory.mktemp("fp8"), tiny_model_dir, {"format": "fp8", "kv_cache": "fp8"})


def test_bundle_layout(plain):
    ctx, m = plain
    b = ctx.out
    for f in ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (b / "target" / f).is_file(), f
    assert not (b / "target" / "hf_quant_config.json").exists()
    draft = json.loads((b / "draft" / "config.json").read_text())
    assert draft["architectures"] == ["LlamaForCausalLMEagle3"] and draft["draft_vocab_size"] == 256
    assert draft["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 1, 2]
    # the head was trained with the base's rope: modelopt's default yarn override must not reach the bundle
    assert (draft.get("rope_scaling") or {}).get("rope_type", "default") == "default"
    assert (b / "onnx" / "draft_head.onnx").is_file() and (b / "README.md").is_file()
    for f in m["serving_files"]:
        assert (b / f).is_file(), f
    assert m["draft_dtype"] == "float32" and m["quant_format"] == "none"
    assert all(m["onnx"]["ok"].values()) and "ONNX ✓" in m["headline"]


def test_bundle_tells_every_engine_what_the_head_was_trained_on(plain):
    """Aux layers in each engine's numbering and place, t2d beside d2t, legacy keys in the target's config."""
    import torch
    import yaml
    from safetensors.torch import load_file

    from trtspec.deploy.compat import engine_problems

    ctx, _ = plain
    b = ctx.out
    draft = json.loads((b / "draft" / "config.json").read_text())
    aux = draft["eagle_config"]["eagle_aux_hidden_state_layer_ids"]  # trtspec/modelopt/SGLang: output of layer k
    assert draft["eagle_aux_hidden_state_layer_ids"] == [k + 1 for k in aux]  # vLLM: the state entering layer k+1
    options = yaml.safe_load((b / "llm_api_options.yaml").read_text())
    assert options["speculative_config"]["eagle3_layers_to_capture"] == aux  # TensorRT-LLM reads them only here
    speculators = (b / "snippets" / "speculators.sh").read_text()
    assert json.dumps({"eagle_aux_hidden_state_layer_ids": [k + 1 for k in aux]}) in speculators
    tensors = load_file(str(b / "draft" / "model.safetensors"))
    t2d = tensors["t2d"]
    assert t2d.dtype == torch.bool and t2d.shape == (draft["vocab_size"],) and int(t2d.sum()) == draft["draft_vocab_size"]
    assert t2d[torch.arange(draft["draft_vocab_size"]) + tensors["d2t"]].all()
    target = json.loads((b / "target" / "config.json").read_text())
    assert target["rope_theta"] == target["rope_parameters"]["rope_theta"] and target["torch_dtype"] == target["dtype"]
    tok_cfg = json.loads((b / "target" / "tokenizer_config.json").read_text())
    assert tok_cfg["tokenizer_class"] == "PreTrainedTokenizerFast"  # transformers 4.x has no TokenizersBackend
    assert engine_problems(draft, target, set(tensors)) == {name: [] for name in engine_problems(draft, target, set(tensors))}


def test_draft_holds_the_trained_head(plain):
    """The exported draft is the head from train/ (with d2t), not head_init or a re-initialized one."""
    from safetensors.torch import load_file

    ctx, _ = plain
    head = load_file(str(ctx.inputs["train"] / "head.safetensors"))
    draft = load_file(str(ctx.out / "draft" / "model.safetensors"))
    assert set(draft) == set(head) | {"t2d"}  # the head has its own lm_head (compressed vocab) and d2t; + t2d
    for k in head:
        assert (draft[k] == head[k]).all(), k


def test_bundle_has_no_absolute_paths_and_moves(plain, tmp_path, tiny_model_dir):
    """No text file in the bundle names a path of this machine (paths inside containers, like /tmp/repo, are fine)."""
    from trtspec.models import cache_dir

    ctx, _ = plain
    forbidden = {str(ctx.run.path.parent), str(tiny_model_dir), str(cache_dir()), str(Path.home()),
                 str(Path(__file__).resolve().parents[2])}
    checked = 0
    for p in ctx.out.rglob("*"):
        if p.is_file() and p.suffix in TEXT_SUFFIXES:
            text = p.read_text(encoding="utf-8", errors="replace")
            checked += 1
            for bad in forbidden:
                assert bad not in text, f"{p.relative_to(ctx.out)} names {bad}"
    assert checked >= 10
    moved = tmp_path / "elsewhere" / "bundle"
    shutil.copytree(ctx.out, moved)
    info = check_draft_checkpoint(moved / "draft", moved / "target")
    assert info["aux_layers"] == [0, 1, 2]


def test_fp8_bundle_and_acceptance(fp8):
    ctx, m = fp8
    hf = json.loads((ctx.out / "target" / "hf_quant_config.json").read_text())["quantization"]
    assert hf["quant_algo"] == "FP8" and hf["kv_cache_quant_algo"] == "FP8"
    assert "lm_head" in hf["exclude_modules"]
    assert (ctx.out / "target" / "tokenizer.json").is_file()
    # the head (trained unquantized) measured with both targets
    for k in ("acceptance_length_unquantized", "acceptance_length_quantized"):
        assert 1.0 <= m[k] <= 3.0
    assert "AL" in m["headline"]
    assert m["quant_format"] == "fp8" and m["kv_cache"] == "fp8"


def test_validate_holds_an_fp8_bundle_to_its_dequantized_reference(fp8, tiny_model_dir):
    """validate on a quantized bundle: the reference is HF generate with the bundle's dequantized weights, and the
    report says how far that is from the unquantized model."""
    from trtspec.stages import validate

    ctx, _ = fp8
    cfg = tiny_config(tiny_model_dir, ctx.out.parent, eval={"num_prompts": 2, "max_new_tokens": 6, "repeats": 1},
                      draft={"length": 2}, validate={"compile": False, "compare_hf": False, "sampling_temperature": None})
    vctx = stage_ctx(cfg, ctx.run.path, "validate", {"data": ctx.run.path / "data", "export": ctx.out})
    validate.run(vctx)
    r = json.loads((vctx.out / "report.json").read_text())
    assert "dequantized" in r["reference"]
    q = r["quantization"]
    assert q["dequantized"] is True and 0 <= q["identical_to_unquantized"] <= 2
    assert len(q["first_divergence_from_unquantized"]) == 2 - q["identical_to_unquantized"]
    assert r["greedy_match"]["matched"] == r["greedy_match"]["total"] == 2  # the runtime on the bundle == HF on its weights


def test_fp8_acceptance_reuses_the_train_stage_answers(fp8):
    """The unquantized target's greedy answers are the train stage's (train/eval_seqs.pt), not generated again."""
    ctx, m = fp8
    generated = ctx.work / "eval_unquantized.pt"  # the fixture's train dir had none: export generated them
    assert generated.is_file()
    given = ctx.inputs["train"] / EVAL_SEQS
    shutil.move(generated, given)
    try:
        shutil.rmtree(ctx.out)
        ctx.out.mkdir()
        again = export.run(ctx)
    finally:
        given.unlink()
    assert not generated.exists()
    assert again["acceptance_length_unquantized"] == m["acceptance_length_unquantized"]


def _rewrite(draft: Path, tensors: dict) -> None:
    from safetensors.torch import save_file

    save_file(tensors, str(draft / "model.safetensors"))


def test_checkpoint_table_lists_every_problem(plain, tmp_path):
    import torch
    from safetensors.torch import load_file

    ctx, _ = plain
    draft = tmp_path / "draft"
    shutil.copytree(ctx.out / "draft", draft)
    t = load_file(str(draft / "model.safetensors"))
    del t["layers.0.hidden_norm.weight"]
    t["fc.weight"] = torch.zeros(64, 128)  # 2 aux layers' width instead of 3
    t["layers.0.extra.weight"] = torch.zeros(1)
    t["d2t"] = torch.full((256,), 10**6)
    _rewrite(draft, t)
    with pytest.raises(ArtifactError) as e:
        check_draft_checkpoint(draft, ctx.out / "target")
    msg = e.value.message
    assert "4 problem(s)" in msg
    for part in ("missing required tensor 'layers.0.hidden_norm.weight'", "'fc.weight' has shape [64, 128], expected [64, 192]",
                 "unexpected tensor 'layers.0.extra.weight'", "'d2t' maps draft ids outside"):
        assert part in msg


def test_checkpoint_config_against_target(plain, tmp_path):
    ctx, _ = plain
    draft = tmp_path / "draft"
    shutil.copytree(ctx.out / "draft", draft)
    target = json.loads((ctx.out / "target" / "config.json").read_text())
    with pytest.raises(ArtifactError, match=r"hidden_size 64 != target's 128.*outside the target's 2 layers"):
        check_draft_checkpoint(draft, {**target, "hidden_size": 128, "num_hidden_layers": 2})
    cfg = json.loads((draft / "config.json").read_text())
    cfg["architectures"] = ["LlamaForCausalLM"]
    del cfg["draft_vocab_size"]
    (draft / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ArtifactError, match="lacks LlamaForCausalLMEagle3.*missing 'draft_vocab_size'"):
        check_draft_checkpoint(draft, target)


def test_expected_keys_follow_the_config():
    cfg = {"hidden_size": 8, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 4, "intermediate_size": 16,
           "vocab_size": 100, "draft_vocab_size": 50, "num_hidden_layers": 2,
           "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 3]}}
    keys = expected_keys(cfg)
    assert keys["fc.weight"] == ((8, 24), True)
    assert keys["layers.0.self_attn.q_proj.weight"] == ((8, 16), True)  # layer 0 reads cat(embeds, h): 2H
    assert keys["layers.1.self_attn.k_proj.weight"] == ((4, 8), True)
    assert "layers.1.hidden_norm.weight" not in keys
    assert keys["d2t"] == ((50,), False) and keys["lm_head.weight"] == ((50, 8), False)


def test_onnx_reports_every_output_over_tolerance(plain, tmp_path):
    from trtspec.eagle.onnx_export import export_onnx

    ctx, m = plain
    assert max(m["onnx"]["max_abs_diff"].values()) < 1e-4
    with pytest.raises(ArtifactError, match=r"logits: max diff .* of the output's scale > 1e-12; hidden_states: max diff"):
        export_onnx(ctx.out / "draft", tmp_path / "onnx", tolerance=1e-12)


def test_onnx_check_judges_rounding_by_the_outputs_scale():
    """A sound export whose un-normalised hidden states differ by 0.00156 (fp32 rounding at values ~500: what
    failed the README's demo under an absolute 1e-3) passes; a swapped top token or a 1% error fails."""
    import torch

    from trtspec.eagle.onnx_export import check_outputs

    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 9, 64, generator=g) * 200
    logits = torch.randn(2, 9, 50, generator=g)
    logits[..., 7] += 10  # a clear top token everywhere
    want = {"logits": logits, "hidden_states": hidden}
    result = check_outputs({"logits": logits + 1e-6, "hidden_states": hidden + 0.00156}, want, 1e-3)
    assert result["ok"] == {"logits": True, "hidden_states": True} and not result["why"] and result["top1_agree"] == 1.0
    assert result["max_abs_diff"]["hidden_states"] > 1e-3  # what the absolute check refused

    swapped = logits.clone()
    swapped[0, 3, 7], swapped[0, 3, 8] = logits[0, 3, 8], logits[0, 3, 7]  # another top token at one position
    bad = check_outputs({"logits": swapped, "hidden_states": hidden}, want, 1e-3)
    assert bad["ok"]["logits"] is False and "of the output's scale > 0.001" in bad["why"]["logits"]
    assert bad["top1_agree"] == round(17 / 18, 4)
    assert check_outputs({"logits": logits, "hidden_states": hidden * 1.01}, want, 1e-3)["ok"]["hidden_states"] is False


def test_onnx_head_matches_modelopt_head(plain, tiny_model_dir):
    """The exported draft, read back as plain torch (what the ONNX graph computes), equals modelopt's EAGLE-3
    module with trtspec.eagle.head's first-layer semantics on the same inputs."""
    import torch

    from trtspec.eagle.export import build_draft_model
    from trtspec.eagle.onnx_export import load_draft_head, sample_inputs
    from trtspec.models import load_model

    ctx, _ = plain
    head, cfg = load_draft_head(ctx.out / "draft")
    model = build_draft_model(load_model(tiny_model_dir, "float32", "cpu"), ctx.inputs["train"])
    aux, embeds, pos = sample_inputs(cfg, 2, 6)
    mask = torch.full((6, 6), float("-inf")).triu(1)[None, None].expand(2, 1, 6, 6)
    with torch.no_grad():
        em = model.eagle_module
        post, pre, _ = em(em.fc(aux), embeds, mask, position_ids=pos)
        logits, hidden = head(aux, embeds, pos)
    assert torch.allclose(hidden, pre, atol=1e-5) and torch.allclose(logits, em.lm_head(post), atol=1e-5)


def test_refuses_to_overwrite_a_foreign_bundle(tmp_path):
    from trtspec.artifacts import RunDir

    run = RunDir(tmp_path / "run")
    run.ensure()
    (run.path / "bundle").mkdir()
    (run.path / "bundle" / "my-notes.txt").write_text("not from trtspec")
    with pytest.raises(ArtifactError, match="is not a trtspec artifact"):
        run.invalidate("export")
    assert (run.path / "bundle" / "my-notes.txt").is_file()


def test_every_build_config_validates():
    from trtspec.config import load_config

    configs = sorted((Path(__file__).resolve().parents[2] / "build_configs").glob("*.yaml"))
    assert len(configs) >= 5
    for p in configs:
        try:
            load_config(p)
        except ConfigError as e:  # name the file in the failure
            pytest.fail(f"{p.name}: {e}")


@pytest.mark.parametrize(("head", "k", "causal", "trtllm", "vllm", "sglang"), [
    ("vanilla", 8, False, [], [], []),
    ("gated", 8, False, ["a vanilla Markov head, this one is gated"], ["a vanilla Markov head, this one is gated"], []),
    ("rnn", 8, False, ["this one is rnn"], ["this one is rnn"], []),
    ("vanilla", 6, False, ["max_draft_len == block_size, here 6 != 8"], ["num_speculative_tokens = 6 rows"],
     ["gamma = block_size = 8 tokens a step, the bundle's chain is 6"]),
    ("vanilla", 8, True, ["non-causal only"], [], ["attends non-causally"]),
])
def test_dspark_engines_by_head_chain_and_attention(head, k, causal, trtllm, vllm, sglang):
    """Which engine serves a DSpark draft (read from TensorRT-LLM's, vLLM's and SGLang's DSpark sources:
    dflash/dspark.py): a vanilla Markov head on non-causal blocks as long as the chain, in all three (SGLang also any
    head); anything TensorRT-LLM cannot serve leaves the bundle without an engine launcher, saying why per engine."""
    from trtspec.dflash.dspark import dspark_no_engine, dspark_problems

    problems = dspark_problems({"markov_head": head, "max_draft_len": k, "block_size": 8, "causal": causal})
    assert set(problems) == {e for e, want in (("TensorRT-LLM", trtllm), ("vLLM", vllm), ("SGLang", sglang)) if want}
    for engine, want in (("TensorRT-LLM", trtllm), ("vLLM", vllm), ("SGLang", sglang)):
        assert len(problems.get(engine, [])) == len(want) and all(w in p for w, p in zip(want, problems.get(engine, []), strict=True))
    no_engine = dspark_no_engine(problems)
    assert (no_engine is None) == (not trtllm)
    if no_engine:
        assert no_engine.startswith("the bundle has no engine launcher for this DSpark draft (TensorRT-LLM: ") and "runtime serves it" in no_engine
        assert ("; vLLM: " in no_engine) == bool(vllm) and ("SGLang: " in no_engine) == bool(sglang)
