"""An EAGLE-3 head attached to the base with modelopt (mtsp.convert), its shape read from the base: the draft vocab
picked from the training labels when compressed, the head optionally started from a target layer."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtspec.eagle import head as eagle
from trtspec.errors import ConfigError, DataError

if TYPE_CHECKING:
    from trtspec.config import BuildConfig


def check_convert_config(cfg: BuildConfig, model_config: Any) -> None:
    """The convert settings against the model's config alone: the head derives, and a head copied from a target
    layer keeps that layer's shape."""
    from trtspec.targets import family_of

    arch = eagle.derive_eagle_config(model_config, cfg.convert)["eagle_architecture_config"]
    if cfg.convert.init_from_target and (family := family_of(model_config)).runtime != "native":
        raise ConfigError(f"convert.init_from_target copies a Llama-style target layer; {family.name} layers are not "
                          f"({family.note or 'another layout'})", "set convert.init_from_target: false")
    if cfg.convert.init_from_target:
        plain = eagle.derive_eagle_config(model_config, cfg.convert.model_copy(update={"overrides": {}}))["eagle_architecture_config"]
        if resized := [k for k in eagle.LAYER_SHAPE if arch[k] != plain[k]]:
            raise ConfigError(
                f"convert.init_from_target copies a target layer, but convert.overrides resizes the head ({', '.join(resized)})",
                "drop those overrides, or set convert.init_from_target: false",
            )


def compress_vocab(model: Any, arch: dict, base_config: Any, tokens_file: Path, log: Any) -> dict:
    """The draft vocab: the most frequent training labels (and the special tokens); returns its coverage."""
    from trtspec.chat import token_counts

    if not tokens_file.is_file():
        raise DataError(f"'{tokens_file}' is missing: the draft vocab is chosen from the training data", "re-run the data stage")
    counts = token_counts(tokens_file, arch["vocab_size"])
    special = sorted({t for t in (base_config.eos_token_id, base_config.bos_token_id, base_config.pad_token_id) if isinstance(t, int)})
    ids = eagle.pick_draft_vocab(counts, arch["draft_vocab_size"], special)
    eagle.set_draft_vocab(model, ids)
    coverage = float(counts[ids].sum() / counts.sum().clamp_min(1))
    log(f"draft vocab covers {coverage:.2%} of training label tokens")
    return {"draft_vocab_coverage": round(coverage, 4)}


def init_from_target(model: Any, log: Any) -> dict:
    """convert.init_from_target: the head starts as a copy of a target layer, its final norm and lm_head."""
    metrics: dict[str, Any] = {}
    metrics["init_from_layer"], dropped = eagle.init_head_from_target(model)
    log(f"head initialised from target layer {metrics['init_from_layer']}, its final norm and lm_head")
    if dropped:  # e.g. Qwen3's q/k norms: an EAGLE-3 head (modelopt's, TensorRT-LLM's) has no place for them
        metrics["init_not_copied"] = dropped
        log(f"warning: the head cannot hold {', '.join(dropped)} of that layer: it starts close to it, not equal")
    return metrics


def convert_head(base_config: Any, model_path: Path, cfg: BuildConfig, tokens_file: Path, log: Any) -> tuple[dict, Any, dict]:
    """The family's convert: (the mtsp.convert config, the base with its new head, metrics)."""
    import torch

    from trtspec.models import load_model

    draft_cfg = eagle.derive_eagle_config(base_config, cfg.convert)
    arch = draft_cfg["eagle_architecture_config"]
    log(
        f"head: hidden {arch['hidden_size']}, heads {arch['num_attention_heads']}/{arch['num_key_value_heads']}, "
        f"intermediate {arch['intermediate_size']}, aux layers {arch['eagle_aux_hidden_state_layer_ids']}, "
        f"draft vocab {arch['draft_vocab_size']}/{arch['vocab_size']}"
    )
    # the head is built on the target's embeddings and output head alone (the same head as on the whole target,
    # in Model Optimizer's offline form); init_from_target copies one of its decoder layers
    layers = cfg.convert.init_from_target
    base = load_model(model_path, cfg.model.dtype, layers=layers)
    torch.manual_seed(cfg.seed)  # the head's initial weights: same seed, same head
    model = eagle.build_eagle_model(base, {**draft_cfg, "eagle_offline": not layers})
    metrics: dict[str, Any] = {}
    if arch["draft_vocab_size"] < arch["vocab_size"]:
        metrics.update(compress_vocab(model, arch, base_config, tokens_file, log))
    if cfg.convert.init_from_target:  # after the draft vocab: lm_head takes its rows
        metrics.update(init_from_target(model, log))
    params = sum(p.numel() for p in model.eagle_module.parameters())
    metrics.update(
        head_params=params,
        aux_layers=arch["eagle_aux_hidden_state_layer_ids"],
        draft_vocab_size=arch["draft_vocab_size"],
        headline=f"{'EAGLE-3.1' if cfg.convert.fc_norm or cfg.convert.norm_output else 'EAGLE-3'} head {params / 1e6:.1f}M params, aux layers {arch['eagle_aux_hidden_state_layer_ids']}"
        + (f", draft vocab {arch['draft_vocab_size']} ({metrics['draft_vocab_coverage']:.1%} coverage)" if "draft_vocab_coverage" in metrics else ""),
    )
    return draft_cfg, model, metrics


def grow_draft_vocab(folder: Path, counts: Any, n: int, log: Any) -> dict:
    """draft.grow_vocab on a warm start: the `n` most frequent training labels the earlier draft's vocabulary lacks
    join it. d2t stays ascending (each old lm_head row moves with its token); the new rows start at zero, so before
    training the draft proposes what the earlier one did (a zero row's logit 0 wins only where every old logit is
    below it), and training teaches the new tokens from the target's probabilities over the grown vocabulary."""
    import json

    import torch
    from safetensors.torch import load_file, save_file

    config = folder / eagle.CONFIG_FILE
    draft_cfg = json.loads(config.read_text())
    weights = load_file(folder / "head_init.safetensors")
    if "d2t" not in weights:
        raise ConfigError("draft.grow_vocab: the earlier draft drafts the target's whole vocabulary already",
                          "set draft.grow_vocab: 0")
    old = torch.arange(len(weights["d2t"])) + weights["d2t"]
    lacking = counts.clone()
    lacking[old] = 0
    new = torch.topk(lacking, min(n, int((lacking > 0).sum()))).indices
    ids, order = torch.sort(torch.cat([old, new]))
    head = weights["lm_head.weight"]
    weights["lm_head.weight"] = torch.cat([head, head.new_zeros(len(new), head.shape[1])])[order].contiguous()
    weights["d2t"] = (ids - torch.arange(len(ids))).to(weights["d2t"].dtype)
    draft_cfg["eagle_architecture_config"]["draft_vocab_size"] = len(ids)
    save_file(weights, folder / "head_init.safetensors")
    config.write_text(json.dumps(draft_cfg, indent=2) + "\n")
    total = counts.sum().clamp_min(1)
    grown = {"from": len(old), "to": len(ids), "coverage_before": round(float(counts[old].sum() / total), 4),
             "coverage_after": round(float(counts[ids].sum() / total), 4)}
    log(f"draft vocab grown {grown['from']} -> {grown['to']}: covers {grown['coverage_after']:.2%} of the training "
        f"labels, {grown['coverage_before']:.2%} before")
    return {"draft_vocab_grown": grown}
