"""How the engines serve an EAGLE-3 head: TensorRT-LLM's speculative_config and SGLang's launch script (vLLM takes
method eagle3 and reads the rest from the draft's config.json)."""

from __future__ import annotations

from typing import Any

from trtspec.engines import sglang

SGLANG_EAGLE3_SH = """\
#!/usr/bin/env bash
# SGLang loading the same EAGLE-3 draft (pip install "sglang[all]>={sglang_min}"). Run from anywhere.
# SGLang {sglang_min}+ loads the draft's layers.0.* weights; 0.4.10-0.5.11 read only midlayer.* and skip the rest
# silently, so older releases are refused here. Aux layers: draft/config.json's eagle_config (trtspec's numbering).
set -euo pipefail
cd "$(dirname "$0")/.."
python - <<'PY'
import sys
from importlib.metadata import version
from packaging.version import Version
v = version("sglang")
if Version(v) < Version("{sglang_min}"):
    sys.exit(f"sglang {{v}} cannot load this draft's layers.0.* weights: install sglang>={sglang_min}")
PY
{launch}"""


def sglang_script(decoding_type: str, tp: int, k: int) -> str:
    return SGLANG_EAGLE3_SH.format(launch=sglang.launch_command(decoding_type, tp, k), sglang_min=sglang.SGLANG_MIN)


def trtllm_spec(cfg: Any, draft_rel: str, aux_layers: list[int] | None = None) -> dict[str, Any]:
    """TensorRT-LLM's Eagle3DecodingConfig for the head. `aux_layers`: the target layers it was trained on;
    TensorRT-LLM reads them from here only (never from the draft's config.json) and numbers them as trtspec does;
    without them it captures its default layers."""
    from trtspec.draft_schedule import with_schedule_trtllm

    s, d = cfg.serve, cfg.draft
    spec = {
        "decoding_type": "Eagle3",
        "max_draft_len": d.length,
        "speculative_model": draft_rel,
        "eagle3_one_model": True,  # target and head in one engine: TensorRT-LLM's recommended EAGLE-3 mode
    }
    if aux_layers is not None:
        spec["eagle3_layers_to_capture"] = sorted(aux_layers)
    if d.suffix_len and d.shape != "dynamic_tree":
        # SAEnhancerConfig: a suffix match of >= threshold tokens overrides the head's draft (one-model, linear
        # EAGLE-3 only: TensorRT-LLM wires no suffix automaton into its dynamic-tree path)
        spec["sa_config"] = {"threshold": d.suffix_min_match}
    if s.draft_len_schedule:  # the draft length per batch size (trtspec.draft_schedule)
        spec = with_schedule_trtllm(spec, s.draft_len_schedule, s.max_batch_size)
    if d.shape == "dynamic_tree":
        # EAGLE-2 style tree: top-K expansions per draft layer, at most max_total_draft_tokens nodes
        # (TensorRT-LLM checks max_draft_len <= max_total_draft_tokens <= topK * max_draft_len)
        spec["use_dynamic_tree"] = True
        spec["dynamic_tree_max_topK"] = d.tree_topk
        spec["max_total_draft_tokens"] = max(d.length, min(d.tree_total_tokens, d.tree_topk * d.length))
    return spec
