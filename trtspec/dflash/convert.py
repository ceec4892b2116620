"""A DFlash block drafter attached to the base through Model Optimizer's dflash mode, its mask token chosen where the
tokenizer has none (recorded in dflash_config.json, which export writes into the draft's config for every engine)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtspec.dflash import head as dflash
from trtspec.targets import text_config

if TYPE_CHECKING:
    from trtspec.config import BuildConfig, DFlashSection

DSPARK_ONLY = ("markov_rank", "markov_head", "ce_weight", "tvd_weight")  # dflash keys of dflash.projector: dspark


def check_build_config(cfg: BuildConfig) -> None:
    """The build config's DFlash rules (draft_families.check_recipe, before any stage; EAGLE-3's convert section is
    refused by the sections rule there): a chain, not a tree; no FSDP; draft.length fits in a block; the projector's
    options match it."""
    if cfg.draft.shape != "chain":
        raise ValueError(f"draft.shape {cfg.draft.shape} drafts a tree with an EAGLE-3 head, but draft.method is "
                         f"{cfg.draft.method} (a DFlash block drafts one chain: set draft.shape: chain)")
    if cfg.serve.draft_len_schedule is not None:
        raise ValueError("serve.draft_len_schedule is checked against the engines for an EAGLE-3 chain only, but "
                         f"draft.method is {cfg.draft.method} (drop the schedule: a DFlash block drafts its fixed length)")
    if cfg.train.sharding == "fsdp":
        raise ValueError("train.sharding fsdp shards an EAGLE-3 head; a DFlash draft trains with ddp (the default)")
    if cfg.draft.length > cfg.dflash.guesses:
        name, n = ("DSpark", "block_size") if cfg.dflash.projector == "dspark" else ("DFlash", "block_size - 1")
        raise ValueError(f"draft.length {cfg.draft.length} is more than a {name} block of {cfg.dflash.block_size} "
                         f"drafts ({n} = {cfg.dflash.guesses})")
    check_projector(cfg.dflash)


def check_projector(d: DFlashSection) -> None:
    """Options of the other projector are refused, naming the key; a DSpark loss weighs something."""
    if d.projector == "dflash" and (bad := sorted(set(DSPARK_ONLY) & d.model_fields_set)):
        raise ValueError(f"dflash.{bad[0]} is a DSpark option, but dflash.projector is dflash (set dflash.projector: dspark)")
    if d.projector == "dspark" and "loss" in d.model_fields_set:
        raise ValueError("dflash.loss weighs DFlash's block positions; a DSpark draft's loss is dflash.ce_weight x "
                         "cross-entropy + dflash.tvd_weight x TVD over every position")
    if d.projector == "dspark" and d.ce_weight + d.tvd_weight == 0:
        raise ValueError("dflash.ce_weight and dflash.tvd_weight are both 0: a DSpark draft would learn nothing")


def check_convert_config(cfg: BuildConfig, model_config: Any) -> None:
    """The dflash settings against the model's config alone (a mask token is chosen later; 0 stands in)."""
    mask = cfg.dflash.mask_token_id
    dflash.derive_dflash_config(model_config, cfg.dflash, 0 if mask is None else mask)


def convert_drafter(base_config: Any, model_path: Path, cfg: BuildConfig, tokens_file: Path, log: Any) -> tuple[dict, Any, dict]:
    """The family's convert: (the mtsp.convert config, the base with its new drafter, metrics)."""
    import torch

    from trtspec.chat import token_counts
    from trtspec.models import load_model, load_tokenizer

    section = cfg.dflash
    tok = load_tokenizer(model_path)
    mask, why = section.mask_token_id, "dflash.mask_token_id"
    if mask is None:
        counts = token_counts(tokens_file, text_config(base_config).vocab_size)
        mask, why = dflash.choose_mask_token(tok, counts)
    draft_cfg = dflash.derive_dflash_config(base_config, section, mask)
    arch = draft_cfg["dflash_architecture_config"]
    name = dflash.draft_name(section.projector, section.markov_head, section.markov_rank)
    log(f"{name} draft: {arch['num_hidden_layers']} layers, block {section.block_size}, target layers "
        f"{arch['target_layer_ids']}, mask token {mask} ({why})")
    torch.manual_seed(cfg.seed)
    # built on the target's embeddings and output head alone (the same draft as on the whole target, in Model
    # Optimizer's offline form)
    model = dflash.build_dflash_model(load_model(model_path, cfg.model.dtype, layers=False), {**draft_cfg, "dflash_offline": True})
    params = sum(p.numel() for p in model.dflash_module.parameters())
    return draft_cfg, model, {
        "draft_method": "dflash", "projector": section.projector, "head_params": params,
        "target_layers": arch["target_layer_ids"], "block_size": section.block_size, "mask_token_id": mask, "mask_token": why,
        "headline": f"{name} draft {params / 1e6:.1f}M params, {arch['num_hidden_layers']} layers, block "
        f"{section.block_size}, target layers {arch['target_layer_ids']}, mask token {mask}",
    }

