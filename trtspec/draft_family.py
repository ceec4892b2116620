"""What a draft family is: the interfaces the stages, the trainer, the engines and the runtime call, each the part of a
family its caller uses (TrainableDraft, ExportableDraft, RunnableDraft), and the whole (DraftFamily).

A family says which build-config sections are its own (a recipe naming another family's keys is refused by
trtspec.draft_families.check_recipe) and its own rules of them (check_config), how its draft is converted from the base
(Model Optimizer's mode and config), trained (forward on a batch, which target layers' states it reads, whether labels
are shifted), saved, measured (its greedy drafts from every position of a target answer, for the acceptance count),
exported (and its ONNX check logged), what each engine serves of it, and how trtspec's runtime loads it.

This module imports nothing of trtspec: the families (trtspec/eagle, trtspec/dflash, trtspec/dflash2) implement it,
and the trainer (trtspec.training, which knows no family) is typed with it. Which families there are is
trtspec.draft_families.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar, Protocol


class TrainableDraft(Protocol):
    """What the convert and train stages and the trainer (training.trainer) need of a family: its draft converted
    from the base, trained, measured and saved. The methods with bodies are shared."""

    name: ClassVar[str]  # draft.method
    title: ClassVar[str]  # how reports and logs name it
    config_file: ClassVar[str]  # the mtsp.convert config, in convert/ and train/
    head_file: ClassVar[str]  # the draft's weights in convert/ (head_init.safetensors) and train/
    shift_labels: ClassVar[bool]  # the loss scores position t against token t + 1 (EAGLE-3) or token t (DFlash, DSpark)
    offline_key: ClassVar[str]  # the config key saying the draft reads cached target states (Model Optimizer's name)
    module_attr: ClassVar[str]  # the converted model's attribute holding the draft's own network
    length_key: ClassVar[str | None] = None  # the config key draft.length trains (EAGLE-3's train-time-test steps)
    grows_vocab: ClassVar[bool] = False  # draft.grow_vocab: its draft vocabulary can take tokens on a warm start

    def check_convert(self, cfg: Any, model_config: Any) -> None:
        """The convert settings against the target, before any stage (one line per problem)."""

    def convert(self, base_config: Any, model_path: Path, cfg: Any, tokens: Path, log: Any) -> Any:
        """(draft config, converted model, metrics): mtsp.convert with this family's mode and config."""

    def build(self, base_model: Any, cfg: dict) -> Any:
        """The base with the draft attached (mtsp.convert), from a saved config."""

    def save_head(self, model: Any, path: Path) -> Any: ...

    def load_head(self, model: Any, path: Path) -> Any: ...

    def train_forward(self, model: Any, batch: dict, unwrapped: Any = None) -> Any:
        """The training forward on a batch: an output with .loss and .train_acc."""

    def state_layers(self, cfg: dict) -> list[int]:
        """The target layers whose outputs the draft reads."""

    def drafts(self, model: Any, ids: Any, aux: Any, last: Any, k: int) -> Any:
        """Greedy drafts of k tokens from every position: (ids [1,T], aux [1,T,A], last [1,T,H]) -> [1,T,k]."""

    def grow_vocab(self, folder: Path, counts: Any, n: int, log: Any) -> dict:
        """draft.grow_vocab: the `n` most frequent training labels (`counts`) the draft in `folder` (config_file,
        head_init.safetensors) cannot draft join its vocabulary; returns metrics."""
        raise NotImplementedError(self.name)

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


class ExportableDraft(Protocol):
    """What the export stage, the engines and deploy need of a family: its trained draft written for the engines
    and what each engine serves of it."""

    title: ClassVar[str]
    exports_onnx: ClassVar[bool] = False  # export_onnx writes the draft as ONNX, checked against PyTorch
    no_launcher: ClassVar[frozenset[str]] = frozenset()  # engines that load no draft of this family: no launcher
    drafting: ClassVar[tuple[str, ...]]  # `deploy --drafting` methods its bundle serves, besides suffix drafting alone
    no_engine: ClassVar[str | None] = None  # why no engine serves its drafts here (no launcher, no engine stage), or None

    def check_export(self, cfg: Any) -> None:
        """The export settings, before any stage."""

    def export_draft(self, base: Any, train_dir: Path, out: Path, dtype: Any, target_path: Path) -> Any:
        """The trained draft written for the engines -> deploy.bundle.ExportedDraft."""

    def export_onnx(self, draft_dir: Path, onnx_dir: Path) -> dict:
        """The draft as ONNX and the check against PyTorch (where exports_onnx)."""
        raise NotImplementedError(f"{self.title}: no ONNX export")

    def format_onnx_check(self, result: dict) -> str:
        """export_onnx's check as one line for the export stage's log (where exports_onnx)."""
        raise NotImplementedError(f"{self.title}: no ONNX export")

    def engine_method(self, cfg: Any) -> str:
        """The speculative method the engines serve this recipe's draft as (their support tables' key)."""
        return self.name

    def engines_refusing(self, info: dict) -> tuple[dict[str, list[str]], str | None]:
        """({engine: why it cannot serve this exported draft as trained}, why the bundle gets no launcher at all, or
        None), from the export's info and draft length (max_draft_len)."""
        return {}, None

    def trtllm_spec(self, cfg: Any, draft_rel: str, aux_layers: list[int] | None = None) -> dict:
        """TensorRT-LLM's speculative_config (LLM API) for this family's draft at `draft_rel`, the bundle's
        serving options (decoding_type and the family's fields)."""

    def sglang_script(self, decoding_type: str, tp: int, k: int) -> str:
        """snippets/sglang.sh: SGLang serving the draft, drafting k tokens a step."""

    def vllm_note(self, decoding_type: str) -> str:
        """Comment lines for snippets/vllm.sh (what vLLM cannot run of this draft), or ''."""
        return ""

    def write_readme(self, bundle: Path, cfg: Any, info: dict, metrics: dict) -> None:
        """bundle/README.md: what the draft is and how each engine serves it."""


class RunnableDraft(Protocol):
    """What trtspec's runtime needs of a family: its exported draft loaded beside the target."""

    architectures: ClassVar[tuple[str, ...]]  # what its exported draft's config.json names (the runtime's loader picks by it)

    def load_drafter(self, draft_dir: Path, target: Any, weights: str = "auto", settings: Any = None) -> Any:
        """The runtime's drafter for an exported draft, sharing the target's embedding and lm_head."""


class DraftFamily(TrainableDraft, ExportableDraft, RunnableDraft, Protocol):
    """A draft family, one object in its own package (trtspec/<package>/family.py): trainable, exportable and
    runnable, and the rules of its build-config sections. The stages, the trainer and the runtime reach a family
    through these interfaces only, each typed by the part it uses."""

    sections: ClassVar[tuple[str, ...]]  # the build config's sections it reads (set under another method: refused)

    def check_config(self, cfg: Any) -> None:
        """The build config's rules of this family beyond its sections (draft_families.check_recipe, before any stage;
        another family's options are refused there, by the sections each declares): ValueError naming the key."""
