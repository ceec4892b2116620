"""The draft-model families trtspec trains and ships, behind one interface the stages call (draft.method).

A family says how its draft is converted from the base (Model Optimizer's mode and config), trained (forward on a
batch, which target layers' states it reads, whether labels are shifted), saved, measured (its greedy drafts from
every position of a target answer, for the acceptance count), exported and loaded by the runtime.

    eagle3   EAGLE-3 head: one token per pass, chained k times           trtspec.eagle
    dflash   DFlash block drafter: block_size - 1 tokens in one pass      trtspec.dflash
             (dflash.projector: dspark: DSpark, block_size tokens, each biased by a Markov head from the one before)

A family is one package of what is its own. What every family shares is trtspec.training, which knows no family (it
imports neither trtspec.eagle nor trtspec.dflash: what it needs of one comes in through DraftFamily): the HF Trainer
(training.trainer), the frozen target's states (training.states), FSDP for the draft (training.sharding) and the
acceptance measure (training.acceptance). The bundle's own checks are trtspec.deploy's (deploy.bundle.check_bundle).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class DraftFamily:
    name: str
    title: str  # how reports and logs name it
    config_file: str  # the mtsp.convert config, in convert/ and train/
    head_file: str  # the draft's weights in convert/ (head_init.safetensors) and train/
    build: Callable[[Any, dict], Any]  # (base model, config) -> the base with the draft attached (mtsp.convert)
    save_head: Callable[[Any, Path], Any]
    load_head: Callable[[Any, Path], Any]
    train_forward: Callable[..., Any]  # (model, batch, unwrapped model) -> output with .loss and .train_acc
    state_layers: Callable[[dict], list[int]]  # the target layers whose outputs the draft reads
    drafts: Callable[[Any, Any, Any, Any, int], Any]  # (model, ids [1,T], aux [1,T,A], last [1,T,H], k) -> [1,T,k]
    shift_labels: bool  # the loss mask scores position t against token t + 1 (EAGLE-3) or token t itself (DFlash, DSpark)
    offline_key: str  # the config key saying the draft reads cached target states (Model Optimizer's name)
    module_attr: str  # the converted model's attribute holding the draft's own network (eagle_module, dflash_module)
    check_convert: Callable[[Any, Any], None]  # (build config, model config): the convert settings, before any stage
    convert: Callable[..., Any]  # (base config, model path, build config, train_tokens.pt, log) -> (config, model, metrics)
    export_draft: Callable[..., Any]  # (base, train dir, out dir, dtype, target path) -> deploy.bundle.ExportedDraft
    write_readme: Callable[[Path, Any, dict, dict], None]  # (bundle, build config, info, metrics): bundle/README.md
    length_key: str | None = None  # the config key draft.length trains (EAGLE-3's train-time-test steps), if any
    export_onnx: Callable[[Path, Path], dict] | None = None  # (draft dir, onnx dir) -> the check against PyTorch
    check_export: Callable[[Any], None] | None = None  # (build config): export settings, before any stage
    no_launcher: frozenset[str] = frozenset()  # engines that load no draft of this family: the bundle has no launcher

    def module(self, model: Any) -> Any:
        """The draft's own network inside the converted model."""
        return getattr(model, self.module_attr)

    def read_config(self, folder: Path) -> dict:
        return json.loads((Path(folder) / self.config_file).read_text())

    def write_config(self, folder: Path, cfg: dict) -> None:
        (Path(folder) / self.config_file).write_text(json.dumps(cfg, indent=2) + "\n")

    def set_offline(self, cfg: dict, offline: bool) -> None:
        """Offline: the draft reads cached target states and Model Optimizer drops the target's decoder layers."""
        cfg[self.offline_key] = offline

    def set_length(self, cfg: dict, k: int) -> None:
        """Train for drafts of k tokens where the draft's loss depends on it (EAGLE-3: chains as long as the
        engines will draft); a block drafter's block is fixed at convert."""
        if self.length_key:
            cfg[self.length_key] = k


def _eagle3() -> DraftFamily:
    from trtspec.eagle import convert, head
    from trtspec.eagle.export import check_export_config, export_eagle3_draft
    from trtspec.eagle.onnx_export import export_onnx
    from trtspec.eagle.readme import write_eagle3_readme
    from trtspec.eagle.train_step import head_forward

    return DraftFamily(
        name="eagle3", title="EAGLE-3 head", config_file="eagle_config.json", head_file=head.HEAD_FILE,
        build=head.build_eagle_model, save_head=head.save_head, load_head=head.load_head, train_forward=head_forward,
        state_layers=lambda cfg: cfg["eagle_architecture_config"]["eagle_aux_hidden_state_layer_ids"],
        drafts=head.chain_drafts, shift_labels=True, offline_key="eagle_offline", module_attr="eagle_module",
        check_convert=convert.check_convert_config, convert=convert.convert_head, export_draft=export_eagle3_draft, write_readme=write_eagle3_readme,
        length_key="eagle_ttt_steps", export_onnx=export_onnx, check_export=check_export_config,
    )


def _dflash() -> DraftFamily:
    from trtspec.dflash import convert, head
    from trtspec.dflash.export import export_dflash_draft
    from trtspec.dflash.readme import write_dflash_readme

    def drafts(model: Any, ids: Any, aux: Any, last: Any, k: int) -> Any:
        return head.block_drafts(model, ids[0], aux[0], k)[None]

    return DraftFamily(
        name="dflash", title="DFlash block drafter", config_file="dflash_config.json", head_file=head.HEAD_FILE,
        build=head.build_dflash_model, save_head=head.save_head, load_head=head.load_head, train_forward=head.train_forward,
        state_layers=lambda cfg: cfg["dflash_architecture_config"]["target_layer_ids"],
        drafts=drafts, shift_labels=False, offline_key="dflash_offline", module_attr="dflash_module",
        check_convert=convert.check_convert_config, convert=convert.convert_drafter, export_draft=export_dflash_draft, write_readme=write_dflash_readme,
        no_launcher=frozenset({"speculators"}),
    )


FAMILIES: dict[str, Callable[[], DraftFamily]] = {"eagle3": _eagle3, "dflash": _dflash}


def family(method: str) -> DraftFamily:
    """The family of draft.method."""
    return FAMILIES[method]()


def load_drafter(draft_dir: Path, target: Any, weights: str = "auto", settings: Any = None) -> Any:
    """The runtime drafter for an exported draft (EAGLE-3 or DFlash), sharing the target's embedding and lm_head.
    weights: how the draft's product weights are stored, auto (bfloat16 where timed faster) | float32 | bfloat16;
    settings: runtime.settings.RuntimeSettings (default: as the target runs)."""
    from trtspec.runtime.families import draft_family

    if draft_family(draft_dir) == "dflash":
        from trtspec.runtime.dflash import load_dflash_drafter

        return load_dflash_drafter(draft_dir, target, weights=weights, settings=settings)
    from trtspec.runtime.drafters import load_eagle3_drafter

    return load_eagle3_drafter(draft_dir, target, weights=weights, settings=settings)
