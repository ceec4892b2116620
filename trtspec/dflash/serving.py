"""How the engines serve a DFlash or DSpark block draft: TensorRT-LLM's speculative_config, vLLM's method and SGLang's
launch script (the engines read the mask token, target layers and block from the draft's config.json)."""

from __future__ import annotations

from typing import Any

from trtspec.engines import sglang

VLLM_DSPARK_NOTE = ("# DSpark: vLLM runs method dspark in its V2 model runner only, which needs Triton and a GPU; its CPU build\n"
                    "# refuses it ('Model Runner V1 does not support: dspark speculative decoding').\n")

SGLANG_DFLASH_SH = """\
#!/usr/bin/env bash
# SGLang with this DFlash draft (pip install "sglang[all]"): --speculative-num-draft-tokens counts the block's anchor
# too (drafts verified per step + 1). Mask token and target layers: draft/config.json's dflash_config.
set -euo pipefail
cd "$(dirname "$0")/.."
{launch}"""

SGLANG_DSPARK_SH = """\
#!/usr/bin/env bash
# SGLang with this DSpark draft (pip install "sglang[all]" from a release whose sglang/srt/models/dspark.py exists;
# DSPARK runs on CUDA or NPU). It drafts gamma = the draft's block_size tokens a step and verifies gamma + 1.
# Mask token, target layers and block size: draft/config.json's dflash_config; markov_rank, markov_head_type and
# architectures (Qwen3DSparkModel): its top level; the head's weights: markov_head.*.
set -euo pipefail
cd "$(dirname "$0")/.."
python -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('sglang.srt.models.dspark') is None)" ||
  {{ echo "this sglang has no DSpark draft model (sglang/srt/models/dspark.py): install a newer sglang" >&2; exit 1; }}
{launch}"""


def sglang_script(decoding_type: str, tp: int, k: int) -> str:
    script = SGLANG_DSPARK_SH if decoding_type == "DSpark" else SGLANG_DFLASH_SH
    return script.format(launch=sglang.launch_command(decoding_type, tp, k))


def vllm_note(decoding_type: str) -> str:
    return VLLM_DSPARK_NOTE if decoding_type == "DSpark" else ""


def trtllm_spec(cfg: Any, draft_rel: str, aux_layers: list[int] | None = None) -> dict[str, Any]:
    """TensorRT-LLM's DFlashDecodingConfig, or DSparkDecodingConfig for dflash.projector dspark: their other fields
    are left unset, so TensorRT-LLM reads the mask token and target layers (DSpark: also block_size, markov_rank,
    markov_head_type) from the draft's config.json."""
    kind = "DSpark" if cfg.dflash.projector == "dspark" else "DFlash"
    return {"decoding_type": kind, "max_draft_len": cfg.draft.length, "speculative_model": draft_rel}
