"""DSpark (dflash.projector: dspark; Model Optimizer's DSparkExporter: a DFlash backbone and a low-rank Markov head)
as each engine reads it, the keys trtspec adds for them, and which engine serves which DSpark draft:

| engine | reads | runs |
|---|---|---|
| TensorRT-LLM main (`llmapi/llm_args.py` DSparkDecodingConfig and its validator @0004396; `_torch/models/modeling_dspark.py` GQADSparkForCausalLM @008b54f) | target layers, mask token, markov_rank, block_size from `dspark_config`, then `dflash_config`, then top-level `dspark_<key>`, then top-level `<key>`; head weights `markov_head.markov_w{1,2}` or `markov_w{1,2}` | a vanilla Markov head only; non-causal blocks only; block_size == max_draft_len |
| vLLM 0.32 (`qwen3_dspark.py`, `v1/worker/gpu/spec_decode/dspark/`) | `architectures` Qwen3DSparkModel; top-level `markov_rank`, `sample_from_anchor` (the anchor's row guesses the first token); `dflash_config.target_layer_ids` (+ 1) and `mask_token_id`; head weights `markov_head.markov_w{1,2}` only | a vanilla Markov head only (no gate_proj/joint_proj); a block of num_speculative_tokens rows; its V2 model runner only (a GPU with Triton: the CPU build refuses method dspark) |
| SGLang main (`srt/models/dspark.py` Qwen3DSparkModel @01f4762, `srt/arg_groups/speculative_hook.py` `_handle_dspark` @004c82e) | `architectures` Qwen3DSparkModel; top-level `markov_rank` and `markov_head_type`; gamma = `block_size` (`dflash_config`, then top level); the mask token and target layers as for DFlash; head weights `markov_head.*` only (flat names fall to the backbone loader) | vanilla, gated and rnn heads; non-causal blocks; `--speculative-algorithm DSPARK` with `--speculative-num-draft-tokens` = gamma + 1; CUDA or NPU only |
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DSPARK_ARCH = "Qwen3DSparkModel"  # vLLM's and SGLang's registry entry for a Qwen3-layered DSpark draft (modelopt's are)
# modelopt writes the Markov head flat (markov_w1/markov_w2, a gated head's gate_proj, an rnn head's joint_proj:
# DeepSpec's layout); vLLM's and SGLang's Qwen3DSparkModel load it only nested under markov_head (the published Nemotron
# DSpark drafts' layout), which TensorRT-LLM's GQADSparkForCausalLM and modelopt's own loader
# (remap_dspark_nested_head_keys) read too. SGLang would load a flat gate_proj into nothing, silently. The names are
# the runtime's (MARKOV_KEYS, NESTED_MARKOV below), which reads both layouts.
MARKOV_KEYS = ("markov_w1.", "markov_w2.", "gate_proj.", "joint_proj.")  # DSpark's head, beside the backbone's weights
NESTED_MARKOV = "markov_head."  # the same head as the engines name it (trtspec's export writes markov_head.markov_w1 ...)


def add_dspark_engine_fields(draft_dir: Any) -> None:
    """Complete a DSpark draft as modelopt's DSparkExporter wrote it for the engines above, keeping every key modelopt
    wrote: architectures [Qwen3DSparkModel, DFlashDraftModel] (vLLM and SGLang take the first they know, modelopt and
    trtspec read the second), top-level markov_rank / markov_head_type / sample_from_anchor (vLLM and SGLang read them
    there, TensorRT-LLM there or in dflash_config), and the Markov head's weights under the engines' names
    (NESTED_MARKOV + the flat name)."""
    from safetensors.torch import load_file, save_file


    draft_dir = Path(draft_dir)
    cfg_path, weights_path = draft_dir / "config.json", draft_dir / "model.safetensors"
    cfg = json.loads(cfg_path.read_text())
    dc = cfg["dflash_config"]
    cfg["architectures"] = [DSPARK_ARCH, *[a for a in cfg.get("architectures") or [] if a != DSPARK_ARCH]]
    cfg.update(markov_rank=dc["markov_rank"], markov_head_type=dc["markov_head_type"],
               sample_from_anchor=bool(dc.get("shift_label", True)))  # DSpark's row 0 (the anchor's) guesses the next token
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")
    tensors = load_file(str(weights_path))
    renamed = {NESTED_MARKOV + k if k.startswith(MARKOV_KEYS) else k: v for k, v in tensors.items()}
    save_file(renamed, str(weights_path), metadata={"format": "pt"})


def dspark_problems(info: dict) -> dict[str, list[str]]:
    """{engine: why it cannot serve this DSpark draft as trained}, for the engines that cannot, from the export's
    info: markov_head, causal, block_size and max_draft_len (the chain verified per step)."""
    head, k, block = info["markov_head"], info["max_draft_len"], info["block_size"]
    out: dict[str, list[str]] = {"TensorRT-LLM": [], "vLLM": [], "SGLang": []}
    if head != "vanilla":
        out["TensorRT-LLM"].append(f"its DSpark drafter runs only a vanilla Markov head, this one is {head}")
        out["vLLM"].append(f"its Qwen3DSparkModel builds only a vanilla Markov head, this one is {head}")
    if info.get("causal"):
        out["TensorRT-LLM"].append("its DSpark block decode is non-causal only, this draft's blocks are causal")
        out["SGLang"].append("its DSpark block attends non-causally (DFlashAttention, ENCODER_ONLY), this draft's blocks are causal")
    if k != block:
        out["TensorRT-LLM"].append(f"DSparkDecodingConfig needs max_draft_len == block_size, here {k} != {block}")
        out["vLLM"].append(f"it drafts from a block of num_speculative_tokens = {k} rows, the draft was trained on {block}")
        out["SGLang"].append(f"DSPARK drafts gamma = block_size = {block} tokens a step, the bundle's chain is {k}")
    return {engine: why for engine, why in out.items() if why}


def dspark_no_engine(problems: dict[str, list[str]]) -> str | None:
    """Why the bundle gets no engine launcher at all (TensorRT-LLM, whose options, serve.sh and Triton repository
    the bundle is built around, cannot serve it), or None; `problems` as dspark_problems returns them."""
    if not problems.get("TensorRT-LLM"):
        return None
    why = "; ".join(f"{engine}: {', '.join(p)}" for engine, p in problems.items())
    return f"the bundle has no engine launcher for this DSpark draft ({why}); trtspec's runtime serves it (validate)"
