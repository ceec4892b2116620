"""DFlash2 as a draft family (trtspec.draft_family.DraftFamily): DFlash's block, its config and checks, with the
convolutions and the candidate selector of trtspec.dflash2 (head.py) trained, exported and run beside it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtspec.dflash.convert import check_build_config as check_dflash_config
from trtspec.dflash.family import DFlashFamily
from trtspec.dflash2 import ARCHITECTURE, NO_ENGINE


class DFlash2Family(DFlashFamily):
    name = "dflash2"
    title = "DFlash2 block drafter"
    config_file = "dflash2_config.json"
    sections = ("dflash", "dflash2")
    architectures = (ARCHITECTURE,)
    no_engine = NO_ENGINE
    no_launcher = frozenset({"speculators"})
    drafting = ()

    @staticmethod
    def check_config(cfg: Any) -> None:
        check_dflash_config(cfg)
        if cfg.dflash.projector != "dflash":
            raise ValueError("dflash.projector dspark makes a DSpark draft, but draft.method is dflash2 (a DFlash2 block "
                             "guesses with its candidate selector: drop dflash.projector)")

    @staticmethod
    def check_convert(cfg: Any, model_config: Any) -> None:
        """Before any stage: speculators (whose DFlash2 modules are trained) installed, the dflash settings, and the
        convolutions and the selector against the target's sizes."""
        from importlib.util import find_spec

        from trtspec.dflash.convert import check_convert_config
        from trtspec.dflash2.head import check_shape, settings
        from trtspec.errors import MissingDependency
        from trtspec.targets import draft_dims, text_config

        if find_spec("speculators") is None:
            raise MissingDependency("draft.method dflash2 trains speculators' DFlash2 convolutions and candidate "
                                    "selector, and speculators is not installed",
                                    "pip install --no-deps speculators==0.9.0, or bash scripts/setup.sh --engines vllm")
        check_convert_config(cfg, model_config)
        check_shape(settings(cfg.dflash2), draft_dims(model_config)["hidden_size"], text_config(model_config).vocab_size,
                    cfg.dflash.block_size)

    @staticmethod
    def convert(base_config: Any, model_path: Path, cfg: Any, tokens: Path, log: Any) -> Any:
        from trtspec.dflash2.head import convert_drafter

        return convert_drafter(base_config, model_path, cfg, tokens, log)

    @staticmethod
    def build(base_model: Any, cfg: dict) -> Any:
        from trtspec.dflash2.head import build_dflash2_model

        return build_dflash2_model(base_model, cfg)

    def drafts(self, model: Any, ids: Any, aux: Any, last: Any, k: int) -> Any:
        from trtspec.dflash2.head import block_drafts

        return block_drafts(model, ids[0], aux[0], k)[None]

    @staticmethod
    def export_draft(base: Any, train_dir: Path, out: Path, dtype: Any, target_path: Path) -> Any:
        from trtspec.dflash2.export import export_dflash2_draft

        return export_dflash2_draft(base, train_dir, out, dtype, target_path)

    @staticmethod
    def write_readme(bundle: Path, cfg: Any, info: dict, metrics: dict) -> None:
        from trtspec.dflash2.export import write_readme

        write_readme(bundle, cfg, info, metrics)

    def load_drafter(self, draft_dir: Path, target: Any, weights: str = "auto", settings: Any = None) -> Any:
        from trtspec.dflash2.runtime import load_dflash2_drafter  # torch: imported when a drafter is loaded

        return load_dflash2_drafter(draft_dir, target, weights=weights, settings=settings)


DFLASH2 = DFlash2Family()
