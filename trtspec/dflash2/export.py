"""The trained DFlash2 draft as vLLM's qwen3_dflash2 loads it: Model Optimizer's DFlash export (its weights with the
convolutions' and the selector's beside them, named as vLLM names them) with architectures [DFlash2DraftModel] and
dflash_config's conv_kernel_size, conv_group_size, selector_rank and selector_top_k; and the bundle's README."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtspec.deploy.bundle import ExportedDraft, built_with, family_lines, source_name
from trtspec.dflash2 import ARCHITECTURE, NO_ENGINE

if TYPE_CHECKING:
    from trtspec.config import BuildConfig

SERVED_KEYS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")  # what vLLM reads of them


def export_dflash2_draft(base: Any, train_dir: Path, out: Path, dtype: Any, target_path: Path) -> ExportedDraft:
    """The family's export: the draft rebuilt on `base` from train/, written to `out` in `dtype`."""
    from trtspec.dflash import head as dflash
    from trtspec.dflash.export import write_block_draft
    from trtspec.dflash2 import head

    saved = json.loads((train_dir / "dflash2_config.json").read_text())
    model = head.build_dflash2_model(base, saved)
    dflash.load_head(model, train_dir / dflash.HEAD_FILE)
    own = saved[head.KEY]
    cfg = write_block_draft(model, out, dtype, architectures=[ARCHITECTURE],
                            dflash_config={k: own[k] for k in SERVED_KEYS})
    dc = cfg["dflash_config"]
    info = {
        "draft_method": "dflash2",
        "projector": "dflash",
        "draft_dtype": cfg["torch_dtype"],
        "target_layers": dc["target_layer_ids"],
        "block_size": cfg["block_size"],
        "mask_token_id": dc["mask_token_id"],
        "draft_params": sum(p.numel() for p in model.dflash_module.parameters()),
        **{k: own[k] for k in SERVED_KEYS},
    }
    return ExportedDraft(info, f"DFlash2 draft ({info['draft_dtype']}, block {info['block_size']})", no_engine=NO_ENGINE)


def write_readme(bundle: Path, cfg: BuildConfig, info: dict, metrics: dict) -> None:
    """README.md of a bundle with a DFlash2 draft: what it holds, and where it is served."""
    lines = [
        "# trtspec deployment bundle",
        "",
        f"Target `{source_name(cfg)}` ({info['quant_format']}, {info['target_dtype']}) with a DFlash2 block drafter "
        f"({info['draft_params'] / 1e6:.1f}M parameters, {info['draft_dtype']}, block {info['block_size']}, target layers "
        f"{info['target_layers']}, mask token {info['mask_token_id']}; convolutions of {info['conv_kernel_size']} taps, "
        f"a candidate selector of rank {info['selector_rank']} over each row's top {info['selector_top_k']}); "
        f"{info['max_draft_len']} drafts verified per step.",
        "",
        "| folder | what |",
        "|---|---|",
        "| `target/` | the target, HF format |",
        f"| `draft/` | the DFlash2 draft (`{ARCHITECTURE}`; Model Optimizer's DFlash export with the convolutions' and "
        "the selector's weights): embedding and lm_head are the target's |",
        "",
        metrics.get("no_engine") or NO_ENGINE,
        "",
        *family_lines(bundle / "target", cfg.model.chat_template_kwargs, cfg.model.chat_template),
        *built_with(),
    ]
    (bundle / "README.md").write_text("\n".join(lines), encoding="utf-8")
