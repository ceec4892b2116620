"""The DFlash block drafter: its conversion through Model Optimizer, the runtime's one-pass block draft against
modelopt's own, and the speculative decoder's exactness with it (greedy and sampling)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from stagekit import export_random_dflash, first_draft

from trtspec.config import ConvertSection, DFlashSection
from trtspec.dflash.runtime import DFlashDrafter, load_dflash_drafter
from trtspec.errors import ArtifactError, ConfigError, ModelError
from trtspec.runtime.decode import generate, speculative_decode
from trtspec.runtime.drafters import DraftSpec
from trtspec.runtime.model import load_transformer

NEW = 24
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def reference(target_dir, prompts):
    """The target's greedy answers without a draft (the runtime's plain decode equals HF generate: test_runtime)."""
    target = load_transformer(target_dir)[0]
    return [generate(target, p, NEW, eos={2}).tokens for p in prompts]


@pytest.fixture(scope="module")
def dflash_export(tmp_path_factory, target_dir):
    """Exported random DFlash draft + modelopt's own draft tokens for a prompt."""
    out = tmp_path_factory.mktemp("dflash") / "draft"
    model = export_random_dflash(target_dir, out)
    ids = torch.tensor([[1, 504, 3000, 77, 12, 900, 45, 8]])
    with torch.no_grad():
        base_tok, drafts = model.pseudo_speculative_generate(ids, steps=7)
    return out, ids[0], int(base_tok), drafts[0].tolist()


def test_block_draft_matches_modelopt(dflash_export, target_dir):
    """The runtime's block pass over its context cache gives the tokens of modelopt's pseudo_speculative_generate
    (the whole sequence recomputed, no cache)."""
    draft_dir, ids, base_tok, want = dflash_export
    target = load_transformer(target_dir)[0]
    drafter = load_dflash_drafter(draft_dir, target)
    assert target.aux_layers == (0, 2)
    assert first_draft(target, drafter, ids, base_tok, len(want)) == want
    assert len(set(want)) > 1  # a draft that repeats one token would prove little


def test_teacher_forced_block_drafts_match_modelopt(dflash_export, target_dir):
    """block_drafts (the train stage's acceptance measure, every anchor at once) agrees with modelopt's own draft
    at the anchor modelopt drafts from."""
    from trtspec.dflash.head import block_drafts
    from trtspec.training.states import base_states

    draft_dir, ids, base_tok, want = dflash_export
    model = export_random_dflash(target_dir, draft_dir.parent / "again")
    seq = torch.cat((ids, torch.tensor([base_tok])))
    aux, _ = base_states(model, seq[None], torch.ones(1, len(seq), dtype=torch.long), model.target_layer_ids)
    assert block_drafts(model, seq, aux[0], 7)[len(ids) - 1].tolist() == want


@pytest.fixture(scope="module", params=["vanilla", "gated", "rnn"])
def dspark_export(request, tmp_path_factory, target_dir):
    """Exported random DSpark draft (rank-8 Markov head of each kind) + modelopt's model and its own draft of a
    whole block (8 tokens: DSpark's rows 0..7) for a prompt."""
    out = tmp_path_factory.mktemp("dspark") / "draft"
    model = export_random_dflash(target_dir, out, projector="dspark", markov_rank=8, markov_head=request.param)
    ids = torch.tensor([[1, 504, 3000, 77, 12, 900, 45, 8]])
    with torch.no_grad():
        base_tok, drafts = model.pseudo_speculative_generate(ids, steps=8)
    return out, model, ids[0], int(base_tok), drafts[0].tolist()


def test_dspark_block_drafts_match_modelopt(dspark_export):
    """block_drafts of a DSpark draft (every row, each guess biased by the Markov head from the guess before it) are
    the tokens of modelopt's DSpark pseudo_speculative_generate at the anchor it drafts from; without the head's
    bias they are not (the head is applied)."""
    from trtspec.dflash.head import block_drafts
    from trtspec.training.states import base_states

    _, model, ids, base_tok, want = dspark_export
    seq = torch.cat((ids, torch.tensor([base_tok])))
    aux, _ = base_states(model, seq[None], torch.ones(1, len(seq), dtype=torch.long), model.target_layer_ids)
    assert block_drafts(model, seq, aux[0], 8)[len(ids) - 1].tolist() == want
    assert len(set(want)) > 1
    w2 = model.dflash_module.markov_w2.weight
    kept = w2.detach().clone()
    with torch.no_grad():
        w2.zero_()
        unbiased = block_drafts(model, seq, aux[0], 8)[len(ids) - 1].tolist()
        w2.copy_(kept)
    assert unbiased != want


@pytest.mark.parametrize("k,weights", [(3, "float32"), (7, "float32"), (3, "bfloat16")])
def test_dflash_draft_keeps_greedy_output(dflash_export, target_dir, prompts, reference, k, weights):
    """A random draft keeps the target's output, also with its products in bfloat16 (its own copy of the target's
    lm_head among them: the target's stays float32)."""
    from trtspec.runtime import native

    target = load_transformer(target_dir)[0]
    drafter = load_dflash_drafter(dflash_export[0], target, weights=weights)
    if weights == "bfloat16" and native.vector_loops():
        assert drafter.net.kernel_choice["draft_weights"]["weights"] == "bfloat16"
        assert drafter.net.lm_head.weight.dtype == torch.bfloat16
    assert {p.dtype for p in target.parameters()} == {torch.float32}
    for p, ref in zip(prompts, reference, strict=True):
        g = speculative_decode(target, drafter, p, NEW, DraftSpec(k=k), eos={2})
        assert g.tokens == ref
        assert g.stats.acceptance_length() < 1.5  # a random draft: hardly anything accepted


def test_dspark_runtime_draft_matches_modelopt(dspark_export, target_dir):
    """The runtime's DSpark draft (one block pass over its context cache, then the Markov head row by row) gives the
    tokens of modelopt's DSpark pseudo_speculative_generate; without the head's bias it does not."""
    draft_dir, _, ids, base_tok, want = dspark_export
    target = load_transformer(target_dir)[0]
    drafter = load_dflash_drafter(draft_dir, target)
    assert drafter.info.guesses == 8 and drafter.markov is not None
    assert first_draft(target, drafter, ids, base_tok, 8) == want
    drafter.markov.markov_w2.weight.zero_()
    assert first_draft(target, drafter, ids, base_tok, 8) != want


@pytest.mark.parametrize("k", [3, 8])
def test_dspark_draft_keeps_greedy_output(dspark_export, target_dir, prompts, reference, k):
    target = load_transformer(target_dir)[0]
    drafter = load_dflash_drafter(dspark_export[0], target)
    for p, ref in zip(prompts, reference, strict=True):
        g = speculative_decode(target, drafter, p, NEW, DraftSpec(k=k), eos={2})
        assert g.tokens == ref
        assert g.stats.acceptance_length() < 1.5  # a random draft: hardly anything accepted


def test_a_short_chain_drafts_from_a_block_of_k_plus_1_rows_as_the_engines_do(dflash_export, target_dir, tmp_path):
    """Asked for k < block_size - 1 guesses, vLLM, SGLang and TensorRT-LLM run a block of k + 1 rows (dflash/runtime.py
    says where). The runtime's k guesses are modelopt's from a block of k + 1 rows, and not its whole block's: the
    block's rows attend to each other, so the shorter block guesses otherwise."""
    draft_dir, ids, base_tok, _ = dflash_export
    model = export_random_dflash(target_dir, tmp_path / "draft")  # the same seeded draft, for modelopt's side
    target = load_transformer(target_dir)[0]
    drafter = load_dflash_drafter(draft_dir, target)
    k = 3
    with torch.no_grad():
        whole = model.pseudo_speculative_generate(ids[None], steps=k)[1][0].tolist()
        model.dflash_block_size = k + 1
        short = model.pseudo_speculative_generate(ids[None], steps=k)[1][0].tolist()
    assert first_draft(target, drafter, ids, base_tok, k) == short != whole


def test_a_short_chain_runs_to_the_last_token(dflash_export, target_dir, prompts):
    """At the last tokens the block (positions length .. length + k) and a DSpark one (length .. length +
    block_size - 1) reach past the k + 1 rows the target reserves: the draft's cache and rotary tables cover them."""
    target = load_transformer(target_dir)[0]
    drafter = load_dflash_drafter(dflash_export[0], target)
    want = generate(target, prompts[0], NEW, eos=set()).tokens
    assert len(want) == NEW
    assert speculative_decode(target, drafter, prompts[0], NEW, DraftSpec(k=1), eos=set()).tokens == want


class OracleNet:
    """A stand-in block network that knows the target's answer: its guesses for positions length+1.. are the
    reference tokens there. Everything is accepted only if the drafter's position bookkeeping is right."""

    def __init__(self, seq: list[int], vocab: int, hidden: int):
        self.seq, self.vocab, self.hidden, self.max_len, self.calls = seq, vocab, hidden, 0, []

    def setup_cache(self, n):
        self.max_len = n

    def step(self, aux, length, embeds, k, mode):
        self.calls.append((aux.shape[0], length))
        logits = torch.full((k, self.vocab), -1e9)
        for j in range(k):
            pos = length + 1 + j
            logits[j, self.seq[pos] if pos < len(self.seq) else 0] = 0.0
        return logits, torch.zeros(k, self.hidden)


@pytest.mark.parametrize("projector", ["dflash", "dspark"])
def test_perfect_block_draft_keeps_greedy_output_and_accepts_everything(dflash_export, target_dir, prompts, reference, projector):
    """A block of 8 drafts 7 tokens (DFlash) or 8 (DSpark, through a random rnn Markov head whose bias is small
    beside the oracle's logits): all accepted."""
    from trtspec.dflash.runtime import DFlashInfo, MarkovHead

    target = load_transformer(target_dir)[0]
    real = load_dflash_drafter(dflash_export[0], target)
    info = DFlashInfo((0, 2), 8, 16, False, projector)
    torch.manual_seed(0)
    markov = MarkovHead(target.args.vocab_size, 4, target.args.hidden_size, "rnn") if projector == "dspark" else None
    for p, ref in zip(prompts, reference, strict=True):
        net = OracleNet(p.tolist() + ref + [0] * 16, target.args.vocab_size, target.args.hidden_size)
        drafter = DFlashDrafter(net, real.embed, info, markov)
        g = speculative_decode(target, drafter, p, NEW, DraftSpec(k=info.guesses), eos={2})
        assert g.tokens == ref
        assert g.stats.accepted[:-1] == [info.guesses] * (g.stats.steps - 1)  # the last step may stop at the answer's end
        assert net.calls[0] == (p.numel(), p.numel())  # the prompt's states, then 8 new verified rows per step
        assert all(m == info.guesses + 1 for m, _ in net.calls[1:])


def small_block_drafter(target, seed: int = 3, projector: str = "dflash"):
    """A random one-layer block network on the 8-token target, with an lm_head of its own (sharp, unlike the
    target's) so that its guesses' distributions q differ from the target's p; DSpark's with a sharp rnn Markov
    head, whose bias makes each guess's q depend on the guess before it."""
    from trtspec.dflash.runtime import DFlashDraft, DFlashInfo, MarkovHead
    from trtspec.runtime.model import Linear

    torch.manual_seed(seed)
    args = target.args.__class__(**{**target.args.__dict__, "num_layers": 1})
    net = DFlashDraft(args, 1, causal=False, first_row=0 if projector == "dspark" else 1).eval()
    net.lm_head = Linear(target.args.hidden_size, 8, bias=False)
    markov = MarkovHead(8, 4, target.args.hidden_size, "rnn").eval() if projector == "dspark" else None
    with torch.no_grad():
        net.lm_head.weight.mul_(6.0)
        if markov is not None:
            markov.markov_w2.weight.mul_(100.0)
    target.aux_layers = (0,)
    return DFlashDrafter(net, target.embed_tokens, DFlashInfo((0,), 4, 7, False, projector), markov)


@pytest.mark.parametrize("projector", ["dflash", "dspark"])
@pytest.mark.parametrize("swap", [False, True], ids=["lossless", "swapped-ratio-caught"])
def test_dflash_sampling_matches_the_target_distribution(monkeypatch, swap, projector):
    """Each guess of a block is drawn from its own position's distribution (DSpark's: given the guess before it):
    accepting it with min(1, p/q) stays lossless; the swapped ratio q/p is caught."""
    from stagekit import chi2_of_first_two, small_lm

    import trtspec.runtime.decode as gen

    if swap:
        monkeypatch.setattr(gen, "accept_probs", lambda p, q: (q / p).clamp(max=1.0))
    target = small_lm(0, 6.0)
    chi2, bins = chi2_of_first_two(target, small_block_drafter(target, projector=projector), [3, 1, 4, 1, 5], 2)
    assert (chi2 < bins + 4 * (2 * bins) ** 0.5) != swap, (chi2, bins)


def test_dflash_drafts_chains_only(dflash_export, target_dir):
    target = load_transformer(target_dir)[0]
    drafter = load_dflash_drafter(dflash_export[0], target)
    with pytest.raises(ModelError, match="chain"):
        drafter.draft(1, DraftSpec(shape="tree"))


def test_dflash_draft_for_another_model_is_refused(dflash_export, tmp_path, tiny_model_dir, target_dir):
    from stagekit import tiny_llama

    wide = load_transformer(tiny_llama(tmp_path / "wide", vocab_from=tiny_model_dir, layers=2, hidden=32))[0]
    with pytest.raises(ArtifactError, match="hidden size"):
        load_dflash_drafter(dflash_export[0], wide)
    cfg = json.loads((dflash_export[0] / "config.json").read_text())
    cfg["dflash_config"]["target_layer_ids"] = [0, 9]
    shutil.copytree(dflash_export[0], tmp_path / "deep")
    (tmp_path / "deep" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ArtifactError, match="layers"):
        load_dflash_drafter(tmp_path / "deep", load_transformer(target_dir)[0])
    cfg["dflash_config"]["target_layer_ids"] = [0, 2]
    cfg["dflash_config"]["mask_token_id"] = 10**6
    (tmp_path / "deep" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ArtifactError, match="mask token"):
        load_dflash_drafter(tmp_path / "deep", load_transformer(target_dir)[0])


def test_derive_config_sizes_the_draft_from_the_base(target_dir):
    from transformers import AutoConfig

    from trtspec.dflash.head import derive_dflash_config

    base = AutoConfig.from_pretrained(target_dir)
    arch = derive_dflash_config(base, DFlashSection(num_layers=2, target_layers=[0, 2]), 16)["dflash_architecture_config"]
    assert (arch["hidden_size"], arch["num_attention_heads"], arch["num_key_value_heads"], arch["intermediate_size"]) == (
        base.hidden_size, base.num_attention_heads, base.num_key_value_heads, base.intermediate_size)
    with pytest.raises(ConfigError, match="mask_token_id"):
        derive_dflash_config(base, DFlashSection(num_layers=2, target_layers=[0, 2]), base.vocab_size)
    with pytest.raises(ConfigError, match="target_layers"):
        derive_dflash_config(base, DFlashSection(num_layers=2, target_layers=[0]), 16)
    # a target of 4 layers: Model Optimizer's own pick for 2 draft layers is [1, 1]; the error says so, with a pick
    with pytest.raises(ConfigError, match=r"Model Optimizer's pick for this 4-layer target, \[1, 1\], repeats a layer") as e:
        derive_dflash_config(base, DFlashSection(num_layers=2), 16)
    assert e.value.hint == "set dflash.target_layers to 2 distinct ids in 0..2, e.g. [0, 2]"


def test_decay_loss_reaches_modelopt_with_the_papers_gamma(target_dir, tmp_path):
    """dflash.loss: decay weighs block position k by exp(-(k - 1) / gamma) inside modelopt: gamma must arrive there
    non-zero (modelopt's default 0 silently trains with equal weights)."""
    from trtspec.dflash.head import decay_gamma

    for block, gamma in ((8, 4.0), (16, 7.0), (12, 6.0)):
        model = export_random_dflash(target_dir, tmp_path / f"b{block}", block_size=block, loss="decay")
        assert (model.dflash_loss_objective, model.dflash_loss_decay_factor) == ("decay", gamma) == ("decay", decay_gamma(block))


def test_dspark_config_carries_the_markov_head_and_loss_weights(target_dir):
    """dflash.projector: dspark -> Model Optimizer's projector_type and Markov head in the architecture, its loss
    weights beside; a DSpark block of 8 drafts 8 (a DFlash one 7)."""
    from transformers import AutoConfig

    from trtspec.config import config_from_dict
    from trtspec.dflash.head import derive_dflash_config

    sec = DFlashSection(num_layers=2, target_layers=[0, 2], projector="dspark", markov_rank=8, markov_head="rnn", tvd_weight=0.5)
    cfg = derive_dflash_config(AutoConfig.from_pretrained(target_dir), sec, 16)
    arch = cfg["dflash_architecture_config"]
    assert (arch["projector_type"], arch["markov_rank"], arch["markov_head_type"], arch["use_confidence_head"]) == ("dspark", 8, "rnn", False)
    assert (cfg["dflash_ce_loss_alpha"], cfg["dflash_l1_loss_alpha"], cfg["dflash_confidence_head_alpha"]) == (0.1, 0.5, 0.0)
    plain = derive_dflash_config(AutoConfig.from_pretrained(target_dir), DFlashSection(num_layers=2, target_layers=[0, 2]), 16)
    assert "projector_type" not in plain["dflash_architecture_config"] and "dflash_l1_loss_alpha" not in plain
    raw = {"data": {"sources": [{"kind": "jsonl", "path": "x.jsonl"}]}, "draft": {"method": "dflash", "length": 8}}
    assert config_from_dict({**raw, "dflash": {"projector": "dspark"}}).dflash.guesses == 8


def test_mask_token_is_a_special_token_no_label_uses(tiny_model_dir):
    from trtspec.dflash.head import choose_mask_token
    from trtspec.models import load_tokenizer

    tok = load_tokenizer(tiny_model_dir)
    counts = torch.zeros(tok.vocab_size if hasattr(tok, "vocab_size") else 49152, dtype=torch.long)
    mask, why = choose_mask_token(tok, counts)
    assert mask in tok.all_special_ids or mask in tok.added_tokens_decoder
    assert mask not in (tok.eos_token_id, tok.bos_token_id, tok.pad_token_id)
    counts[mask] = 5  # now a training label: another token is chosen
    assert choose_mask_token(tok, counts)[0] != mask


@pytest.mark.parametrize(("raw", "match"), [
    ({"draft": {"method": "eagle3"}, "dflash": {"block_size": 16}}, "dflash.block_size is an option of the DFlash block drafter"),
    ({"draft": {"method": "dflash", "shape": "tree"}}, "draft.shape tree drafts a tree with an EAGLE-3 head"),
    ({"draft": {"method": "dflash"}, "convert": {"draft_vocab_size": 4096}}, "convert.draft_vocab_size is an option of the EAGLE-3 head"),
    ({"draft": {"method": "dflash", "length": 8}, "dflash": {"block_size": 8}}, "more than a DFlash block"),
    ({"draft": {"method": "dflash", "length": 9}, "dflash": {"block_size": 8, "projector": "dspark"}}, "more than a DSpark block"),
    ({"draft": {"method": "dflash"}, "dflash": {"markov_rank": 64}}, "dflash.markov_rank is a DSpark option"),
    ({"draft": {"method": "dflash"}, "dflash": {"projector": "dflash", "tvd_weight": 1.0}}, "dflash.tvd_weight is a DSpark option"),
    ({"draft": {"method": "dflash"}, "dflash": {"projector": "dspark", "loss": "decay"}}, "dflash.loss weighs DFlash's"),
    ({"draft": {"method": "dflash"}, "dflash": {"projector": "dspark", "ce_weight": 0, "tvd_weight": 0}}, "both 0"),
])
def test_options_of_the_other_method_are_refused(raw, match):
    """The draft family's rules of a recipe (draft_families.check_recipe), checked before any stage."""
    from trtspec.config import config_from_dict
    from trtspec.draft_families import check_recipe

    base = {"data": {"sources": [{"kind": "jsonl", "path": "x.jsonl"}]}}
    with pytest.raises(ConfigError, match=match):
        check_recipe(config_from_dict({**base, **raw}))
    assert ConvertSection().num_layers == 1
