"""The DFlash block drafter as a draft family (trtspec.drafting.DraftFamily): block_size - 1 tokens in one pass
(dflash.projector: dspark: DSpark, block_size tokens, each biased by a Markov head from the one before)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtspec.dflash.head import HEAD_FILE
from trtspec.drafting import DraftFamily


class DFlashFamily(DraftFamily):
    name = "dflash"
    title = "DFlash block drafter"
    config_file = "dflash_config.json"
    head_file = HEAD_FILE
    shift_labels = False
    offline_key = "dflash_offline"
    module_attr = "dflash_module"
    no_launcher = frozenset({"speculators"})  # speculators converts EAGLE-3 heads only

    def check_convert(self, cfg: Any, model_config: Any) -> None:
        from trtspec.dflash.convert import check_convert_config

        check_convert_config(cfg, model_config)

    def convert(self, *args: Any) -> Any:
        from trtspec.dflash.convert import convert_drafter

        return convert_drafter(*args)

    def build(self, base_model: Any, cfg: dict) -> Any:
        from trtspec.dflash.head import build_dflash_model

        return build_dflash_model(base_model, cfg)

    def save_head(self, model: Any, path: Path) -> Any:
        from trtspec.dflash.head import save_head

        return save_head(model, path)

    def load_head(self, model: Any, path: Path) -> Any:
        from trtspec.dflash.head import load_head

        return load_head(model, path)

    def train_forward(self, model: Any, batch: dict, unwrapped: Any = None) -> Any:
        from trtspec.dflash.head import train_forward

        return train_forward(model, batch, unwrapped)

    def state_layers(self, cfg: dict) -> list[int]:
        return cfg["dflash_architecture_config"]["target_layer_ids"]

    def drafts(self, model: Any, ids: Any, aux: Any, last: Any, k: int) -> Any:
        from trtspec.dflash.head import block_drafts

        return block_drafts(model, ids[0], aux[0], k)[None]

    def check_export(self, cfg: Any) -> None:
        """Nothing beyond the config's own checks: DSpark's engine limits are read from the exported draft."""

    def export_draft(self, *args: Any) -> Any:
        from trtspec.dflash.export import export_dflash_draft

        return export_dflash_draft(*args)

    def write_readme(self, bundle: Path, cfg: Any, info: dict, metrics: dict) -> None:
        from trtspec.dflash.readme import write_dflash_readme

        write_dflash_readme(bundle, cfg, info, metrics)

    def load_drafter(self, draft_dir: Path, target: Any, weights: str = "auto", settings: Any = None) -> Any:
        from trtspec.runtime.dflash import load_dflash_drafter

        return load_dflash_drafter(draft_dir, target, weights=weights, settings=settings)


DFLASH = DFlashFamily()
