"""The DFlash block drafter through Model Optimizer 0.47 (`mtsp.convert(model, [("dflash", cfg)])`): its config
sized from the base model, the two fixes it needs under transformers 5.x, its weights saved and loaded, its
training forward on cached target states, and its block drafts from every position at once for evaluation.
Every touch of modelopt's DFlash plugin lives here.

DFlash draft step (modelopt's DFlashModule; vLLM's qwen3_dflash serves the same checkpoint):

    ctx    = hidden_norm(fc(cat(target layer outputs)))          # verified positions 0..L-1, [L, n*H] -> [L, H]
    block  = embed([root, mask, mask, ...])                      # B tokens at positions L..L+B-1
    per draft layer:  q from norm(block); k, v from cat(ctx, norm(block)) (q/k norms, rope at those positions);
                      every block query sees all of ctx and the whole block (bidirectional)
    logits = target lm_head(norm(out[1:]))                       # guesses for tokens L+1..L+B-1, in one pass

DSpark (dflash.projector: dspark; modelopt's DSparkModule) runs the same pass, then reads every row, one more guess:

    logits = target lm_head(norm(out))                           # row j's backbone logits for token L+j+1
    g_j    = argmax(logits_j + markov_w2(W1[g_{j-1}]))           # g_-1 = root; gated/rnn heads also read row j
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtspec.errors import ArtifactError, ConfigError
from trtspec.targets import text_config

if TYPE_CHECKING:
    from trtspec.config import DFlashSection

HEAD_FILE = "head.safetensors"


def target_layers(base_config: Any, section: DFlashSection) -> list[int]:
    """The target layers feeding the draft: one per draft layer (modelopt's rule), uniform when not given."""
    from modelopt.torch.speculative.plugins.modeling_dflash import build_target_layer_ids

    text = text_config(base_config)
    n = text.num_hidden_layers
    if section.num_layers > n - 1:
        raise ConfigError(f"dflash.num_layers {section.num_layers}: each draft layer reads its own target layer, and "
                          f"this target has {n} (the last is not read)", f"set dflash.num_layers to at most {n - 1}")
    ids = list(section.target_layers) if section.target_layers is not None else build_target_layer_ids(n, section.num_layers)
    if len(ids) != section.num_layers:
        raise ConfigError(f"dflash.target_layers has {len(ids)} ids for {section.num_layers} draft layers",
                          "give one target layer per draft layer (dflash.num_layers), or null")
    if any(not 0 <= i < n - 1 for i in ids) or len(set(ids)) != len(ids):
        spread = sorted({round(k * (n - 2) / max(1, len(ids) - 1)) for k in range(len(ids))})
        if section.target_layers is None:  # a target of few layers: Model Optimizer's uniform pick repeats one
            raise ConfigError(f"dflash.target_layers: Model Optimizer's pick for this {n}-layer target, {ids}, "
                              "repeats a layer",
                              f"set dflash.target_layers to {len(ids)} distinct ids in 0..{n - 2}, e.g. {spread}")
        raise ConfigError(f"dflash.target_layers {ids}: need distinct layer ids in 0..{n - 2}")
    return sorted(ids)


def derive_dflash_config(base_config: Any, section: DFlashSection, mask_token_id: int) -> dict:
    """The mtsp.convert config for `base_config` (an HF config) and the `dflash` config section.

    Every size is given explicitly: modelopt builds the draft's config as a Qwen3Config, whose own defaults
    (intermediate 22016, 32 heads of 128) win over the base model's for any size left out."""
    from trtspec.targets import draft_dims, family_of

    family_of(base_config)  # a model no family declares: one line
    text = text_config(base_config)
    dims = draft_dims(base_config)
    vocab = text.vocab_size
    if not 0 <= mask_token_id < vocab:
        raise ConfigError(f"dflash.mask_token_id {mask_token_id} is outside the vocabulary (0..{vocab - 1})")
    arch = {
        "num_hidden_layers": section.num_layers,
        "target_layer_ids": target_layers(base_config, section),
        "hidden_size": dims["hidden_size"],
        "num_attention_heads": dims["num_attention_heads"],
        "num_key_value_heads": dims["num_key_value_heads"],
        "head_dim": dims["head_dim"],
        "intermediate_size": section.intermediate_size or dims["intermediate_size"],
        "max_position_embeddings": dims["max_position_embeddings"],
        "rms_norm_eps": dims["rms_norm_eps"],
        "rope_theta": dims["rope_parameters"]["rope_theta"],
        "hidden_act": "silu",
    }
    cfg = {
        "dflash_block_size": section.block_size,
        "dflash_mask_token_id": mask_token_id,
        "dflash_architecture_config": arch,
        "dflash_draft_attention": section.attention,
        "dflash_num_anchors": section.anchors,
        "dflash_loss_objective": section.loss,
        "dflash_loss_decay_factor": decay_gamma(section.block_size),  # read by the decay objective only
        # the data stage's answers are the target's own greedy tokens: their cross-entropy is the distillation
        # target already, without the [anchors x block x vocab] teacher logits the KD loss gathers
        "dflash_self_logit_distillation": False,
        "dflash_use_torch_compile": False,
        "dflash_offline": False,
    }
    if section.projector == "dspark":
        arch.update(projector_type="dspark", markov_rank=section.markov_rank, markov_head_type=section.markov_head,
                    use_confidence_head=False)  # its acceptance predictor feeds a serving-side scheduler none of ours has
        # DSpark's loss: ce x CE(answer tokens) + tvd x TVD(draft, target distribution) over every block row. The
        # target's distribution comes from its last hidden state through lm_head: modelopt computes it online, and
        # offline from the post-norm state the train stage caches beside the aux layers (train_forward hands it on)
        cfg.update(dflash_ce_loss_alpha=section.ce_weight, dflash_l1_loss_alpha=section.tvd_weight,
                   dflash_confidence_head_alpha=0.0)
    return cfg


def draft_name(projector: str, markov_head: str | None = None, markov_rank: int | None = None) -> str:
    """How logs, headlines and the bundle's README name a block drafter: DFlash, or DSpark with its Markov head."""
    return f"DSpark ({markov_head} Markov head, rank {markov_rank})" if projector == "dspark" else "DFlash"


def is_dspark(model: Any) -> bool:
    """The converted model's draft is DSpark's (DFlash backbone + Markov head), not plain DFlash."""
    return getattr(model.dflash_module, "projector_type", "dflash") == "dspark"


def decay_gamma(block_size: int) -> float:
    """gamma of the decay objective's position weights exp(-(k - 1) / gamma) (DFlash paper, Eq. 4): Model Optimizer's
    suggestion for the block sizes it names (4 for 8, 5 for 10, 7 for 16), block_size / 2 otherwise. modelopt's own
    default, 0, turns the weights off."""
    return {8: 4.0, 10: 5.0, 16: 7.0}.get(block_size, block_size / 2)


def choose_mask_token(tok: Any, counts: Any | None = None) -> tuple[int, str]:
    """The token that stands for "not yet known" in a draft block -> (id, why).

    The tokenizer's own mask token where it has one; else a special token the training labels never use (the
    base's embedding of it is frozen, so any stable, otherwise unused row serves); else the rarest label token."""
    if getattr(tok, "mask_token_id", None) is not None:
        return int(tok.mask_token_id), "the tokenizer's mask token"
    reserved = {tok.eos_token_id, tok.bos_token_id, tok.pad_token_id}
    special = sorted(set(tok.all_special_ids) | {int(i) for i in getattr(tok, "added_tokens_decoder", {})})
    unused = [i for i in special if i not in reserved and (counts is None or int(counts[i]) == 0)]
    if unused:
        return unused[-1], f"special token {tok.convert_ids_to_tokens(unused[-1])!r}, never a training label"
    if counts is None:
        raise ConfigError("the tokenizer has no mask token and no spare special token", "set dflash.mask_token_id")
    rarest = int(counts.argmin())
    return rarest, f"token {rarest}, the rarest training label"


def build_dflash_model(base_model: Any, cfg: dict) -> Any:
    """mtsp.convert(base, [("dflash", cfg)]) with the draft's rotary embedding made up front (modelopt 0.47 passes
    `device=` to Qwen3RotaryEmbedding, which transformers 5.19+ refuses on the first forward)."""
    import modelopt.torch.speculative as mtsp
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

    model = mtsp.convert(base_model, [("dflash", copy.deepcopy(cfg))])
    module = model.dflash_module
    device = next(module.parameters()).device
    module.rotary_emb = Qwen3RotaryEmbedding(config=module.config).to(device)
    return model


def head_state_dict(model: Any) -> dict:
    """The draft's own weights (no rotary buffers: recomputed), keys as exported (modelopt's DFlashExporter)."""
    return {k: v.detach().contiguous().clone() for k, v in model.dflash_module.state_dict().items() if "rotary_emb" not in k}


def save_head(model: Any, path: str | Path) -> Path:
    from trtspec.artifacts import write_tensors

    return write_tensors(Path(path), head_state_dict(model))


def load_head(model: Any, path: str | Path) -> Any:
    from trtspec.artifacts import read_tensors

    path = Path(path)
    state = read_tensors(path, "DFlash draft weights")
    own = head_state_dict(model)
    wrong = sorted(set(own) ^ set(state)) + sorted(k for k in set(own) & set(state) if own[k].shape != state[k].shape)
    if wrong:
        raise ArtifactError(f"'{path}' does not fit this DFlash draft ({wrong[:3]})",
                            "the draft was built with another dflash config; re-run convert and train")
    model.dflash_module.load_state_dict(state, strict=False)
    return model


def train_forward(model: Any, batch: dict, unwrapped: Any = None) -> Any:
    """One training forward on a batch of HeadDataset.collate: modelopt's DFlash loss (random anchors, one block
    each, D-PACE or decay weights) or DSpark's (CE + TVD). Offline batches carry the cached states of the target
    layers (and its last state, which DSpark's TVD reads).

    modelopt scores block position j of an anchor at a against token a + j (DSpark: a + j + 1) where the loss_mask
    of that token is set, and draws anchors among positions with loss_mask set: the data stage's own (unshifted)
    label mask serves both."""
    batch = dict(batch)
    kwargs = {}
    if "aux_hidden_states" in batch:
        dtype = (unwrapped or model).dflash_module.fc.weight.dtype
        last = batch.pop("base_model_hidden_states", None)
        outputs = {"aux_hidden_states": batch.pop("aux_hidden_states").to(dtype)}
        if is_dspark(unwrapped or model):  # its TVD term: the target's logits, lm_head(last) inside modelopt
            outputs["base_model_hidden_states"] = last.to(dtype)
        kwargs["base_model_outputs"] = outputs
    return model(**batch, **kwargs)


def block_drafts(model: Any, input_ids: Any, aux: Any, k: int, first: int = 1, chunk: int = 64, pick: Any = None) -> Any:
    """Greedy block drafts from every anchor at once (teacher-forced): drafts[j, s] = the draft's guess for token
    j + 2 + s from the block anchored at token j + 1 with the target's states of positions 0..j (the verified
    context at that step), for anchors j + 1 >= first. Same layout as the EAGLE-3 head's chain drafts, so the
    same acceptance count applies; exact for greedy decoding, as the block sees only verified tokens. DFlash guesses
    from block rows 1..k, DSpark from rows 0..k-1 with its Markov bias (markov_drafts); `pick(module, logits, rows,
    anchors)` -> [n, k] chooses the guesses of a family built on DFlash's block (default: each row's argmax)."""
    import torch

    module, B, dspark = model.dflash_module, model.dflash_block_size, is_dspark(model)
    row0 = 0 if dspark else 1  # the block row guessing the token after the anchor
    t = input_ids.shape[-1]
    ids = input_ids.reshape(-1)
    out = torch.zeros(t, k, dtype=torch.long, device=ids.device)
    dtype = module.fc.weight.dtype
    ctx = aux.reshape(1, t, -1).to(dtype)
    with torch.no_grad():
        for lo in range(max(first, 1), t, chunk):
            anchors = torch.arange(lo, min(lo + chunk, t), device=ids.device)
            n = len(anchors)
            block = torch.full((n, B), model.mask_token_id, device=ids.device)
            block[:, 0] = ids[anchors]
            noise = model._base_model_embeddings(block.reshape(1, -1)).to(dtype)
            pos = torch.cat((torch.arange(t, device=ids.device), (anchors[:, None] + torch.arange(B, device=ids.device)).reshape(-1)))
            mask = model._build_draft_attention_mask(t, anchors[None], torch.ones(1, n, dtype=torch.bool, device=ids.device),
                                                     n, dtype, ids.device)
            hidden = module(noise_embedding=noise, target_hidden=ctx, position_ids=pos[None], attention_mask=mask)
            rows = hidden.view(n, B, -1)[:, row0 : row0 + k]
            logits = model._base_model_lm_head(rows)
            if pick is not None:
                out[anchors - 1] = pick(module, logits, rows, anchors)
            else:
                out[anchors - 1] = markov_drafts(module, logits, rows, ids[anchors]) if dspark else logits.argmax(-1)
    return out


def markov_drafts(module: Any, logits: Any, rows: Any, roots: Any) -> Any:
    """DSpark's greedy guesses [n, k] from its block rows' backbone logits [n, k, V] and hidden states [n, k, H]: guess
    j = argmax(logits j + the Markov bias from guess j - 1, the root's for j = 0), one after another (modelopt's
    DSparkModule.markov_step, as its pseudo_speculative_generate)."""
    import torch

    prev, state, guesses = roots, None, []
    for j in range(logits.shape[1]):
        bias, state = module.markov_step(prev, rows[:, j], state)
        prev = (logits[:, j] + bias).argmax(-1)
        guesses.append(prev)
    return torch.stack(guesses, 1)
