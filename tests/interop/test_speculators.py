"""speculators (vLLM's draft-training library) reads the bundle's draft: its own Eagle3Converter turns bundle/draft into
a speculators checkpoint that keeps our vocab map, aux layers and weights, and its own Eagle3DraftModel, loaded from
that checkpoint, computes the same draft logits as trtspec's draft head on the same inputs.

Numbering: bundle/draft/config.json's eagle_config ids are trtspec's (output of target layer k); its top-level ids
and speculators' are vLLM's (k + 1) = indices into HF's output_hidden_states tuple (whose entry 0 is the embeddings).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("speculators", reason="speculators is not installed (pip install speculators)")

import torch  # noqa: E402

SEQ = 6
POSITION_OFFSET = 7  # positions 7..12: RoPE is applied at absolute positions, so both sides must get the same ones


def draft_config(bundle: Path) -> dict:
    return json.loads((bundle / "draft" / "config.json").read_text())


@pytest.fixture(scope="module")
def converted(ci_bundle, tmp_path_factory) -> Path:
    """speculators' Eagle3Converter run on a copy of bundle/draft -> the converted checkpoint's folder."""
    from speculators.convert.eagle.eagle3_converter import Eagle3Converter

    work = tmp_path_factory.mktemp("speculators")
    draft = work / "draft"
    shutil.copytree(ci_bundle / "draft", draft)
    out = work / "converted"
    # the converter reads no aux layers from the draft's config: they are passed, in vLLM's numbering
    Eagle3Converter().convert(draft, out, base_model=str(ci_bundle / "target"), validate=False,
                              eagle_aux_hidden_state_layer_ids=draft_config(ci_bundle)["eagle_aux_hidden_state_layer_ids"])
    return out


@pytest.mark.interop
def test_converter_keeps_vocab_map_aux_layers_and_weights(ci_bundle, converted):
    from safetensors.torch import load_file

    ours_cfg = draft_config(ci_bundle)
    ours = load_file(str(ci_bundle / "draft" / "model.safetensors"))
    theirs = load_file(str(converted / "model.safetensors"))
    cfg = json.loads((converted / "config.json").read_text())

    assert cfg["speculators_model_type"] == "eagle3"
    vllm_ids = [k + 1 for k in ours_cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]]
    assert ours_cfg["eagle_aux_hidden_state_layer_ids"] == vllm_ids
    assert cfg["eagle_aux_hidden_state_layer_ids"] == vllm_ids
    assert cfg["draft_vocab_size"] == ours_cfg["draft_vocab_size"] == ours["d2t"].shape[0]
    layer = cfg["transformer_layer_config"]
    assert layer["vocab_size"] == ours_cfg["vocab_size"] == ours["t2d"].shape[0]
    assert layer["rope_parameters"]["rope_theta"] == ours_cfg["rope_theta"]
    assert layer["hidden_size"] == ours_cfg["hidden_size"]
    assert layer["num_hidden_layers"] == ours_cfg["num_hidden_layers"]

    # the vocab map survives (the converter only keeps d2t because the draft also carries t2d)
    assert theirs["d2t"].dtype == torch.int64 and torch.equal(theirs["d2t"], ours["d2t"])
    assert theirs["t2d"].dtype == torch.bool and torch.equal(theirs["t2d"], ours["t2d"])
    # and every weight, unrenamed and bit for bit
    assert sorted(theirs) == sorted(ours)
    for name, tensor in ours.items():
        assert theirs[name].dtype == tensor.dtype, name
        assert torch.equal(theirs[name], tensor), name


@pytest.fixture(scope="module")
def inputs(ci_bundle) -> dict:
    """Real draft inputs: the target's hidden states on a short text, its token embeddings, offset positions."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = ci_bundle / "target"
    ids = AutoTokenizer.from_pretrained(target)("The quick brown fox jumps over the lazy dog", return_tensors="pt")
    ids = ids["input_ids"][:, :SEQ]
    assert ids.shape == (1, SEQ)
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    with torch.no_grad():
        hidden = model(input_ids=ids, output_hidden_states=True).hidden_states  # [0] = embeddings
    embed = load_file(str(target / "model.safetensors"))["model.embed_tokens.weight"].float()
    cfg = draft_config(ci_bundle)
    return {
        "ids": ids,
        "embed": embed,
        # trtspec numbering: output of layer k is hidden_states[k + 1]
        "aux_trtspec": torch.cat([hidden[k + 1] for k in cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]], -1),
        # vLLM / speculators numbering: the id indexes hidden_states directly
        "aux_vllm": torch.cat([hidden[i] for i in cfg["eagle_aux_hidden_state_layer_ids"]], -1),
        "positions": torch.arange(SEQ)[None] + POSITION_OFFSET,
    }


@pytest.mark.interop
@pytest.mark.parametrize("attn", ["eager", "simple_flex_attention"])
def test_speculators_forward_equals_trtspec_draft_head(ci_bundle, converted, inputs, attn):
    from safetensors.torch import load_file
    from speculators import SpeculatorModel
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig

    from trtspec.eagle.onnx_export import load_draft_head

    config = Eagle3SpeculatorConfig.from_pretrained(converted)
    # simple_flex_attention is speculators' default (its training path; on CPU flex attention runs unfused, with a
    # warning); eager is the plain matmul path with a float mask
    config.transformer_layer_config._attn_implementation = attn
    model = SpeculatorModel.from_pretrained(converted, config=config).eval()
    assert isinstance(model, Eagle3DraftModel)
    assert model._attn_impl == attn
    # speculators resolves the ids against the verifier (bundle/target) at load: they are valid there as they are
    assert model.config.eagle_aux_hidden_state_layer_ids == draft_config(ci_bundle)["eagle_aux_hidden_state_layer_ids"]

    # speculators takes the token embeddings from the verifier at load, but only where the parameter is still NaN;
    # with transformers 5 the checkpoint-absent embed_tokens comes back materialised (zeros here), so it keeps those.
    # Give it the target's embeddings explicitly: the same table trtspec's head is fed from.
    model.embed_tokens.weight.data.copy_(inputs["embed"])

    head, _ = load_draft_head(ci_bundle / "draft")
    with torch.no_grad():
        want_logits, want_hidden = head(inputs["aux_trtspec"], inputs["embed"][inputs["ids"]], inputs["positions"])

    seen: dict[str, torch.Tensor] = {}
    model.lm_head.register_forward_hook(lambda _m, _i, out: seen.__setitem__("logits", out))
    model.norm.register_forward_hook(lambda _m, args, _o: seen.__setitem__("hidden", args[0]))
    with torch.no_grad():
        # one TTT step = one draft step over the sequence, causal (one document: document_ids all 0)
        drafts = model(hidden_states=inputs["aux_vllm"], input_ids=inputs["ids"],
                       document_ids=torch.zeros_like(inputs["ids"]), position_ids=inputs["positions"], ttt_steps=1)

    logits, hidden = seen["logits"], seen["hidden"]
    assert logits.shape == want_logits.shape == (1, SEQ, draft_config(ci_bundle)["draft_vocab_size"])
    assert float((logits - want_logits).abs().max()) <= 1e-5
    assert float((hidden - want_hidden).abs().max()) <= 1e-5 * max(1.0, float(want_hidden.abs().max()))
    assert torch.equal(drafts[0], want_logits.argmax(-1))
    assert torch.equal(logits.argmax(-1), want_logits.argmax(-1))
    # the same draft tokens in the target's vocab, through speculators' loaded d2t and ours
    top = want_logits.argmax(-1)
    ours_d2t = load_file(str(ci_bundle / "draft" / "model.safetensors"))["d2t"]
    assert torch.equal(top + model.d2t[top], top + ours_d2t[top])
