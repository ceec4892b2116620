"""Post-training quantization of a base model with modelopt: the presets per format, checks a user can act on before
anything loads, calibration rows, what quantization costs (perplexity, teacher-forced agreement), and saving the
quantized state as the base's own checkpoint plus what changed, so it can be rebuilt anywhere the base loads.

Saved as:
  quant.json                {"format": ...} plus what was quantized
  modelopt_state.pt         mto.modelopt_state(model): which quantizers sit where, with their configs
  quant_tensors.safetensors every tensor that differs from the base checkpoint (quantizer amax/scales, and the
                            weights smoothquant/AWQ rescaled), so restore = base + state + these tensors
"""

from __future__ import annotations

import copy
import math
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtspec.errors import ArtifactError, ConfigError, DataError, MissingDependency

if TYPE_CHECKING:
    from trtspec.config import QuantizeSection

QUANT_JSON = "quant.json"


STATE_FILE = "modelopt_state.pt"


TENSORS_FILE = "quant_tensors.safetensors"


# format -> modelopt preset
PRESETS = {
    "fp8": "FP8_DEFAULT_CFG",
    "int8_sq": "INT8_SMOOTHQUANT_CFG",
    "int4_awq": "INT4_AWQ_CFG",
    "w4a8_awq": "W4A8_AWQ_BETA_CFG",
    "nvfp4": "NVFP4_DEFAULT_CFG",
}


BLOCK_FORMATS = ("int4_awq", "w4a8_awq")  # int4 weights in blocks along in_features


BLOCK_CHOICES = (128, 64, 32)  # largest first: fewer scales, what TensorRT-LLM's kernels prefer


NVFP4_BLOCK = 16


def quantized_linears(model: Any, quantize_lm_head: bool) -> dict[str, int]:
    """{module name: in_features} of the Linear layers the presets quantize (lm_head only when asked)."""
    from torch import nn

    return {
        name: m.in_features
        for name, m in model.named_modules()
        if isinstance(m, nn.Linear) and (quantize_lm_head or not name.endswith("lm_head"))
    }


def pick_block_size(in_features: dict[str, int], requested: int | None) -> int:
    """The int4 block size: `requested` if it divides every layer's in_features, else the largest of 128/64/32 that does."""
    choices = (requested,) if requested else BLOCK_CHOICES
    for block in choices:
        if all(width % block == 0 for width in in_features.values()):
            return block
    block = choices[-1]
    bad = [f"{name} ({width})" for name, width in in_features.items() if width % block]
    widths = sorted({w for w in in_features.values()})
    raise ConfigError(
        f"quantize.block_size {block}: {len(bad)} layer(s) have an in_features it does not divide: {', '.join(bad[:4])}"
        + (" ..." if len(bad) > 4 else ""),
        f"in_features here: {widths}; use a block size dividing all of them"
        + ("" if requested is None else " or leave quantize.block_size null to pick one")
        + ", or another format (fp8, int8_sq)",
    )


def block_size_for(q: QuantizeSection, layers: dict[str, int]) -> int | None:
    """The int4 block size of a block format (None for the others); nvfp4's fixed block is checked to divide too."""
    block = pick_block_size(layers, q.block_size) if q.format in BLOCK_FORMATS else None
    if q.format == "nvfp4":
        pick_block_size(layers, NVFP4_BLOCK)
    return block


def check_quant_config(q: QuantizeSection, model_config: Any = None) -> None:
    """Problems the user can fix, found before any model is loaded."""
    import torch

    if q.format == "nvfp4" and not torch.cuda.is_available():
        raise MissingDependency(
            "quantize.format nvfp4 needs a CUDA GPU, even to simulate (modelopt's FP4 kernels are CUDA-only)",
            "run on a GPU machine, or use fp8 / int8_sq / int4_awq / w4a8_awq on a CPU",
        )
    if q.block_size is not None and q.format not in BLOCK_FORMATS:
        raise ConfigError(
            f"quantize.block_size applies to {' and '.join(BLOCK_FORMATS)}, not to format '{q.format}'",
            "remove quantize.block_size",
        )
    tied = model_config is not None and getattr(model_config, "tie_word_embeddings", False)
    if q.quantize_lm_head and tied:
        raise ConfigError(
            "quantize.quantize_lm_head: this model's lm_head shares its weights with the embeddings, which stay unquantized",
            "set quantize.quantize_lm_head: false",
        )


def quant_config(fmt: str, kv_cache: str, block_size: int | None, quantize_lm_head: bool) -> dict:
    """The modelopt config: the preset for `fmt`, its int4 block size set, lm_head enabled on request, + fp8 KV cache."""
    import modelopt.torch.quantization as mtq

    cfg = copy.deepcopy(getattr(mtq, PRESETS[fmt]))
    entries = cfg["quant_cfg"]
    if block_size is not None:
        for entry in entries:
            if entry.get("quantizer_name") == "*weight_quantizer":
                for c in entry["cfg"] if isinstance(entry["cfg"], list) else [entry["cfg"]]:
                    if c.get("block_sizes") and c.get("num_bits") == 4:
                        c["block_sizes"][-1] = block_size
    if quantize_lm_head:
        cfg["quant_cfg"] = [e for e in entries if e.get("quantizer_name") != "*lm_head*"]
    if kv_cache == "fp8":
        cfg["quant_cfg"] = cfg["quant_cfg"] + copy.deepcopy(mtq.FP8_KV_CFG["quant_cfg"])
    return cfg


def token_rows(tokens_file: Path, limit: int | None = None, seed: int = 0) -> list[tuple[Any, Any]]:
    """[(input_ids [1, n], loss_mask [1, n])] from a data-stage tensor file, padding cut off; a seeded sample."""
    import torch

    if not tokens_file.is_file():
        raise ArtifactError(f"'{tokens_file}' is missing", "re-run the data stage")
    data = torch.load(tokens_file, weights_only=True)
    rows = []
    for ids, attn, mask in zip(data["input_ids"], data["attention_mask"], data["loss_mask"], strict=True):
        n = int(attn.sum())
        if n > 1:
            rows.append((ids[:n][None], mask[:n][None].bool()))
    if limit is not None and len(rows) > limit:
        rows = random.Random(seed).sample(rows, limit)
    return rows


def perplexity(model: Any, rows: list[tuple[Any, Any]]) -> float:
    """exp(mean NLL) over the label (answer) tokens of `rows`."""
    import torch

    nll, count = 0.0, 0
    device = next(model.parameters()).device
    with torch.no_grad():
        for ids, mask in rows:
            ids, mask = ids.to(device), mask.to(device)
            logits = model(ids).logits[:, :-1].float()
            lab = mask[:, 1:]
            loss = torch.nn.functional.cross_entropy(logits[lab], ids[:, 1:][lab], reduction="sum")
            nll, count = nll + float(loss), count + int(lab.sum())
    if count == 0:
        raise DataError("the held-out conversations have no answer tokens to measure perplexity on")
    return math.exp(nll / count)


def agreement(model: Any, prompts: list[list[int]], reference: list[list[int]]) -> float:
    """Teacher-forced top-1 agreement: share of reference tokens that `model` also predicts, given the same prefix.

    Unlike comparing free-running outputs, one early divergence does not hide how the rest agrees.
    """
    import torch

    same, total = 0, 0
    device = next(model.parameters()).device
    with torch.no_grad():
        for p, ref in zip(prompts, reference, strict=True):
            if not ref:
                continue
            pred = model(torch.tensor([p + ref], device=device)).logits[0, len(p) - 1 : -1].argmax(-1).cpu()
            same += int((pred == torch.tensor(ref)).sum())
            total += len(ref)
    return same / max(total, 1)


def compare_with_reference(model: Any, heldout: list[tuple[Any, Any]], prompts: list[list[int]],
                           reference: list[list[int]], greedy: Any) -> dict:
    """The quantized model against the unquantized one's greedy answers `reference` to `prompts`: perplexity on
    `heldout`, teacher-forced agreement, identical free-running outputs (greedy(model) answers the prompts) and
    the mean length of the prefix they share."""
    from trtspec.generation import common_prefix

    ppl = perplexity(model, heldout)
    agree = agreement(model, prompts, reference)
    outputs = greedy(model)
    return {
        "perplexity": ppl,
        "agreement": agree,
        "identical": sum(a == b for a, b in zip(outputs, reference, strict=True)),
        "prefix": sum(common_prefix(a, b) for a, b in zip(outputs, reference, strict=True)) / max(len(prompts), 1),
    }


def quant_info(q: QuantizeSection, block: int | None, layers: dict[str, int], model: Any) -> dict:
    """quant.json: the format and what was quantized, and the files that rebuild it."""
    return {
        "format": q.format,
        "kv_cache": q.kv_cache,
        "block_size": block,
        "modelopt_preset": PRESETS[q.format],
        "quantize_lm_head": q.quantize_lm_head,
        "quantized_layers": len(layers),
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "files": [STATE_FILE, TENSORS_FILE],
    }


def calibrate(model: Any, cfg: dict, calib: list[tuple[Any, Any]]) -> Any:
    """modelopt's fake-quantized model, its scales calibrated by running `calib` conversations through it."""
    import modelopt.torch.quantization as mtq
    import torch

    device = next(model.parameters()).device

    def forward_loop(m: Any) -> None:
        with torch.no_grad():
            for ids, _ in calib:
                m(ids.to(device))

    return mtq.quantize(model, cfg, forward_loop)


def save_and_check_restore(model: Any, base: Any, out: Path, ids: Any) -> tuple[int, float]:
    """Save the quantization state into `out`, rebuild it on a fresh `base` and compare logits on `ids`: a state
    that does not rebuild the model is an error here, not a surprise at export. -> (tensors saved, max logit diff)."""
    import torch

    saved = save_quantized(model, base, out)
    restored = restore_quantized(base, out)
    device = next(model.parameters()).device
    with torch.no_grad():
        diff = float((model(ids.to(device)).logits - restored(ids.to(device)).logits).abs().max())
    if diff > 1e-4:
        raise ArtifactError(f"the saved quantization state does not rebuild the quantized model (logits differ by {diff:.3g})")
    return saved, diff


def changed_tensors(model: Any, base: Any) -> dict[str, Any]:
    """Tensors of `model` that the base does not have or holds with other values."""
    import torch

    ref = base.state_dict()
    out = {}
    for key, value in model.state_dict().items():
        if key not in ref or ref[key].shape != value.shape or not torch.equal(ref[key], value):
            out[key] = value.detach().cpu().contiguous()
    return out


def save_quantized(model: Any, base: Any, out: Path) -> int:
    """Write modelopt_state.pt + quant_tensors.safetensors; returns how many tensors were saved."""
    import modelopt.torch.opt as mto
    import torch
    from safetensors.torch import save_file

    torch.save(mto.modelopt_state(model), out / STATE_FILE)
    tensors = changed_tensors(model, base)
    save_file(tensors, str(out / TENSORS_FILE))
    return len(tensors)


def read_quant_json(quant_dir: Path) -> dict:
    from trtspec.artifacts import read_json

    info = read_json(Path(quant_dir) / QUANT_JSON)
    if not isinstance(info, dict) or "format" not in info:
        raise ArtifactError(f"'{quant_dir}/{QUANT_JSON}' has no 'format'", "re-run the quantize stage")
    return info


def restore_quantized(base_model: Any, quant_dir: Path) -> Any:
    """The quantized model rebuilt from an unquantized base and quantize/ (returned; modelopt converts in place)."""
    import modelopt.torch.opt as mto
    import torch
    from safetensors.torch import load_file

    quant_dir = Path(quant_dir)
    for name in (STATE_FILE, TENSORS_FILE):
        if not (quant_dir / name).is_file():
            raise ArtifactError(f"'{quant_dir / name}' is missing", "re-run the quantize stage")
    state = torch.load(quant_dir / STATE_FILE, weights_only=False, map_location="cpu")
    model = mto.restore_from_modelopt_state(base_model, state)
    device = next(model.parameters()).device
    tensors = {k: v.to(device) for k, v in load_file(str(quant_dir / TENSORS_FILE)).items()}
    result = model.load_state_dict(tensors, strict=False)
    if result.unexpected_keys:
        raise ArtifactError(
            f"'{quant_dir}' does not fit this base model: unexpected tensors {result.unexpected_keys[:4]}",
            "the quantize stage ran on another model; re-run it",
        )
    return model.eval()


def fold_weights(model: Any) -> Any:
    """Fake-quantize the weights once (same numbers) instead of on every forward: evaluation without
    the per-forward weight quantization.

    For measuring only: the folded model can no longer be saved or exported as a quantized checkpoint. A module
    modelopt cannot fold (its GPT-OSS experts under transformers 5: a `down_proj_weight_quantizer` with no
    `down_proj_weight`) keeps quantizing its weights on every forward: the same numbers, slower (mtq.fold_weight, module
    by module)."""
    from modelopt.torch.quantization.nn import QuantModule

    for module in model.modules():
        if isinstance(module, QuantModule):
            try:
                module.fold_weight()
            except AssertionError:  # modelopt's check that each weight quantizer has its weight
                continue
    return model


def served_quantization(cfg: Any) -> tuple[Path, dict] | None:
    """model.train_on_quantized: (the earlier run's quantize folder, its manifest), checked: a finished run of this
    target, intact, quantized in a format this machine runs; None when the key is unset."""
    from trtspec.config import QuantizeSection
    from trtspec.warm_start import check_same_target, earlier_run, stage_of

    if not cfg.model.train_on_quantized:
        return None
    key = "model.train_on_quantized"
    run = earlier_run(cfg.resolve_path(cfg.model.train_on_quantized), key)
    check_same_target(run, cfg, key)
    folder, m = stage_of(run, "quantize", key)
    q = QuantizeSection(**(m.get("config") or {}).get("quantize", {}))
    if q.format == "none":
        raise ConfigError(f"{key}: '{run.path}' did not quantize its target (quantize.format: none)",
                          "name a run built with quantize.format fp8, int8_sq, int4_awq or nvfp4")
    try:
        check_quant_config(q)
    except (ConfigError, MissingDependency) as e:
        raise ConfigError(f"{key}: '{run.path}' quantized to {q.format}, which this machine cannot run: {e.message}",
                          e.hint) from None
    return folder, m


def as_served(model: Any, quant_dir: Path) -> Any:
    """The target with the quantize stage's quantization applied (fake-quantized weights folded once): what the
    draft meets when the quantized bundle serves. In the model's own dtype: the quantize stage's scales are float32,
    and a bf16 model answering (model.build_dtype) would mix the two in its matmuls."""
    dtype = next(model.parameters()).dtype
    return fold_weights(restore_quantized(model, quant_dir)).to(dtype)
