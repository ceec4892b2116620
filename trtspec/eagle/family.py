"""The EAGLE-3 head as a draft family (trtspec.draft_family.DraftFamily): one token per pass, chained k times, reading
three of the target's layers (EAGLE-3.1: convert.fc_norm, convert.norm_output, a few lines in head.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtspec.draft_family import DraftFamily
from trtspec.eagle import ARCHITECTURES, export, head, onnx_export, readme, serving, train_step
from trtspec.eagle.convert import check_convert_config, convert_head, grow_draft_vocab


class Eagle3Family(DraftFamily):
    name = "eagle3"
    title = "EAGLE-3 head"
    config_file = head.CONFIG_FILE
    head_file = head.HEAD_FILE
    shift_labels = True
    offline_key = "eagle_offline"
    module_attr = "eagle_module"
    length_key = "eagle_ttt_steps"
    grows_vocab = True
    exports_onnx = True

    drafting = ("eagle3", "eagle3_suffix")
    sections = ("convert",)
    architectures = ARCHITECTURES

    check_convert = staticmethod(check_convert_config)
    convert = staticmethod(convert_head)
    grow_vocab = staticmethod(grow_draft_vocab)
    build = staticmethod(head.build_eagle_model)
    save_head = staticmethod(head.save_head)
    load_head = staticmethod(head.load_head)
    train_forward = staticmethod(train_step.head_forward)
    drafts = staticmethod(head.chain_drafts)
    check_export = staticmethod(export.check_export_config)
    export_draft = staticmethod(export.export_eagle3_draft)
    export_onnx = staticmethod(onnx_export.export_onnx)
    format_onnx_check = staticmethod(onnx_export.format_onnx_check)
    trtllm_spec = staticmethod(serving.trtllm_spec)
    sglang_script = staticmethod(serving.sglang_script)
    write_readme = staticmethod(readme.write_eagle3_readme)

    def state_layers(self, cfg: dict) -> list[int]:
        return cfg["eagle_architecture_config"]["eagle_aux_hidden_state_layer_ids"]

    def load_drafter(self, draft_dir: Path, target: Any, weights: str = "auto", settings: Any = None) -> Any:
        from trtspec.eagle.runtime import load_eagle3_drafter  # torch: imported when a drafter is loaded

        return load_eagle3_drafter(draft_dir, target, weights=weights, settings=settings)


EAGLE3 = Eagle3Family()
