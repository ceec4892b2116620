"""The deployment bundle's family-neutral parts: what a draft family's export hands back (ExportedDraft), the target
as an HF folder, and the README that says what was built and how to serve it (one per draft family).

Every path written into the bundle is relative to it; the README names a local model by its folder name only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtspec.deploy.compat import ENGINES_CHECKED, add_legacy_keys
from trtspec.errors import ArtifactError

if TYPE_CHECKING:
    from trtspec.config import BuildConfig


@dataclass
class ExportedDraft:
    """A draft written to bundle/draft by its family's export."""

    info: dict  # what the README, the serving files and the metrics say about the draft
    label: str  # how the headline names it ("draft (float32)")
    model: Any = None  # the draft model, kept where the family measures acceptance with a quantized target
    tensors: list[str] | None = None  # the checkpoint's tensor names, where the engines' loaders are checked
    no_engine: str | None = None  # why no serving engine loads this draft: the bundle then has no launcher


def export_target(model: Any, tok: Any, out: Path, dtype: Any, quantized: bool) -> None:
    """The target as an HF folder: modelopt's unified (quantized) checkpoint, or a plain save."""
    if quantized:
        from modelopt.torch.export import export_hf_checkpoint

        export_hf_checkpoint(model, dtype=dtype, export_dir=out)
    else:
        model.to(dtype).save_pretrained(out)
    tok.save_pretrained(out)
    for name in ("config.json", "generation_config.json"):
        if not (out / name).is_file():
            raise ArtifactError(f"the target export wrote no {name}", "check the model's transformers version")
    add_legacy_keys(out)


def write_eagle3_readme(bundle: Path, cfg: BuildConfig, info: dict, metrics: dict) -> None:
    """README.md of a bundle with an EAGLE-3 draft: its folders, how to run each engine, the checks done at export."""
    from trtspec.artifacts import package_versions

    source = cfg.model.source
    if not source.startswith(("demo:", "tiny:")) and Path(source).expanduser().exists():
        source = Path(source).name  # a local folder: its name only, the bundle must not name this machine's paths
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
        *family_lines(bundle / "target"),
        "",
        *eagle3_checks(info, metrics),
    ]
    versions = ", ".join(f"{k} {v}" for k, v in package_versions().items())
    lines += ["", "## Built with", "", versions, ""]
    (bundle / "README.md").write_text("\n".join(lines), encoding="utf-8")


def eagle31_lines(info: dict) -> list[str]:
    """The README's paragraph on an EAGLE-3.1 head (fc_norm, norm_output): which engines read its two switches."""
    on = [key for key in ("fc_norm", "norm_output") if info.get(key)]
    if not on:
        return []
    return [f"An EAGLE-3.1 head ({' and '.join(f'`{k}`' for k in on)} in draft/config.json): vLLM's llama_eagle3 reads "
            "both, and snippets/speculators.sh passes them to speculators' converter. trtspec has not found them in "
            "TensorRT-LLM's or SGLang's EAGLE-3 loaders: there such a head would run as plain EAGLE-3 (outputs stay "
            "exact, acceptance falls).", ""]


def family_lines(target: Path) -> list[str]:
    """The README's paragraph on the target's family: which engines serve a draft for it (trtspec.targets)."""
    from trtspec.targets import family_if_known

    f = family_if_known(target)
    if f is None:
        return []
    vllm = f"does not: {f.vllm_eagle3}" if f.vllm_eagle3 else "serves an EAGLE-3 draft for it" + (
        f" (not a DFlash one: {f.vllm_dflash})" if f.vllm_dflash else ", and a DFlash one")
    trt = f"serves EAGLE-3 {f.trtllm}" if f.trtllm else "serves no EAGLE-3 draft for it"
    dflash = "and its DFlash (one-model) lists it" if f.trtllm_dflash else "and its DFlash lists no such target"
    return [f"Target family `{f.name}`" + (f" ({f.note})" if f.note else "") + f". vLLM ({f.vllm}) {vllm}. "
            f"TensorRT-LLM, by its sources, {trt}, {dflash}. trtspec validated it on its "
            + ("native runtime." if f.runtime == "native" else "runtime's HF path (the model's own forward and cache).")]


def engine_table(not_served: dict[str, list[str]]) -> list[str]:
    """The README's table of engines: how each was checked, or why it cannot load the draft (and has no launcher)."""
    return [
        "| engine | checked |",
        "|---|---|",
        *[f"| {name} | {how} |" if name not in not_served else
          f"| {name} | cannot load this draft as trained ({'; '.join(not_served[name])}): no launcher |"
          for name, how in ENGINES_CHECKED.items()],
    ]


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


def write_dflash_readme(bundle: Path, cfg: BuildConfig, info: dict, metrics: dict) -> None:
    """README.md of a bundle with a DFlash (or DSpark) draft: its folders and where every engine reads the draft's settings."""
    from trtspec.artifacts import package_versions
    from trtspec.dflash.head import draft_name

    source = cfg.model.source if cfg.model.source.startswith(("demo:", "tiny:")) else Path(cfg.model.source).name
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
        *family_lines(bundle / "target"),
        "",
        "## Built with",
        "",
        ", ".join(f"{k} {v}" for k, v in package_versions().items()),
        "",
    ]
    (bundle / "README.md").write_text("\n".join(lines), encoding="utf-8")
