"""The convert stage: attach an EAGLE-3 head to the base model with modelopt, its shape read from the base.

Writes convert/eagle_config.json (the dict given to mtsp.convert) and convert/head_init.safetensors (the
initial head, d2t included when the draft vocab is compressed).
"""

from __future__ import annotations

import json
from typing import Any

from trtspec.drafting import token_counts
from trtspec.eagle.head import LAYER_SHAPE, derive_eagle_config, pick_draft_vocab
from trtspec.errors import ConfigError, DataError
from trtspec.pipeline.stage import StageContext

UPSTREAM = ("data",)
READS = ("convert", "draft.method", "dflash", "seed")

def preflight(cfg: Any, model_config: Any) -> None:
    """The convert settings checked against the model's config alone, before the data stage spends minutes."""
    if cfg.draft.method == "dflash":
        from trtspec.dflash.head import derive_dflash_config

        mask = cfg.dflash.mask_token_id
        derive_dflash_config(model_config, cfg.dflash, 0 if mask is None else mask)
        return
    arch = derive_eagle_config(model_config, cfg.convert)["eagle_architecture_config"]
    if cfg.convert.init_from_target:
        plain = derive_eagle_config(model_config, cfg.convert.model_copy(update={"overrides": {}}))["eagle_architecture_config"]
        if resized := [k for k in LAYER_SHAPE if arch[k] != plain[k]]:
            raise ConfigError(
                f"convert.init_from_target copies a target layer, but convert.overrides resizes the head ({', '.join(resized)})",
                "drop those overrides, or set convert.init_from_target: false",
            )


def run(ctx: StageContext) -> dict:
    from transformers import AutoConfig

    from trtspec.eagle import head as eagle
    from trtspec.models import load_model

    path = ctx.model_path
    base_config = AutoConfig.from_pretrained(path)
    if ctx.cfg.draft.method == "dflash":
        return run_dflash(ctx, path, base_config)
    cfg = derive_eagle_config(base_config, ctx.cfg.convert)
    arch = cfg["eagle_architecture_config"]
    ctx.log(
        f"head: hidden {arch['hidden_size']}, heads {arch['num_attention_heads']}/{arch['num_key_value_heads']}, "
        f"intermediate {arch['intermediate_size']}, aux layers {arch['eagle_aux_hidden_state_layer_ids']}, "
        f"draft vocab {arch['draft_vocab_size']}/{arch['vocab_size']}"
    )
    import torch

    base = load_model(path, ctx.cfg.model.dtype)
    torch.manual_seed(ctx.cfg.seed)  # the head's initial weights: same seed, same head
    model = eagle.build_eagle_model(base, cfg)
    metrics: dict[str, Any] = {}
    if arch["draft_vocab_size"] < arch["vocab_size"]:
        tokens = ctx.inputs["data"] / "train_tokens.pt"
        if not tokens.is_file():
            raise DataError(f"'{tokens}' is missing: the draft vocab is chosen from the training data", "re-run the data stage")
        counts = token_counts(tokens, arch["vocab_size"])
        special = sorted({t for t in (base_config.eos_token_id, base_config.bos_token_id, base_config.pad_token_id) if isinstance(t, int)})
        ids = pick_draft_vocab(counts, arch["draft_vocab_size"], special)
        eagle.set_draft_vocab(model, ids)
        coverage = float(counts[ids].sum() / counts.sum().clamp_min(1))
        metrics["draft_vocab_coverage"] = round(coverage, 4)
        ctx.log(f"draft vocab covers {coverage:.2%} of training label tokens")
    if ctx.cfg.convert.init_from_target:  # after the draft vocab: lm_head takes its rows
        metrics["init_from_layer"], dropped = eagle.init_head_from_target(model)
        ctx.log(f"head initialised from target layer {metrics['init_from_layer']}, its final norm and lm_head")
        if dropped:  # e.g. Qwen3's q/k norms: an EAGLE-3 head (modelopt's, TensorRT-LLM's) has no place for them
            metrics["init_not_copied"] = dropped
            ctx.log(f"warning: the head cannot hold {', '.join(dropped)} of that layer: it starts close to it, not equal")
    (ctx.out / "eagle_config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    eagle.save_head(model, ctx.out / "head_init.safetensors")
    params = sum(p.numel() for p in model.eagle_module.parameters())
    metrics.update(
        head_params=params,
        aux_layers=arch["eagle_aux_hidden_state_layer_ids"],
        draft_vocab_size=arch["draft_vocab_size"],
        headline=f"EAGLE-3 head {params / 1e6:.1f}M params, aux layers {arch['eagle_aux_hidden_state_layer_ids']}"
        + (f", draft vocab {arch['draft_vocab_size']} ({metrics['draft_vocab_coverage']:.1%} coverage)" if "draft_vocab_coverage" in metrics else ""),
    )
    return metrics


def run_dflash(ctx: StageContext, path: str, base_config: Any) -> dict:
    """DFlash: the block drafter through Model Optimizer's dflash mode; its mask token chosen where the tokenizer has
    none (recorded in dflash_config.json, which export writes into the draft's config for every engine)."""
    import torch

    from trtspec.dflash import head as dflash
    from trtspec.models import load_model, load_tokenizer

    section = ctx.cfg.dflash
    tok = load_tokenizer(path)
    mask, why = section.mask_token_id, "dflash.mask_token_id"
    if mask is None:
        counts = token_counts(ctx.inputs["data"] / "train_tokens.pt", text_vocab(base_config))
        mask, why = dflash.choose_mask_token(tok, counts)
    cfg = dflash.derive_dflash_config(base_config, section, mask)
    arch = cfg["dflash_architecture_config"]
    ctx.log(f"DFlash draft: {arch['num_hidden_layers']} layers, block {section.block_size}, target layers "
            f"{arch['target_layer_ids']}, mask token {mask} ({why})")
    torch.manual_seed(ctx.cfg.seed)
    model = dflash.build_dflash_model(load_model(path, ctx.cfg.model.dtype), cfg)
    (ctx.out / "dflash_config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    dflash.save_head(model, ctx.out / "head_init.safetensors")
    params = sum(p.numel() for p in model.dflash_module.parameters())
    return {
        "draft_method": "dflash", "head_params": params, "target_layers": arch["target_layer_ids"],
        "block_size": section.block_size, "mask_token_id": mask, "mask_token": why,
        "headline": f"DFlash draft {params / 1e6:.1f}M params, {arch['num_hidden_layers']} layers, block "
        f"{section.block_size}, target layers {arch['target_layer_ids']}, mask token {mask}",
    }


def text_vocab(base_config: Any) -> int:
    return (getattr(base_config, "text_config", None) or base_config).vocab_size
