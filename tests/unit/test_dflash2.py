"""DFlash2: its convolutions and candidate selector (speculators' modules on Model Optimizer's DFlash) trained and
exported, the runtime's draft against the trained model's own, exactness (greedy and sampling), and its config."""

from __future__ import annotations

import json

import pytest
import torch
from stagekit import export_random_dflash2, first_draft

from trtspec.runtime.decode import generate, speculative_decode
from trtspec.runtime.drafters import DraftSpec
from trtspec.runtime.model import load_transformer

pytest.importorskip("speculators", reason="speculators is not installed (bash scripts/setup.sh --engines vllm)")
pytestmark = pytest.mark.usefixtures("one_thread")
NEW = 24


@pytest.fixture(scope="module")
def exported(tmp_path_factory, target_dir):
    out = tmp_path_factory.mktemp("dflash2") / "draft"
    return out, export_random_dflash2(target_dir, out)


def free_walk(model, seq, k: int) -> list[int]:
    """The trained model's own draft from the last anchor of `seq`: its block pass (dflash.head.block_drafts), then
    speculators' selector scoring each row from the guess before it (the root first): the walk vLLM's speculator runs."""
    from trtspec.dflash.head import block_drafts
    from trtspec.training.states import base_states

    aux, _ = base_states(model, seq[None], torch.ones(1, len(seq), dtype=torch.long), model.target_layer_ids)
    walks = {}

    def pick(module, logits, rows, anchors):
        prev, out = seq[anchors], []
        for j in range(k):
            cand = logits[:, j].topk(module.candidate_selector.top_k, -1).indices
            scores = module.candidate_selector.score_candidates(logits[:, j], rows[:, j], prev, cand)
            prev = cand.gather(-1, scores.argmax(-1, keepdim=True))[:, 0]
            out.append(prev)
        walks["last"] = torch.stack(out, 1)[-1].tolist()
        return torch.stack(out, 1)

    block_drafts(model, seq, aux[0], k, first=len(seq) - 1, pick=pick)
    return walks["last"]


def test_the_export_is_what_vllm_loads(exported):
    """config.json names DFlash2DraftModel with dflash_config's conv and selector keys; the weights are DFlash's plus
    layers.i.{attention,mlp}_conv.* and candidate_selector.*, by vLLM's qwen3_dflash2 names and shapes."""
    from safetensors import safe_open

    out, model = exported
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["DFlash2DraftModel"] and cfg["block_size"] == 8
    dc = cfg["dflash_config"]
    assert (dc["conv_kernel_size"], dc["conv_group_size"], dc["selector_rank"], dc["selector_top_k"]) == (2, 8, 8, 4)
    assert dc["target_layer_ids"] == [0, 2] and dc["causal"] is False
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    H, V = cfg["hidden_size"], cfg["vocab_size"]
    assert shapes["layers.1.attention_conv.base_kernel"] == (2, 2, H)
    assert shapes["layers.1.mlp_conv.kernel_projection.weight"] == (2 * 2 * H // 8, H)
    assert shapes["candidate_selector.predecessor_codebook"] == shapes["candidate_selector.successor_codebook"] == (V, 8)
    assert shapes["candidate_selector.hidden_projection.weight"] == (8, H)
    assert not any(k.startswith(("embed_tokens", "lm_head", "model.")) for k in shapes)


def test_the_runtime_draft_is_the_trained_models_walk(exported, target_dir):
    """The runtime's first draft (one block pass over its context cache, its convolutions, the selector's walk) is
    the trained model's own: modelopt's block with speculators' modules, walked by speculators' scores. Without the
    selector's term, or with the convolutions the identity, the draft differs (both are applied)."""
    from trtspec.dflash2.runtime import load_dflash2_drafter

    out, model = exported
    ids = torch.tensor([1, 504, 3000, 77, 12, 900, 45, 8])
    target = load_transformer(target_dir)[0]
    drafter = load_dflash2_drafter(out, target, weights="float32")  # bfloat16 products may break a near-tie otherwise
    with torch.no_grad():
        base_tok = int(model(ids[None]).logits[0, -1].argmax())
    seq = torch.cat((ids, torch.tensor([base_tok])))
    want = free_walk(model, seq, 7)
    assert first_draft(target, drafter, ids, base_tok, 7) == want
    assert len(set(want)) > 1
    codebook = drafter.selector.predecessor_codebook
    kept = codebook.clone()
    codebook.zero_()
    assert first_draft(target, drafter, ids, base_tok, 7) != want
    codebook.copy_(kept)
    for layer in drafter.net.layers:
        layer.attention_conv.kernel_projection.weight.zero_()
        layer.attention_conv.base_kernel.zero_()
        layer.attention_conv.base_kernel[:, 0] = 1
    assert first_draft(target, drafter, ids, base_tok, 7) != want


def test_teacher_forced_drafts_follow_the_walk_where_it_counts(exported):
    """The acceptance measure's drafts (dflash2.head.block_drafts, the data's tokens as predecessors) equal the free
    walk's up to and including its first guess that differs from the data: the only ones the count reads."""
    from trtspec.dflash2.head import block_drafts
    from trtspec.training.states import base_states

    _, model = exported
    seq = torch.tensor([1, 504, 3000, 77, 12, 900, 45, 8, 33, 61, 7, 19])
    aux, _ = base_states(model, seq[None], torch.ones(1, len(seq), dtype=torch.long), model.target_layer_ids)
    forced = block_drafts(model, seq, aux[0], 7)
    for a in range(1, len(seq) - 1):
        walk = free_walk(model, seq[: a + 1], 7)
        upto = next((j for j in range(7) if a + 1 + j >= len(seq) or walk[j] != int(seq[a + 1 + j])), 7)
        assert forced[a - 1, : upto + 1].tolist()[: min(upto + 1, 7)] == walk[: min(upto + 1, 7)]


@pytest.mark.parametrize("k", [3, 7])
def test_dflash2_draft_keeps_greedy_output(exported, target_dir, prompts, k):
    from trtspec.dflash2.runtime import load_dflash2_drafter

    target = load_transformer(target_dir)[0]
    drafter = load_dflash2_drafter(exported[0], target)
    for p in prompts:
        ref = generate(target, p, NEW, eos={2}).tokens
        g = speculative_decode(target, drafter, p, NEW, DraftSpec(k=k), eos={2})
        assert g.tokens == ref
        assert g.stats.acceptance_length() < 1.5  # a random draft: hardly anything accepted


@pytest.mark.parametrize("swap", [False, True], ids=["lossless", "swapped-ratio-caught"])
def test_dflash2_sampling_matches_the_target_distribution(monkeypatch, swap):
    """Each guess is drawn from the selector's softmax over its row's candidates given the guess before it (zero
    outside them): accepting it with min(1, p/q) stays lossless; the swapped ratio q/p is caught."""
    from stagekit import chi2_of_first_two, small_lm
    from test_dflash import small_block_drafter

    import trtspec.runtime.decode as gen
    from trtspec.dflash2.runtime import CandidateSelector, DFlash2Drafter

    if swap:
        monkeypatch.setattr(gen, "accept_probs", lambda p, q: (q / p).clamp(max=1.0))
    target = small_lm(0, 6.0)
    block = small_block_drafter(target)
    torch.manual_seed(4)
    selector = CandidateSelector(8, target.args.hidden_size, 4, 5).eval()
    with torch.no_grad():
        for p in (selector.predecessor_codebook, selector.successor_codebook):
            p.normal_(0, 3.0)
    drafter = DFlash2Drafter(block.net, block.embed, block.info, selector)
    chi2, bins = chi2_of_first_two(target, drafter, [3, 1, 4, 1, 5], 2)
    assert (chi2 < bins + 4 * (2 * bins) ** 0.5) != swap, (chi2, bins)


def test_an_untrained_dflash2_drafts_as_dflash_and_its_loss_trains_every_part(target_dir):
    """At start the convolutions are the identity: with the selector's term zeroed the block drafts are DFlash's own
    (each row's argmax). The training loss (modelopt's + the selector's) reaches the convolutions and the selector."""
    from transformers import AutoModelForCausalLM

    from trtspec.config import DFlash2Section, DFlashSection
    from trtspec.dflash.head import block_drafts as dflash_drafts
    from trtspec.dflash.head import build_dflash_model, derive_dflash_config
    from trtspec.dflash2 import head
    from trtspec.training.states import base_states

    def base():  # mtsp.convert converts the model it is given
        return AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()

    cfg = derive_dflash_config(base().config, DFlashSection(num_layers=2, target_layers=[0, 2], anchors=4), mask_token_id=16)
    plain = build_dflash_model(base(), cfg)
    model = head.build_dflash2_model(base(), {**cfg, head.KEY: head.settings(DFlash2Section(conv_group_size=8))})
    model.dflash_module.load_state_dict(plain.dflash_module.state_dict(), strict=False)
    model.dflash_module.candidate_selector.predecessor_codebook.data.zero_()
    seq = torch.randint(100, 3000, (24,))
    aux, _ = base_states(model, seq[None], torch.ones(1, 24, dtype=torch.long), model.target_layer_ids)
    assert torch.equal(head.block_drafts(model, seq, aux[0], 7), dflash_drafts(plain, seq, aux[0], 7))

    model.train()
    torch.nn.init.normal_(model.dflash_module.candidate_selector.predecessor_codebook, std=0.02)
    out = model(input_ids=seq[None], attention_mask=torch.ones(1, 24, dtype=torch.long), labels=seq[None])
    out.loss.backward()
    module = model.dflash_module
    for p in (module.layers[0].attention_conv.kernel_projection.weight, module.layers[1].mlp_conv.base_kernel,
              module.candidate_selector.successor_codebook, module.candidate_selector.hidden_projection.weight):
        assert p.grad is not None and p.grad.abs().sum() > 0


@pytest.mark.parametrize(("raw", "match"), [
    ({"draft": {"method": "eagle3"}, "dflash2": {"selector_rank": 32}}, "dflash2.selector_rank is an option of the DFlash2 block drafter, but draft.method is eagle3"),
    ({"draft": {"method": "dflash"}, "dflash2": {"conv_kernel_size": 3}}, "dflash2.conv_kernel_size is an option of the DFlash2 block drafter, but draft.method is dflash"),
    ({"draft": {"method": "dflash2"}, "dflash": {"projector": "dspark"}}, "dflash.projector dspark makes a DSpark draft, but draft.method is dflash2"),
    ({"draft": {"method": "dflash2"}, "convert": {"draft_vocab_size": 4096}}, "convert.draft_vocab_size is an option of the EAGLE-3 head, but draft.method is dflash2"),
    ({"draft": {"method": "eagle3"}, "dflash": {"block_size": 16}}, "dflash.block_size is an option of the DFlash block drafter, but draft.method is eagle3"),
    ({"draft": {"method": "dflash", "shape": "dynamic_tree"}}, "draft.shape dynamic_tree drafts a tree with an EAGLE-3 head, but draft.method is dflash"),
])
def test_options_of_another_method_are_refused(raw, match):
    from trtspec.config import config_from_dict
    from trtspec.draft_families import check_recipe
    from trtspec.errors import ConfigError

    cfg = config_from_dict({"data": {"sources": [{"kind": "jsonl", "path": "x.jsonl"}]}, **raw})
    with pytest.raises(ConfigError, match=match):
        check_recipe(cfg)


def test_a_group_size_that_does_not_divide_the_hidden_size_is_refused_before_any_stage(target_dir):
    from transformers import AutoConfig

    from trtspec.config import config_from_dict
    from trtspec.dflash2.family import DFLASH2
    from trtspec.errors import ConfigError

    cfg = config_from_dict({"data": {"sources": [{"kind": "jsonl", "path": "x.jsonl"}]}, "draft": {"method": "dflash2"},
                            "dflash2": {"conv_group_size": 7}, "dflash": {"num_layers": 2, "target_layers": [0, 2]}})
    with pytest.raises(ConfigError, match="dflash2.conv_group_size 7 does not divide the hidden size"):
        DFLASH2.check_convert(cfg, AutoConfig.from_pretrained(target_dir))
