"""The README of a bundle with a DFlash (or DSpark) draft: its folders and where every engine reads the draft's
settings."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from trtspec.deploy.bundle import built_with, family_lines, source_name
from trtspec.dflash.head import draft_name

if TYPE_CHECKING:
    from trtspec.config import BuildConfig


def write_dflash_readme(bundle: Path, cfg: BuildConfig, info: dict, metrics: dict) -> None:
    """README.md of a bundle with a DFlash (or DSpark) draft: its folders and where every engine reads the draft's settings."""
    source = source_name(cfg)
    dspark = info.get("projector") == "dspark"
    name = draft_name(info.get("projector", "dflash"), info.get("markov_head"), info.get("markov_rank"))
    lines = [
        "# trtspec deployment bundle",
        "",
        f"Target `{source}` ({info['quant_format']}, {info['target_dtype']}) with a {name} block drafter "
        f"({info['draft_params'] / 1e6:.1f}M parameters, {info['draft_dtype']}, block {info['block_size']}, target layers "
        f"{info['target_layers']}, mask token {info['mask_token_id']}); {info['max_draft_len']} drafts verified per step.",
        "",
        "| folder | what |",
        "|---|---|",
        "| `target/` | the target, HF format |",
        f"| `draft/` | the {name.split()[0]} draft (`{'Qwen3DSparkModel`, `' if dspark else ''}DFlashDraftModel`, Model Optimizer's "
        "export): embedding and lm_head are the target's |",
        *serving_lines(dspark, metrics),
        "",
        *family_lines(bundle / "target", cfg.model.chat_template_kwargs, cfg.model.chat_template),
        *built_with(),
    ]
    (bundle / "README.md").write_text("\n".join(lines), encoding="utf-8")


def serving_lines(dspark: bool, metrics: dict) -> list[str]:
    """A block drafter's README rows for its serving files and where the engines read the draft's settings."""
    if metrics.get("no_engine"):
        return ["", metrics["no_engine"] + "."]
    if not dspark:
        return ["| `llm_api_options.yaml` | TensorRT-LLM LLM-API options (`decoding_type: DFlash`, speculative_config points at `./draft`) |",
                "| `serve.sh`, `triton/`, `snippets/` | trtllm-serve, Triton, vLLM (`method: dflash`) and SGLang (`DFLASH`) launchers |",
                "",
                "Every engine reads the mask token and the target layers from `draft/config.json`'s `dflash_config`."]
    return ["| `llm_api_options.yaml` | TensorRT-LLM LLM-API options (`decoding_type: DSpark`, speculative_config points at `./draft`) |",
            "| `serve.sh`, `triton/`, `snippets/` | trtllm-serve, Triton, vLLM (`method: dspark`; vLLM's GPU build: its CPU build "
            "refuses method dspark) and SGLang (`DSPARK`, on CUDA or NPU) launchers |",
            "",
            "TensorRT-LLM reads the mask token, target layers, block size and Markov head from `draft/config.json`'s "
            "`dflash_config`; vLLM and SGLang read the mask token and target layers there, and `architectures` "
            "(Qwen3DSparkModel), `markov_rank`, `markov_head_type` and `sample_from_anchor` at its top level. The Markov "
            "head's weights are named `markov_head.*`, as vLLM and SGLang load them (Model Optimizer writes them without "
            "`markov_head.`)."]
