"""The DFlash block drafter as a draft family (trtspec.draft_family.DraftFamily): block_size - 1 tokens in one pass
(dflash.projector: dspark: DSpark, block_size tokens, each biased by a Markov head from the one before)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtspec.dflash import ARCHITECTURES, dspark, export, head, readme, serving
from trtspec.dflash.convert import check_build_config, check_convert_config, convert_drafter
from trtspec.draft_family import DraftFamily


class DFlashFamily(DraftFamily):
    name = "dflash"
    title = "DFlash block drafter"
    config_file = "dflash_config.json"
    head_file = head.HEAD_FILE
    shift_labels = False
    offline_key = "dflash_offline"
    module_attr = "dflash_module"
    no_launcher = frozenset({"speculators"})  # speculators converts EAGLE-3 heads only

    drafting = ("dflash",)
    sections = ("dflash",)
    architectures = ARCHITECTURES

    check_config = staticmethod(check_build_config)
    check_convert = staticmethod(check_convert_config)
    convert = staticmethod(convert_drafter)
    build = staticmethod(head.build_dflash_model)
    save_head = staticmethod(head.save_head)
    load_head = staticmethod(head.load_head)
    train_forward = staticmethod(head.train_forward)
    export_draft = staticmethod(export.export_dflash_draft)
    trtllm_spec = staticmethod(serving.trtllm_spec)
    sglang_script = staticmethod(serving.sglang_script)
    vllm_note = staticmethod(serving.vllm_note)
    write_readme = staticmethod(readme.write_dflash_readme)

    def state_layers(self, cfg: dict) -> list[int]:
        return cfg["dflash_architecture_config"]["target_layer_ids"]

    def drafts(self, model: Any, ids: Any, aux: Any, last: Any, k: int) -> Any:
        return head.block_drafts(model, ids[0], aux[0], k)[None]

    def check_export(self, cfg: Any) -> None:
        """Nothing beyond the config's own checks: DSpark's engine limits are read from the exported draft."""

    def engine_method(self, cfg: Any) -> str:
        """dspark for a DSpark draft (dflash.projector: dspark), which the engines serve apart from DFlash."""
        return "dspark" if cfg.dflash.projector == "dspark" else self.name

    def engines_refusing(self, info: dict) -> tuple[dict[str, list[str]], str | None]:
        """A DSpark draft: the engines serve some Markov heads and block lengths only (dspark.dspark_problems)."""
        if info.get("projector") != "dspark":
            return {}, None
        problems = dspark.dspark_problems(info)
        return problems, dspark.dspark_no_engine(problems)

    def load_drafter(self, draft_dir: Path, target: Any, weights: str = "auto", settings: Any = None) -> Any:
        from trtspec.dflash.runtime import load_dflash_drafter  # torch: imported when a drafter is loaded

        return load_dflash_drafter(draft_dir, target, weights=weights, settings=settings)


DFLASH = DFlashFamily()
