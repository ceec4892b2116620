"""The convert stage: attach a draft to the base model with modelopt (mtsp.convert), its shape read from the base:
an EAGLE-3 head (trtspec.eagle.convert) or a DFlash block drafter (trtspec.dflash.convert), per draft.method.

Writes convert/eagle_config.json or dflash_config.json (the dict given to mtsp.convert) and
convert/head_init.safetensors (the initial draft; an EAGLE-3 head's d2t included when its vocab is compressed).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trtspec.families import family
from trtspec.pipeline.stage import StageContext

if TYPE_CHECKING:
    from trtspec.config import BuildConfig

UPSTREAM = ("data",)
READS = ("convert", "draft.method", "dflash", "seed")


def preflight(cfg: BuildConfig, model_config: Any) -> None:
    """The convert settings checked against the model's config alone, before the data stage spends minutes."""
    family(cfg.draft.method).check_convert(cfg, model_config)


def run(ctx: StageContext) -> dict:
    from transformers import AutoConfig

    fam = family(ctx.cfg.draft.method)
    base_config = AutoConfig.from_pretrained(ctx.model_path)
    tokens = ctx.inputs["data"] / "train_tokens.pt"
    draft_cfg, model, metrics = fam.convert(base_config, ctx.model_path, ctx.cfg, tokens, ctx.log)
    fam.write_config(ctx.out, draft_cfg)
    fam.save_head(model, ctx.out / "head_init.safetensors")
    return metrics
