"""The README of a bundle with an EAGLE-3 (or EAGLE-3.1) draft: its folders, how to run each engine, which target
layers the head reads and where each engine is told so, the checks done at export."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from trtspec.deploy.bundle import built_with, engine_table, family_lines, source_name

if TYPE_CHECKING:
    from trtspec.config import BuildConfig


def write_eagle3_readme(bundle: Path, cfg: BuildConfig, info: dict, metrics: dict) -> None:
    """README.md of a bundle with an EAGLE-3 draft: its folders, how to run each engine, the checks done at export."""
    source = source_name(cfg)
    quant = info["quant_format"] + (" + fp8 KV cache" if info.get("kv_cache") == "fp8" else "")
    lines = [
        "# trtspec deployment bundle",
        "",
        f"Target `{source}` ({quant}, {info['target_dtype']}) with an EAGLE-3 draft head "
        f"({info['draft_params'] / 1e6:.1f}M parameters, {info['draft_dtype']}, aux layers {info['aux_layers']}, "
        f"draft vocab {info['draft_vocab_size']}).",
        "",
        "| folder | what |",
        "|---|---|",
        "| `target/` | the target, HF format" + (" (modelopt unified checkpoint, `hf_quant_config.json`)" if info["quant_format"] != "none" else "") + " |",
        "| `draft/` | the EAGLE-3 draft (`LlamaForCausalLMEagle3`), as TensorRT-LLM, vLLM and SGLang load it |",
    ]
    if "onnx" in metrics:
        lines.append("| `onnx/` | one draft step as ONNX (float32; inputs aux_hidden_states, input_embeds, position_ids) |")
    lines += [
        "| `llm_api_options.yaml` | TensorRT-LLM LLM-API options (speculative_config points at `./draft`) |",
        "| `serve.sh`, `triton/`, `snippets/` | trtllm-serve, Triton, vLLM, SGLang and speculators launchers |",
        "",
        "## Run it",
        "",
        "```bash",
        "cd bundle                 # every path here is relative to this folder",
        "./serve.sh                # TensorRT-LLM: trtllm-serve ./target --config llm_api_options.yaml",
        "./triton/launch.sh        # Triton Inference Server with TensorRT-LLM's LLM-API backend",
        "./snippets/vllm.sh        # vLLM (GPU, or its CPU build)",
        "./snippets/sglang.sh      # SGLang",
        "./snippets/speculators.sh # the draft in speculators' format, for vLLM users who keep that",
        "```",
        "",
        *eagle31_lines(info),
        f"The head reads target layers {info['aux_layers']} (their outputs). Each engine is told so where it looks: "
        "`eagle3_layers_to_capture` in llm_api_options.yaml (TensorRT-LLM), the draft config's top-level "
        "`eagle_aux_hidden_state_layer_ids` in vLLM's numbering (one more: the state entering the next layer), its "
        "`eagle_config` (SGLang), the converter's argument (speculators).",
        "",
        *engine_table(metrics.get("engines_not_served", {})),
        "",
        *family_lines(bundle / "target", cfg.model.chat_template_kwargs, cfg.model.chat_template),
        "",
        *eagle3_checks(info, metrics),
        *built_with(),
    ]
    (bundle / "README.md").write_text("\n".join(lines), encoding="utf-8")


def eagle31_lines(info: dict) -> list[str]:
    """The README's paragraph on an EAGLE-3.1 head (fc_norm, norm_output): which engines read its two switches."""
    on = [key for key in ("fc_norm", "norm_output") if info.get(key)]
    if not on:
        return []
    return [f"An EAGLE-3.1 head ({' and '.join(f'`{k}`' for k in on)} in draft/config.json): TensorRT-LLM's EAGLE-3 "
            "draft model (main of 2026; not its 1.0 releases) and vLLM's llama_eagle3 read both, and "
            "snippets/speculators.sh passes them to speculators' converter. SGLang's llama_eagle3 reads neither: there, "
            "as in older TensorRT-LLM releases, such a head would run as plain EAGLE-3 (outputs stay exact, acceptance "
            "falls).", ""]


def eagle3_checks(info: dict, metrics: dict) -> list[str]:
    """The README's "Checks done at export": the checkpoint table, ONNX against PyTorch, acceptance by target."""
    lines = ["## Checks done at export", "", f"- draft checkpoint matches the EAGLE-3 key/shape table ({info['draft_params']} parameters)"]
    if "onnx" in metrics:
        from trtspec.eagle.onnx_export import format_onnx_check

        lines.append(f"- ONNX vs PyTorch: {format_onnx_check(metrics['onnx'])}")
    if "acceptance_length_quantized" in metrics:
        lines.append(
            f"- acceptance length (greedy chains of {info['max_draft_len']} drafts, held-out prompts): "
            f"{metrics['acceptance_length_unquantized']:.2f} with the unquantized target, "
            f"{metrics['acceptance_length_quantized']:.2f} with the {info['quant_format']} target"
        )
    return lines
