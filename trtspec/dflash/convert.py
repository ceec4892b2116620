"""A DFlash block drafter attached to the base through Model Optimizer's dflash mode, its mask token chosen where the
tokenizer has none (recorded in dflash_config.json, which export writes into the draft's config for every engine)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtspec.dflash import head as dflash
from trtspec.targets import text_config

if TYPE_CHECKING:
    from trtspec.config import BuildConfig


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
    model = dflash.build_dflash_model(load_model(model_path, cfg.model.dtype), draft_cfg)
    params = sum(p.numel() for p in model.dflash_module.parameters())
    return draft_cfg, model, {
        "draft_method": "dflash", "projector": section.projector, "head_params": params,
        "target_layers": arch["target_layer_ids"], "block_size": section.block_size, "mask_token_id": mask, "mask_token": why,
        "headline": f"{name} draft {params / 1e6:.1f}M params, {arch['num_hidden_layers']} layers, block "
        f"{section.block_size}, target layers {arch['target_layer_ids']}, mask token {mask}",
    }

