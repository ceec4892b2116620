"""The EAGLE-3 head as a draft family (trtspec.drafting.DraftFamily): one token per pass, chained k times, reading
three of the target's layers (EAGLE-3.1: convert.fc_norm, convert.norm_output, a few lines in head.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtspec.drafting import DraftFamily
from trtspec.eagle.head import HEAD_FILE


class Eagle3Family(DraftFamily):
    name = "eagle3"
    title = "EAGLE-3 head"
    config_file = "eagle_config.json"
    head_file = HEAD_FILE
    shift_labels = True
    offline_key = "eagle_offline"
    module_attr = "eagle_module"
    length_key = "eagle_ttt_steps"
    exports_onnx = True

    def check_convert(self, cfg: Any, model_config: Any) -> None:
        from trtspec.eagle.convert import check_convert_config

        check_convert_config(cfg, model_config)

    def convert(self, *args: Any) -> Any:
        from trtspec.eagle.convert import convert_head

        return convert_head(*args)

    def build(self, base_model: Any, cfg: dict) -> Any:
        from trtspec.eagle.head import build_eagle_model

        return build_eagle_model(base_model, cfg)

    def save_head(self, model: Any, path: Path) -> Any:
        from trtspec.eagle.head import save_head

        return save_head(model, path)

    def load_head(self, model: Any, path: Path) -> Any:
        from trtspec.eagle.head import load_head

        return load_head(model, path)

    def train_forward(self, model: Any, batch: dict, unwrapped: Any = None) -> Any:
        from trtspec.eagle.train_step import head_forward

        return head_forward(model, batch, unwrapped)

    def state_layers(self, cfg: dict) -> list[int]:
        return cfg["eagle_architecture_config"]["eagle_aux_hidden_state_layer_ids"]

    def drafts(self, model: Any, ids: Any, aux: Any, last: Any, k: int) -> Any:
        from trtspec.eagle.head import chain_drafts

        return chain_drafts(model, ids, aux, last, k)

    def check_export(self, cfg: Any) -> None:
        from trtspec.eagle.export import check_export_config

        check_export_config(cfg)

    def export_draft(self, *args: Any) -> Any:
        from trtspec.eagle.export import export_eagle3_draft

        return export_eagle3_draft(*args)

    def export_onnx(self, draft_dir: Path, onnx_dir: Path) -> dict:
        from trtspec.eagle.onnx_export import export_onnx

        return export_onnx(draft_dir, onnx_dir)

    def write_readme(self, bundle: Path, cfg: Any, info: dict, metrics: dict) -> None:
        from trtspec.eagle.readme import write_eagle3_readme

        write_eagle3_readme(bundle, cfg, info, metrics)

    def load_drafter(self, draft_dir: Path, target: Any, weights: str = "auto", settings: Any = None) -> Any:
        from trtspec.runtime.drafters import load_eagle3_drafter

        return load_eagle3_drafter(draft_dir, target, weights=weights, settings=settings)


EAGLE3 = Eagle3Family()
