"""DFlash2 on Model Optimizer's DFlash: its config (the dflash one plus a `dflash2` entry of its own), the converted
DFlash draft given speculators' convolutions and candidate selector, the selector's loss beside modelopt's, and the
block drafts of the acceptance measure.

modelopt's DFlash module stays as it is but for its decoder layers' class (DFlash2Layer: the same layer, its forward
with the two convolutions) and an instance `_compute_loss` that adds the selector's term; both because Model Optimizer
has no DFlash2 to configure.
"""

from __future__ import annotations

import copy
import types
from typing import TYPE_CHECKING, Any

from trtspec.dflash import head as dflash
from trtspec.errors import ConfigError

if TYPE_CHECKING:
    from trtspec.config import DFlash2Section

KEY = "dflash2"  # DFlash2's settings inside the saved mtsp.convert config, taken out before modelopt reads it


def settings(section: DFlash2Section) -> dict:
    return {"conv_kernel_size": section.conv_kernel_size, "conv_group_size": section.conv_group_size,
            "selector_rank": section.selector_rank, "selector_top_k": section.selector_top_k,
            "selector_weight": section.selector_weight}


def check_shape(own: dict, hidden: int, vocab: int, block_size: int) -> None:
    """The convolution and the selector against the draft's sizes (one line each, before any stage)."""
    if hidden % own["conv_group_size"]:
        raise ConfigError(f"dflash2.conv_group_size {own['conv_group_size']} does not divide the hidden size {hidden}",
                          "set a divisor of it (16 or 8 for most models)")
    if own["conv_kernel_size"] > block_size:
        raise ConfigError(f"dflash2.conv_kernel_size {own['conv_kernel_size']} is longer than a block of {block_size}")
    if own["selector_top_k"] > vocab:
        raise ConfigError(f"dflash2.selector_top_k {own['selector_top_k']} is more than the vocabulary ({vocab})")


def convert_drafter(base_config: Any, model_path: Any, cfg: Any, tokens_file: Any, log: Any) -> tuple[dict, Any, dict]:
    """The family's convert: DFlash's (its mtsp.convert config, mask token and random init), then the convolutions
    (the identity) and the selector (random) attached; the config gains DFlash2's settings under KEY."""
    from trtspec.dflash.convert import convert_drafter as convert_dflash

    draft_cfg, model, metrics = convert_dflash(base_config, model_path, cfg, tokens_file, log)
    own = settings(cfg.dflash2)
    attach(model, own)
    params = sum(p.numel() for p in model.dflash_module.parameters())
    added = (f"convolutions of {own['conv_kernel_size']} taps around each layer's attention and MLP, a candidate "
             f"selector of rank {own['selector_rank']} over each row's top {own['selector_top_k']}")
    log(f"DFlash2: {added}")
    metrics.update(draft_method="dflash2", head_params=params, dflash2=own,
                   headline=f"DFlash2 draft {params / 1e6:.1f}M params, block {metrics['block_size']}, target layers "
                   f"{metrics['target_layers']}, mask token {metrics['mask_token_id']}; {added}")
    return {**draft_cfg, KEY: own}, model, metrics


def build_dflash2_model(base_model: Any, cfg: dict) -> Any:
    """The DFlash draft on `base_model` (mtsp.convert) from a saved config, made DFlash2 (attach)."""
    cfg = copy.deepcopy(cfg)
    own = cfg.pop(KEY)
    return attach(dflash.build_dflash_model(base_model, cfg), own)


def attach(model: Any, own: dict) -> Any:
    """A converted DFlash model made DFlash2: every decoder layer given its two convolutions (speculators' modules,
    the identity at start), the module its candidate selector (random, std 0.02), the training loss the selector's
    term."""
    from speculators.models.dflash2.model_definitions import CandidateSelector, GroupedDynamicCausalConv

    module = model.dflash_module
    hidden, block = module.config.hidden_size, model.dflash_block_size
    like = next(module.parameters())
    for layer in module.layers:
        for name in ("attention_conv", "mlp_conv"):
            conv = GroupedDynamicCausalConv(hidden, block_size=block, kernel_size=own["conv_kernel_size"],
                                            group_size=own["conv_group_size"])
            setattr(layer, name, conv.to(like))
        layer.__class__ = dflash2_layer_class(type(layer))
    vocab = model._base_model_lm_head.weight.shape[0]
    module.candidate_selector = CandidateSelector(vocab_size=vocab, hidden_size=hidden, rank=own["selector_rank"],
                                                  top_k=own["selector_top_k"]).to(like)
    module.register_forward_hook(keep_output)
    model.dflash2 = own
    model._compute_loss = types.MethodType(compute_loss, model)
    return model


_LAYER_CLASSES: dict[type, type] = {}


def dflash2_layer_class(base: type) -> type:
    """modelopt's DFlash decoder layer with DFlash2's forward (speculators' Qwen3DFlash2DecoderLayer's order)."""
    if base in _LAYER_CLASSES.values():
        return base

    def forward(self, hidden_states, target_hidden, position_embeddings, attention_mask=None):
        h, kernel = self.attention_conv.prepare(self.input_layernorm(hidden_states))
        x = hidden_states + self.attention_conv.finish(self.self_attn(h, target_hidden, position_embeddings, attention_mask), kernel)
        h, kernel = self.mlp_conv.prepare(self.post_attention_layernorm(x))
        return x + self.mlp_conv.finish(self.mlp(h), kernel)

    return _LAYER_CLASSES.setdefault(base, type("DFlash2Layer", (base,), {"forward": forward}))


def keep_output(module: Any, args: Any, output: Any) -> None:
    """Forward hook: the module's normed block states, for the selector's loss computed after it."""
    module.dflash2_states = output


def compute_loss(self: Any, logits: Any, input_ids: Any, anchors: Any, keep: Any, loss_mask: Any, base_logits: Any = None):
    """modelopt's DFlash loss (decay or D-PACE weighted CE on every block row) + selector_weight x the selector's."""
    loss, accuracy = type(self)._compute_loss(self, logits, input_ids, anchors, keep, loss_mask, base_logits)
    hidden = self.dflash_module.dflash2_states
    self.dflash_module.dflash2_states = None
    return loss + self.dflash2["selector_weight"] * selector_loss(self, logits, hidden, input_ids, anchors, keep, loss_mask), accuracy


def selector_loss(model: Any, logits: Any, hidden: Any, input_ids: Any, anchors: Any, keep: Any, loss_mask: Any) -> Any:
    """speculators' selector loss on modelopt's blocks: row j of the block anchored at a guesses token a + j, its
    predecessor the data's token a + j - 1 (teacher-forced: the walk's own while every guess before was right); the
    top-k of the row's logits are its candidates, the answer put in place of the last where it is not among them,
    and the loss is the k-way cross-entropy, weighted as speculators weighs it (row 0, the root, not at all)."""
    import torch
    from speculators.models.dflash2.metrics import compute_selector_loss, selector_training_candidates

    B, top_k = model.dflash_block_size, model.dflash2["selector_top_k"]
    bsz, t = input_ids.shape
    n = anchors.shape[1]
    at = anchors[..., None] + torch.arange(B, device=input_ids.device)  # [bsz, n, B]: the token each row guesses
    inside = at < t
    ids = input_ids[:, None, :].expand(-1, n, -1)
    answer = torch.gather(ids, 2, at.clamp(max=t - 1))
    before = torch.gather(ids, 2, (at - 1).clamp(0, t - 1))
    weight = keep[..., None] * inside * torch.gather(loss_mask[:, None, :].expand(-1, n, -1), 2, at.clamp(max=t - 1))
    weight[..., 0] = 0
    unary = logits.view(bsz, n, B, -1)
    candidates = unary.detach().topk(top_k, dim=-1).indices
    candidates, label, _ = selector_training_candidates(candidates, answer)
    scores = model.dflash_module.candidate_selector.score_candidates(unary, hidden.view(bsz, n, B, -1), before, candidates)
    return compute_selector_loss(scores.reshape(1, -1, top_k), label.reshape(1, -1), weight.reshape(1, -1).float(), B,
                                 gamma=model.dflash_loss_decay_factor or 4.0, per_position_loss_weight="fixed-exp-decay",
                                 dpace_alpha=0.5)


def selector_pick(module: Any, logits: Any, rows: Any, before: Any) -> Any:
    """Greedy guesses [n, k] of n blocks: row j's candidates re-scored from its predecessor before[:, j] (the root for
    j = 0, then the data's tokens: teacher-forced, which is the walk itself up to its first wrong guess, where the
    acceptance count stops)."""
    selector = module.candidate_selector
    candidates = logits.topk(selector.top_k, dim=-1).indices
    scores = selector.score_candidates(logits, rows, before, candidates)
    return candidates.gather(-1, scores.argmax(-1, keepdim=True))[..., 0]


def block_drafts(model: Any, input_ids: Any, aux: Any, k: int) -> Any:
    """dflash.head.block_drafts with the selector choosing each row's guess (selector_pick)."""
    import torch

    ids = input_ids.reshape(-1)
    t = ids.shape[0]

    def pick(module, logits, rows, anchors):
        before = ids[(anchors[:, None] + torch.arange(k, device=ids.device)).clamp(max=t - 1)]
        return selector_pick(module, logits, rows, before)

    return dflash.block_drafts(model, input_ids, aux, k, pick=pick)
