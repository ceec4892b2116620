"""The trained EAGLE-3 head as the engines load it: rebuilt on the *unquantized* base from train/, written by
modelopt's export_speculative_decoding (LlamaForCausalLMEagle3) with the engines' extra fields, and checked against
trtspec/eagle/checkpoint.py's key/shape table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtspec.deploy.bundle import ExportedDraft
from trtspec.deploy.compat import add_engine_fields
from trtspec.errors import ConfigError

if TYPE_CHECKING:
    from trtspec.config import BuildConfig


def check_export_config(cfg: BuildConfig) -> None:
    """The head is exported for engines that load one draft layer as trtspec trains it: refuse more, early."""
    if cfg.convert.num_layers != 1:
        raise ConfigError(
            f"convert.num_layers {cfg.convert.num_layers}: no engine loads such a draft as it is trained (TensorRT-LLM "
            "expects hidden_norm on every draft layer; SGLang and speculators load one layer)",
            "set convert.num_layers: 1, or stop before the export stage (--until train)",
        )


def load_eagle_config(train_dir: Path) -> dict:
    from trtspec.artifacts import read_json

    cfg = read_json(train_dir / "eagle_config.json")
    # modelopt 0.47 writes a yarn rope_scaling (factor 32) into the exported config unless this is empty: the head
    # was trained with the base's rope, and TensorRT-LLM / the PyTorch runtime must apply that same rope
    cfg["eagle_export_rope_scaling"] = {}
    return cfg


def build_draft_model(base: Any, train_dir: Path) -> Any:
    """The base with the trained EAGLE-3 head attached (trtspec.eagle.head), in eval mode."""
    from trtspec.eagle import head as eagle

    model = eagle.build_eagle_model(base, load_eagle_config(train_dir))
    eagle.load_head(model, train_dir / eagle.HEAD_FILE)
    return model.eval()


def export_draft(model: Any, out: Path, dtype: Any) -> None:
    """export_speculative_decoding with the head cast to `dtype`; config.json's torch_dtype says so."""
    from modelopt.torch.export import export_speculative_decoding

    model.eagle_module.to(dtype)  # floating tensors only: d2t stays int64
    # Model Optimizer's export refuses keys it does not know: EAGLE-3.1's norms go in after it (add_eagle31)
    fc_norm = model.eagle_module._modules.pop("fc_norm", None)
    try:
        export_speculative_decoding(model, export_dir=out)
    finally:
        if fc_norm is not None:
            model.eagle_module.fc_norm = fc_norm
    cfg_path = out / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["torch_dtype"] = str(dtype).removeprefix("torch.")
    add_eagle31(model, out, cfg)
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")
    add_engine_fields(out)


def add_eagle31(model: Any, out: Path, cfg: dict) -> None:
    """EAGLE-3.1's fields as vLLM's llama_eagle3 reads them: top-level `fc_norm` / `norm_output` in config.json, and the
    norms' weights (fc_norm.{i}.weight) in model.safetensors where Model Optimizer's export left them out."""
    from safetensors.torch import load_file, save_file

    eagle = model.eagle_module
    for key in ("fc_norm", "norm_output"):
        cfg[key] = bool(getattr(eagle.config, key, False))
    if not cfg["fc_norm"]:
        return
    weights = out / "model.safetensors"
    tensors = load_file(str(weights))
    dtype = eagle.fc.weight.dtype
    tensors.update({f"fc_norm.{i}.weight": norm.weight.detach().to(dtype).contiguous() for i, norm in enumerate(eagle.fc_norm)})
    save_file(tensors, str(weights), metadata={"format": "pt"})


def export_eagle3_draft(base: Any, train_dir: Path, out: Path, dtype: Any, target_path: Path) -> ExportedDraft:
    """The family's export: the head written to `out` and checked; the model is kept for the acceptance check
    with a quantized target, the tensor names for the engines' loaders."""
    from trtspec.eagle.checkpoint import check_draft_checkpoint

    model = build_draft_model(base, train_dir)
    export_draft(model, out, dtype)
    draft = check_draft_checkpoint(out, target_path)
    info = {"draft_dtype": draft["dtype"], "aux_layers": draft["aux_layers"],
            "draft_vocab_size": draft["draft_vocab_size"], "draft_params": draft["parameters"],
            **{key: draft[key] for key in ("fc_norm", "norm_output") if draft.get(key)}}
    return ExportedDraft(info, f"draft ({draft['dtype']})", model, draft["tensors"])

