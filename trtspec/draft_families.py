"""The draft-model families trtspec trains and ships, behind one interface the stages call (draft.method).

A family says which build-config options are its own (check_config, run when the config is read), how its draft is
converted from the base (Model Optimizer's mode and config), trained (forward on a batch, which target layers' states
it reads, whether labels are shifted), saved, measured (its greedy drafts from every position of a target answer, for
the acceptance count), exported (and its ONNX check logged) and loaded by the runtime.

    eagle3   EAGLE-3 head: one token per pass, chained k times           trtspec.eagle.family.EAGLE3
    dflash   DFlash block drafter: block_size - 1 tokens in one pass      trtspec.dflash.family.DFLASH
             (dflash.projector: dspark: DSpark, block_size tokens, each biased by a Markov head from the one before)

A family is one package of what is its own. What every family shares is trtspec.training, which knows no family (it
imports neither trtspec.eagle nor trtspec.dflash: what it needs of one comes in through DraftFamily): the HF Trainer
(training.trainer), the frozen target's states (training.states), FSDP for the draft (training.sharding) and the
acceptance measure (training.acceptance). The bundle's own checks are trtspec.deploy's (deploy.bundle.check_bundle).

This module imports nothing of trtspec (family() imports a family's module by name when first asked for), so the
config, imported before anything else, checks a recipe through it without an import cycle; the runtime's loader of
an exported draft, by the architecture it declares, is runtime.draft_loader.load_drafter.
"""

from __future__ import annotations

import importlib
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
    vllm_methods: ClassVar[dict[str, str]]  # TensorRT-LLM decoding_type serving this family's draft -> vLLM's method
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
        """The build config's rules of this family, from BuildConfig's validator before anything runs: options of
        another family are refused, naming the key (ValueError, as every config check raises)."""


# draft.method -> the module and object of its family (imported when first asked for)
DRAFT_FAMILIES: dict[str, str] = {
    "eagle3": "trtspec.eagle.family:EAGLE3",
    "dflash": "trtspec.dflash.family:DFLASH",
    "dflash2": "trtspec.dflash2.family:DFLASH2",
}


def check_sections(cfg: Any) -> None:
    """A section another draft family reads, set (to other than its default) while draft.method is this one: refused,
    naming the first key (BuildConfig's validator, after the family's own rules)."""
    own = family(cfg.draft.method).sections
    for method in DRAFT_FAMILIES:
        for name in (s for s in family(method).sections if s not in own):
            section = getattr(cfg, name)
            defaults = type(section).model_fields
            if keys := sorted(k for k in section.model_fields_set if getattr(section, k) != defaults[k].default):
                raise ValueError(f"{name}.{keys[0]} is a {family(method).title} option, but draft.method is "
                                 f"{cfg.draft.method} (set draft.method: {method}, or drop the {name} section)")


def served_family(spec: dict) -> DraftFamily:
    """The draft family a bundle's LLM-API speculative_config serves (DraftFamily.vllm_methods' keys)."""
    from trtspec.errors import ArtifactError

    kind = spec.get("decoding_type")
    for method in DRAFT_FAMILIES:
        if kind in (fam := family(method)).vllm_methods:
            return fam
    raise ArtifactError(f"the bundle's speculative_config serves decoding_type {kind}, which no draft family of trtspec "
                        "serves", "export the bundle again with this trtspec")


def family(method: str) -> DraftFamily:
    """The family of draft.method."""
    module, name = DRAFT_FAMILIES[method].split(":")
    return getattr(importlib.import_module(module), name)
