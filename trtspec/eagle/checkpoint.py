"""What an exported EAGLE-3 draft checkpoint must hold, as a table, and the check that reads it.

The draft folder is what TensorRT-LLM (and vLLM, SGLang) load next to the target: config.json with
architectures ["LlamaForCausalLMEagle3"], draft_vocab_size and eagle_config.eagle_aux_hidden_state_layer_ids,
and model.safetensors with the keys below. Shapes are written in the draft config's symbols:

    H  hidden_size           A  number of aux layers (fc reads cat(aux_1..aux_A): A*H wide)   V  vocab_size
    Q  num_attention_heads * head_dim      KV  num_key_value_heads * head_dim
    I  intermediate_size     DV draft_vocab_size     IN  layer input width (2H for layer 0: cat(embeds, h))

`check_draft_checkpoint` lists every problem at once in one ArtifactError.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trtspec.errors import ArtifactError

DRAFT_ARCH = "LlamaForCausalLMEagle3"

# (key, shape, required) — `{i}` is a draft layer index; keys without it occur once
DRAFT_KEYS: tuple[tuple[str, tuple[str, ...], bool], ...] = (
    ("fc.weight", ("H", "A*H"), True),
    ("layers.{i}.hidden_norm.weight", ("H",), True),  # layer 0 only (see FIRST_LAYER_ONLY)
    ("layers.{i}.input_layernorm.weight", ("H",), True),
    ("layers.{i}.self_attn.q_proj.weight", ("Q", "IN"), True),
    ("layers.{i}.self_attn.k_proj.weight", ("KV", "IN"), True),
    ("layers.{i}.self_attn.v_proj.weight", ("KV", "IN"), True),
    ("layers.{i}.self_attn.o_proj.weight", ("H", "Q"), True),
    ("layers.{i}.self_attn.q_proj.bias", ("Q",), False),
    ("layers.{i}.self_attn.k_proj.bias", ("KV",), False),
    ("layers.{i}.self_attn.v_proj.bias", ("KV",), False),
    ("layers.{i}.self_attn.o_proj.bias", ("H",), False),
    ("layers.{i}.post_attention_layernorm.weight", ("H",), True),
    ("layers.{i}.mlp.gate_proj.weight", ("I", "H"), True),
    ("layers.{i}.mlp.up_proj.weight", ("I", "H"), True),
    ("layers.{i}.mlp.down_proj.weight", ("H", "I"), True),
    ("norm.weight", ("H",), True),
    ("lm_head.weight", ("DV", "H"), False),  # absent: the runtime takes the target's (then DV must equal V)
    ("d2t", ("DV",), False),  # required when DV < V: draft id i -> target id i + d2t[i]
    ("t2d", ("V",), False),  # bool, True at the target ids d2t reaches (speculators keeps d2t only with it)
)
FIRST_LAYER_ONLY = ("hidden_norm",)
VOCAB_MAPS = ("d2t", "t2d")  # integer/bool index tables, not weights: no dtype or parameter count of their own
SHAPE_KEYS = ("hidden_size", "num_attention_heads", "intermediate_size", "vocab_size")


def _dims(cfg: dict) -> dict[str, int]:
    heads = int(cfg["num_attention_heads"])
    head_dim = int(cfg.get("head_dim") or cfg["hidden_size"] // heads)
    aux = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids") or []
    return {
        "H": int(cfg["hidden_size"]),
        "V": int(cfg["vocab_size"]),
        "A": len(aux),
        "Q": heads * head_dim,
        "KV": int(cfg.get("num_key_value_heads") or heads) * head_dim,
        "I": int(cfg["intermediate_size"]),
        "DV": int(cfg.get("draft_vocab_size") or cfg["vocab_size"]),
    }


def _shape(spec: tuple[str, ...], dims: dict[str, int]) -> tuple[int, ...]:
    out = []
    for term in spec:
        n = 1
        for sym in term.split("*"):
            n *= dims[sym]
        out.append(n)
    return tuple(out)


def expected_keys(cfg: dict) -> dict[str, tuple[tuple[int, ...], bool]]:
    """{key: (shape, required)} for a draft config (the table above, layers expanded)."""
    dims = _dims(cfg)
    layers = int(cfg.get("num_hidden_layers", 1))
    out = {}
    for key, spec, required in DRAFT_KEYS:
        if "{i}" not in key:
            out[key] = (_shape(spec, dims), required)
            continue
        for i in range(layers):
            if i > 0 and any(name in key for name in FIRST_LAYER_ONLY):
                continue
            layer_dims = {**dims, "IN": 2 * dims["H"] if i == 0 else dims["H"]}
            # layers after the first normally have input_layernorm too; tolerate its absence
            out[key.format(i=i)] = (_shape(spec, layer_dims), required and (i == 0 or "input_layernorm" not in key))
    if cfg.get("fc_norm"):  # EAGLE-3.1: an RMSNorm per aux hidden state before fc
        out.update({f"fc_norm.{j}.weight": ((dims["H"],), True) for j in range(dims["A"])})
    return out


def _target_dict(target_config: Any) -> dict:
    if isinstance(target_config, dict):
        return target_config
    if isinstance(target_config, (str, Path)):
        p = Path(target_config)
        return json.loads((p / "config.json" if p.is_dir() else p).read_text())
    return target_config.to_dict()


def _config_problems(cfg: dict, target: dict) -> list[str]:
    problems = []
    if DRAFT_ARCH not in (cfg.get("architectures") or []) and "draft_vocab_size" not in cfg:
        problems.append(f"config.json: architectures {cfg.get('architectures')} lacks {DRAFT_ARCH}")
    for key in (*SHAPE_KEYS, "draft_vocab_size"):
        if key not in cfg:
            problems.append(f"config.json: missing '{key}'")
    aux = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if not aux:
        problems.append("config.json: missing eagle_config.eagle_aux_hidden_state_layer_ids")
    text = target.get("text_config") or target
    if text:
        for key in ("hidden_size", "vocab_size"):
            if key in cfg and key in text and cfg[key] != text[key]:
                problems.append(f"config.json: {key} {cfg[key]} != target's {text[key]}")
        layers = text.get("num_hidden_layers")
        bad = [i for i in aux or [] if layers is not None and not 0 <= i < layers]
        if bad:
            problems.append(f"config.json: aux layer ids {bad} are outside the target's {layers} layers")
    if cfg.get("draft_vocab_size", 0) > cfg.get("vocab_size", 1 << 62):
        problems.append(f"config.json: draft_vocab_size {cfg['draft_vocab_size']} > vocab_size {cfg['vocab_size']}")
    return problems


def _tensor_problems(cfg: dict, tensors: dict) -> list[str]:
    import torch

    want = expected_keys(cfg)
    problems = []
    for key, (shape, required) in want.items():
        if key not in tensors:
            if required:
                problems.append(f"missing required tensor '{key}' {list(shape)}")
        elif tuple(tensors[key].shape) != shape:
            problems.append(f"'{key}' has shape {list(tensors[key].shape)}, expected {list(shape)}")
    problems += [f"unexpected tensor '{k}'" for k in sorted(set(tensors) - set(want))]
    vocab, draft_vocab = int(cfg.get("vocab_size", 0)), _dims(cfg)["DV"]
    d2t = tensors.get("d2t")
    if draft_vocab < vocab and d2t is None:
        problems.append(f"missing 'd2t': the draft vocab ({draft_vocab}) is smaller than the target's ({vocab})")
    d2t_ok = False  # a d2t that maps every draft id into the target vocab
    if d2t is not None and tuple(d2t.shape) == (draft_vocab,):
        if d2t.dtype not in (torch.int64, torch.int32):
            problems.append(f"'d2t' has dtype {d2t.dtype}, expected an integer type")
        else:
            target_ids = d2t.long() + torch.arange(draft_vocab)
            d2t_ok = bool(target_ids.min() >= 0 and target_ids.max() < vocab)
            if not d2t_ok:
                problems.append(f"'d2t' maps draft ids outside the target vocab [0, {vocab})")
    t2d = tensors.get("t2d")
    if t2d is not None and d2t_ok and tuple(t2d.shape) == (vocab,):
        from trtspec.deploy.compat import t2d_from_d2t

        if t2d.dtype != torch.bool or not torch.equal(t2d, t2d_from_d2t(d2t, vocab)):
            problems.append("'t2d' is not the bool mask of the target ids d2t maps to")
    if "lm_head.weight" not in tensors and draft_vocab != vocab:
        problems.append("no 'lm_head.weight' although the draft vocab differs from the target's (the target's cannot be used)")
    dtypes = {str(t.dtype).removeprefix("torch.") for k, t in tensors.items() if k not in VOCAB_MAPS}
    if len(dtypes) > 1:
        problems.append(f"weights have mixed dtypes {sorted(dtypes)}")
    return problems


def check_draft_checkpoint(draft_dir: str | Path, target_config: Any = None) -> dict:
    """Check an EAGLE-3 draft folder against the table (and the target's config: dict, folder, or HF config).

    Returns a summary {dtype, hidden_size, draft_vocab_size, vocab_size, aux_layers, num_layers, parameters};
    raises one ArtifactError listing every problem.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    draft_dir = Path(draft_dir)
    cfg_path, weights_path = draft_dir / "config.json", draft_dir / "model.safetensors"
    problems = [f"{p.name} is missing" for p in (cfg_path, weights_path) if not p.is_file()]
    if problems:
        raise ArtifactError(f"draft checkpoint '{draft_dir}': " + "; ".join(problems), "re-run the export stage")
    try:
        cfg = json.loads(cfg_path.read_text())
        tensors = load_file(str(weights_path))
    except (json.JSONDecodeError, SafetensorError, OSError) as e:
        raise ArtifactError(f"draft checkpoint '{draft_dir}' is unreadable: {e}", "re-run the export stage") from None
    problems = _config_problems(cfg, _target_dict(target_config) if target_config is not None else {})
    if all(k in cfg for k in SHAPE_KEYS):  # shapes cannot be checked without these
        problems += _tensor_problems(cfg, tensors)
    if problems:
        raise ArtifactError(
            f"draft checkpoint '{draft_dir}' does not match the EAGLE-3 layout ({len(problems)} problem(s)): "
            + "; ".join(problems),
            "re-export it with `trtspec build ... --from export`",
        )
    dtypes = sorted({str(t.dtype).removeprefix("torch.") for k, t in tensors.items() if k not in VOCAB_MAPS})
    return {
        "dtype": dtypes[0],
        "hidden_size": cfg["hidden_size"],
        "vocab_size": cfg["vocab_size"],
        "draft_vocab_size": cfg["draft_vocab_size"],
        "aux_layers": list(cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]),
        "num_layers": int(cfg.get("num_hidden_layers", 1)),
        "parameters": sum(t.numel() for k, t in tensors.items() if k not in VOCAB_MAPS),
        "tensors": sorted(tensors),
        "fc_norm": bool(cfg.get("fc_norm")),  # EAGLE-3.1's switches, as vLLM reads them
        "norm_output": bool(cfg.get("norm_output")),
    }

