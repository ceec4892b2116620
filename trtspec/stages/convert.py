"""The convert stage: attach a draft to the base model with modelopt (mtsp.convert), its shape read from the base:
an EAGLE-3 head (trtspec.eagle.convert) or a DFlash block drafter (trtspec.dflash.convert), per draft.method.

Writes convert/eagle_config.json or dflash_config.json (the dict given to mtsp.convert) and
convert/head_init.safetensors (the initial draft; an EAGLE-3 head's d2t included when its vocab is compressed).
With draft.init_from, both are the earlier run's (its config and its trained draft, checked against its manifests):
training continues from that draft, in its draft vocabulary (trtspec.warm_start), grown by draft.grow_vocab tokens of
this run's training labels where set.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trtspec.draft_families import SECTIONS, family
from trtspec.errors import ConfigError
from trtspec.pipeline.stage import StageContext

if TYPE_CHECKING:
    from trtspec.config import BuildConfig
    from trtspec.draft_family import TrainableDraft

UPSTREAM = ("data",)
READS = ("draft.method", "draft.init_from", "draft.grow_vocab", *SECTIONS, "seed")


def preflight(cfg: BuildConfig, model_config: Any) -> None:
    """The convert settings checked against the model's config alone, and the run draft.init_from names, before the
    data stage spends minutes."""
    from trtspec.warm_start import check_init_from

    if cfg.draft.init_from:  # first: a draft of another method is refused as that, not by the new method's rules
        check_init_from(cfg)
    if cfg.draft.grow_vocab and not (cfg.draft.init_from and family(cfg.draft.method).grows_vocab):
        why = (f"trains a {family(cfg.draft.method).title}, whose vocabulary does not grow" if cfg.draft.init_from
               else "starts a new draft")
        raise ConfigError(f"draft.grow_vocab {cfg.draft.grow_vocab}: grows the vocabulary of the draft draft.init_from "
                          f"names, and this build {why}", "set draft.grow_vocab: 0, or choose convert.draft_vocab_size for a new draft")
    family(cfg.draft.method).check_convert(cfg, model_config)


def run(ctx: StageContext) -> dict:
    from transformers import AutoConfig

    fam = family(ctx.cfg.draft.method)
    if ctx.cfg.draft.init_from:
        return continue_from(ctx, fam)
    base_config = AutoConfig.from_pretrained(ctx.model_path)
    tokens = ctx.inputs["data"] / "train_tokens.pt"
    draft_cfg, model, metrics = fam.convert(base_config, ctx.model_path, ctx.cfg, tokens, ctx.log)
    fam.write_config(ctx.out, draft_cfg)
    fam.save_head(model, ctx.out / "head_init.safetensors")
    return metrics


def continue_from(ctx: StageContext, fam: TrainableDraft) -> dict:
    """draft.init_from: the earlier run's draft config and trained weights as this run's starting draft."""
    import shutil

    from trtspec.warm_start import initial_draft

    config, head, lineage = initial_draft(ctx.cfg, fam.config_file, fam.head_file)
    shutil.copyfile(config, ctx.out / fam.config_file)
    shutil.copyfile(head, ctx.out / "head_init.safetensors")
    ctx.log(f"continuing from the draft of {lineage['run']} (held-out AL@{ctx.cfg.draft.length} {lineage['heldout_al']})")
    metrics = {"init_from": lineage, "headline": f"warm start from {lineage['run']}"}
    if n := ctx.cfg.draft.grow_vocab:
        from transformers import AutoConfig

        from trtspec.chat import token_counts
        from trtspec.targets import text_config

        vocab = text_config(AutoConfig.from_pretrained(ctx.model_path)).vocab_size
        metrics |= fam.grow_vocab(ctx.out, token_counts(ctx.inputs["data"] / "train_tokens.pt", vocab), n, ctx.log)
        grown = metrics["draft_vocab_grown"]
        metrics["headline"] += f", draft vocab {grown['from']} -> {grown['to']} ({grown['coverage_after']:.1%} coverage)"
    return metrics
