"""The trained DFlash drafter as the engines load it: Model Optimizer's DFlashExporter (a DFlashDraftModel
config.json with block_size and dflash_config {mask_token_id, target_layer_ids, causal}; weights without the
embedding or lm_head, which every engine shares from the target)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trtspec.deploy.bundle import ExportedDraft


def export_dflash_draft(base: Any, train_dir: Path, out: Path, dtype: Any, target_path: Path) -> ExportedDraft:
    """The family's export: the drafter rebuilt on `base` from train/, written to `out` in `dtype`."""
    from modelopt.torch.export.plugins.hf_spec_export import DFlashExporter

    from trtspec.dflash import head

    model = head.build_dflash_model(base, json.loads((train_dir / "dflash_config.json").read_text()))
    head.load_head(model, train_dir / head.HEAD_FILE)
    model.eval().dflash_module.to(dtype)
    DFlashExporter(model).export(out, dtype)
    cfg = json.loads((out / "config.json").read_text())
    cfg["torch_dtype"] = str(dtype).removeprefix("torch.")
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    info = {
        "draft_method": "dflash",
        "draft_dtype": cfg["torch_dtype"],
        "target_layers": cfg["dflash_config"]["target_layer_ids"],
        "block_size": cfg["block_size"],
        "mask_token_id": cfg["dflash_config"]["mask_token_id"],
        "draft_params": sum(p.numel() for p in model.dflash_module.parameters()),
    }
    return ExportedDraft(info, f"DFlash draft ({info['draft_dtype']}, block {info['block_size']})")
