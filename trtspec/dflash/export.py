"""The trained DFlash drafter as the engines load it: Model Optimizer's DFlashExporter (a DFlashDraftModel
config.json with block_size and dflash_config {mask_token_id, target_layer_ids, causal}; weights without the
embedding or lm_head, which every engine shares from the target). A DSpark draft goes through its DSparkExporter:
the same files, plus the Markov head's weights and dflash_config {projector_type, shift_label, markov_rank,
markov_head_type, use_confidence_head}, completed with the keys and weight names TensorRT-LLM's and vLLM's DSpark
loaders read (dspark.add_dspark_engine_fields; which engine serves which DSpark draft: dspark.dspark_problems)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trtspec.deploy.bundle import ExportedDraft
from trtspec.dflash.dspark import add_dspark_engine_fields


def export_dflash_draft(base: Any, train_dir: Path, out: Path, dtype: Any, target_path: Path) -> ExportedDraft:
    """The family's export: the drafter rebuilt on `base` from train/, written to `out` in `dtype`."""
    from trtspec.dflash import head

    model = head.build_dflash_model(base, json.loads((train_dir / "dflash_config.json").read_text()))
    head.load_head(model, train_dir / head.HEAD_FILE)
    cfg = write_block_draft(model, out, dtype)
    dc = cfg["dflash_config"]
    info = {
        "draft_method": "dflash",
        "projector": dc.get("projector_type", "dflash"),
        "draft_dtype": cfg["torch_dtype"],
        "target_layers": dc["target_layer_ids"],
        "block_size": cfg["block_size"],
        "mask_token_id": dc["mask_token_id"],
        "draft_params": sum(p.numel() for p in model.dflash_module.parameters()),
    }
    if info["projector"] == "dspark":
        # the engines' keys beside modelopt's, and the Markov head's weights renamed markov_head.*: vLLM and SGLang
        # load only those names (TensorRT-LLM and modelopt read both)
        add_dspark_engine_fields(out)
        info.update(markov_rank=dc["markov_rank"], markov_head=dc["markov_head_type"], causal=bool(dc.get("causal")))
    name = head.draft_name(info["projector"], info.get("markov_head"), info.get("markov_rank"))
    return ExportedDraft(info, f"{name} draft ({info['draft_dtype']}, block {info['block_size']})")



def write_block_draft(model: Any, out: Path, dtype: Any, **fields: Any) -> dict:
    """A trained block draft written by Model Optimizer's exporter (DFlashExporter, or DSparkExporter for a DSpark
    draft) in `dtype`, its config.json given torch_dtype and `fields` (dflash_config's entries merged) -> that config."""
    model.eval().dflash_module.to(dtype)
    model.get_exporter().export(out, dtype)
    cfg = json.loads((out / "config.json").read_text())
    dc = {**cfg.get("dflash_config", {}), **fields.pop("dflash_config", {})}
    cfg.update(torch_dtype=str(dtype).removeprefix("torch."), **fields, dflash_config=dc)
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return cfg
