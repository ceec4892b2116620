"""The export stage: the deployment bundle (RUN_DIR/bundle), movable as one folder.

  target/   the base as an HF folder: modelopt's unified checkpoint (export_hf_checkpoint, + hf_quant_config.json)
            when quantized, else a plain save_pretrained; tokenizer and generation_config beside it
  draft/    the EAGLE-3 head as modelopt's export_speculative_decoding writes it (LlamaForCausalLMEagle3), rebuilt
            on the *unquantized* base from train/head.safetensors, checked against trtspec/eagle/checkpoint.py's table
  onnx/     the draft head as ONNX, checked against PyTorch with onnxruntime (export.onnx)
  README.md what was built and how to serve it; llm_api_options.yaml, serve.sh, triton/, snippets/ (serving.py)

Every path written into the bundle is relative to it. The draft was trained on the unquantized base and is
served with the quantized one: when the base is quantized, acceptance with both is measured here.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from trtspec.deploy.compat import ENGINES_CHECKED, add_engine_fields, add_legacy_keys
from trtspec.errors import ArtifactError, ConfigError
from trtspec.pipeline.stage import StageContext

UPSTREAM = ("convert", "train", "quantize")
READS = ("export", "serve", "draft", "engine.backend", "eval.acceptance_prompts")  # the bundle's serving options


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
    export_speculative_decoding(model, export_dir=out)
    cfg_path = out / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["torch_dtype"] = str(dtype).removeprefix("torch.")
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")
    add_engine_fields(out)


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


def preflight(cfg: Any, model_config: Any) -> None:
    """The draft is exported for engines that load one draft layer as trtspec trains it: refuse more, early."""
    if cfg.draft.method == "eagle3" and cfg.convert.num_layers != 1:
        raise ConfigError(
            f"convert.num_layers {cfg.convert.num_layers}: no engine loads such a draft as it is trained (TensorRT-LLM "
            "expects hidden_norm on every draft layer; SGLang and speculators load one layer)",
            "set convert.num_layers: 1, or stop before the export stage (--until train)",
        )


def check_engines_load(draft_dir: Path, target_dir: Path, tensors: list[str], required: set[str]) -> dict[str, list[str]]:
    """Where the draft would not load (or load wrongly): one ArtifactError naming the engine and the field for a
    `required` engine (TensorRT-LLM, which the bundle is for, and the engine stage's own); for the others the
    problems are returned, and the bundle ships no launcher for them."""
    from trtspec.artifacts import read_json
    from trtspec.deploy.compat import engine_problems

    problems = engine_problems(read_json(draft_dir / "config.json"), read_json(target_dir / "config.json"), set(tensors))
    lines = [f"{engine}: {'; '.join(p)}" for engine, p in problems.items() if p and engine in required]
    if lines:
        raise ArtifactError(f"the draft in '{draft_dir}' would not serve as trained: " + " | ".join(lines),
                            "re-export it with `trtspec build ... --from export`")
    return {engine: p for engine, p in problems.items() if p}


def acceptance_lengths(ctx: StageContext, draft_model: Any, targets: dict[str, tuple[Any, Path | None]], k: int) -> dict[str, float]:
    """AL@k of the trained head with each target: targets[name] = (load, answers), where load() loads the target
    and `answers` is a file of its greedy answers written before (None, or missing: generate them here).

    Each target writes its own greedy answers to the same held-out prompts as the train stage's evaluation, and
    the head drafts from that target's hidden states (train stage's exact greedy simulation): AL = tokens per
    target forward (1 = the draft never helps).
    """
    from trtspec.chat import read_rows
    from trtspec.eagle.acceptance import build_eval_set, evaluate_acceptance
    from trtspec.models import load_tokenizer

    data_dir, _ = ctx.run.require("data")  # upstream of both train and quantize
    rows = read_rows(data_dir / "heldout.jsonl")[: ctx.cfg.eval.acceptance_prompts]  # the train stage's evaluation prompts
    if not rows:
        return {}
    tok = load_tokenizer(ctx.model_path)
    aux = draft_model.eagle_config.eagle_aux_hidden_state_layer_ids
    out = {}
    for name, (load, answers) in targets.items():
        base = load()  # one target in memory at a time
        ctx.log(f"acceptance with the {name} target ({len(rows)} held-out prompts)")
        cache = answers if answers and answers.is_file() else ctx.work / f"eval_{name}.pt"
        eval_set = build_eval_set(base, tok, rows, aux, ctx.cfg.data.max_new_tokens, cache, ctx.log)
        out[name] = evaluate_acceptance(draft_model, eval_set, k)[f"AL@{k}"]
        del base, eval_set
    return out


def write_readme(bundle: Path, cfg: Any, info: dict, metrics: dict) -> None:
    from trtspec.artifacts import package_versions

    source = cfg.model.source
    if not source.startswith("demo:") and Path(source).expanduser().exists():
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
        f"The head reads target layers {info['aux_layers']} (their outputs). Each engine is told so where it looks: "
        "`eagle3_layers_to_capture` in llm_api_options.yaml (TensorRT-LLM), the draft config's top-level "
        "`eagle_aux_hidden_state_layer_ids` in vLLM's numbering (one more: the state entering the next layer), its "
        "`eagle_config` (SGLang), the converter's argument (speculators).",
        "",
        "| engine | checked |",
        "|---|---|",
        *[f"| {name} | {how} |" if name not in metrics.get("engines_not_served", {}) else
          f"| {name} | cannot load this draft as trained ({'; '.join(metrics['engines_not_served'][name])}): no launcher |"
          for name, how in ENGINES_CHECKED.items()],
        "",
        "## Checks done at export",
        "",
        f"- draft checkpoint matches the EAGLE-3 key/shape table ({info['draft_params']} parameters)",
    ]
    if "onnx" in metrics:
        from trtspec.eagle.onnx_export import format_onnx_check

        lines.append(f"- ONNX vs PyTorch: {format_onnx_check(metrics['onnx'])}")
    if "acceptance_length_quantized" in metrics:
        lines.append(
            f"- acceptance length (greedy chains of {info['max_draft_len']} drafts, held-out prompts): "
            f"{metrics['acceptance_length_unquantized']:.2f} with the unquantized target, "
            f"{metrics['acceptance_length_quantized']:.2f} with the {info['quant_format']} target"
        )
    versions = ", ".join(f"{k} {v}" for k, v in package_versions().items())
    lines += ["", "## Built with", "", versions, ""]
    (bundle / "README.md").write_text("\n".join(lines), encoding="utf-8")


def run(ctx: StageContext) -> dict:
    from trtspec.deploy import serving
    from trtspec.eagle.acceptance import EVAL_SEQS
    from trtspec.eagle.checkpoint import check_draft_checkpoint
    from trtspec.models import load_model, load_tokenizer, torch_dtype
    from trtspec.quant import fold_weights, read_quant_json, restore_quantized

    if ctx.cfg.draft.method == "dflash":
        return run_dflash(ctx)
    t0 = time.time()
    cfg, out = ctx.cfg, ctx.out
    path = ctx.model_path
    tok = load_tokenizer(path)
    quant_dir = ctx.inputs["quantize"]
    quant = read_quant_json(quant_dir)
    quantized = quant["format"] != "none"
    dtype = torch_dtype(cfg.model.dtype)
    train_dir = ctx.inputs["train"]
    steps = cfg.draft.length
    metrics: dict[str, Any] = {}

    ctx.log(f"draft: the trained EAGLE-3 head on the unquantized base, exported as {dtype}")
    t_draft = time.time()
    draft_model = build_draft_model(load_model(path, cfg.model.dtype), train_dir)
    export_draft(draft_model, out / "draft", dtype)
    draft = check_draft_checkpoint(out / "draft", path)
    export_s = time.time() - t_draft

    if quantized:  # the head was trained on the unquantized target and will be served with the quantized one
        t_al = time.time()
        draft_model.eagle_module.to(dtype)
        # the unquantized target's answers are the train stage's (same prompts, model and dtype): read, not regenerated
        targets = {"unquantized": (lambda: load_model(path, cfg.model.dtype), train_dir / EVAL_SEQS),
                   quant["format"]: (lambda: fold_weights(restore_quantized(load_model(path, cfg.model.dtype), quant_dir)), None)}
        al = acceptance_lengths(ctx, draft_model, targets, steps)
        if al:
            metrics.update(acceptance_length_unquantized=al["unquantized"], acceptance_length_quantized=al[quant["format"]],
                           acceptance_s=round(time.time() - t_al, 1))
    del draft_model

    ctx.log(f"target: {'modelopt unified checkpoint, ' + quant['format'] if quantized else 'HF save'}, {dtype}")
    target = load_model(path, cfg.model.dtype)
    if quantized:
        target = restore_quantized(target, quant_dir)
    t_target = time.time()
    export_target(target, tok, out / "target", dtype, quantized)
    export_s += time.time() - t_target
    del target

    required = {"TensorRT-LLM"} if cfg.engine.backend == "pytorch" else {"TensorRT-LLM", "vLLM"}  # auto may run vLLM
    not_served = check_engines_load(out / "draft", out / "target", draft["tensors"], required)
    for engine, problems in not_served.items():
        ctx.log(f"warning: no {engine} launcher in the bundle: {'; '.join(problems)}")
    if not_served:
        metrics["engines_not_served"] = not_served

    if cfg.export.onnx:
        from trtspec.eagle.onnx_export import export_onnx, format_onnx_check

        metrics["onnx"] = export_onnx(out / "draft", out / "onnx")
        ctx.log("onnx: " + format_onnx_check(metrics["onnx"]))

    info = {
        "target_dtype": str(dtype).removeprefix("torch."),
        "draft_dtype": draft["dtype"],
        "quant_format": quant["format"],
        "kv_cache": quant.get("kv_cache", "none"),
        "aux_layers": draft["aux_layers"],
        "draft_vocab_size": draft["draft_vocab_size"],
        "draft_params": draft["parameters"],
        "max_draft_len": steps,
    }
    write_readme(out, cfg, info, metrics)
    serving_files = serving.write_serving_files(out, cfg, info, skip=set(not_served))
    seconds = time.time() - t0
    metrics.update(info, serving_files=serving_files, export_s=round(export_s, 1), stage_s=round(seconds, 1))
    al = ""
    if "acceptance_length_quantized" in metrics:
        before, after = metrics["acceptance_length_unquantized"], metrics["acceptance_length_quantized"]
        metrics["acceptance_change_pct"] = round(100 * (after / before - 1), 1)
        al = f", AL {before:.2f} -> {after:.2f} with the {quant['format']} target"
        if after < 0.9 * before:
            ctx.log(f"warning: the {quant['format']} target lowers acceptance by {-metrics['acceptance_change_pct']:.0f}% "
                    "(more than 10%): consider a milder format, or training the head on the quantized target")
    onnx = f", ONNX ✓ (max diff {max(metrics['onnx']['max_abs_diff'].values()):.1g})" if "onnx" in metrics else ""
    metrics["headline"] = f"target ({quant['format']}) + draft ({draft['dtype']}) written in {export_s:.0f}s{onnx}{al}"
    return metrics


def run_dflash(ctx: StageContext) -> dict:
    """The bundle with a DFlash draft: Model Optimizer's DFlashExporter (DFlashDraftModel config.json with block_size
    and dflash_config {mask_token_id, target_layer_ids, causal}; weights without embedding or lm_head, which every
    engine shares from the target), the target as for EAGLE-3, and the serving files with the DFlash options."""
    from modelopt.torch.export.plugins.hf_spec_export import DFlashExporter

    from trtspec.deploy import serving
    from trtspec.drafting import family
    from trtspec.models import load_model, load_tokenizer, torch_dtype
    from trtspec.quant import read_quant_json, restore_quantized

    t0 = time.time()
    cfg, out = ctx.cfg, ctx.out
    path = ctx.model_path
    quant = read_quant_json(ctx.inputs["quantize"])
    quantized = quant["format"] != "none"
    dtype = torch_dtype(cfg.model.dtype)
    fam = family("dflash")
    train_dir = ctx.inputs["train"]
    ctx.log(f"draft: the trained DFlash drafter, exported as {dtype}")
    model = fam.build(load_model(path, cfg.model.dtype), fam.read_config(train_dir))
    fam.load_head(model, train_dir / fam.head_file)
    model.eval().dflash_module.to(dtype)
    DFlashExporter(model).export(out / "draft", dtype)
    draft_cfg = json.loads((out / "draft" / "config.json").read_text())
    draft_cfg["torch_dtype"] = str(dtype).removeprefix("torch.")
    (out / "draft" / "config.json").write_text(json.dumps(draft_cfg, indent=2) + "\n")
    params = sum(p.numel() for p in model.dflash_module.parameters())
    del model
    target = load_model(path, cfg.model.dtype)
    if quantized:
        target = restore_quantized(target, ctx.inputs["quantize"])
    export_target(target, load_tokenizer(path), out / "target", dtype, quantized)
    del target
    info = {
        "draft_method": "dflash",
        "target_dtype": str(dtype).removeprefix("torch."),
        "draft_dtype": draft_cfg["torch_dtype"],
        "quant_format": quant["format"],
        "kv_cache": quant.get("kv_cache", "none"),
        "target_layers": draft_cfg["dflash_config"]["target_layer_ids"],
        "block_size": draft_cfg["block_size"],
        "mask_token_id": draft_cfg["dflash_config"]["mask_token_id"],
        "draft_params": params,
        "max_draft_len": cfg.draft.length,
    }
    serving_files = serving.write_serving_files(out, cfg, info, skip={"speculators"})
    write_dflash_readme(out, cfg, info)
    seconds = round(time.time() - t0, 1)
    return {**info, "serving_files": serving_files, "stage_s": seconds,
            "headline": f"target ({quant['format']}) + DFlash draft ({info['draft_dtype']}, block {info['block_size']}) "
            f"written in {seconds:.0f}s"}


def write_dflash_readme(bundle: Path, cfg: Any, info: dict) -> None:
    from trtspec.artifacts import package_versions

    source = cfg.model.source if cfg.model.source.startswith("demo:") else Path(cfg.model.source).name
    lines = [
        "# trtspec deployment bundle",
        "",
        f"Target `{source}` ({info['quant_format']}, {info['target_dtype']}) with a DFlash block drafter "
        f"({info['draft_params'] / 1e6:.1f}M parameters, {info['draft_dtype']}, block {info['block_size']}, target layers "
        f"{info['target_layers']}, mask token {info['mask_token_id']}); {info['max_draft_len']} drafts verified per step.",
        "",
        "| folder | what |",
        "|---|---|",
        "| `target/` | the target, HF format |",
        "| `draft/` | the DFlash draft (`DFlashDraftModel`, Model Optimizer's export): embedding and lm_head are the target's |",
        "| `llm_api_options.yaml` | TensorRT-LLM LLM-API options (`decoding_type: DFlash`, speculative_config points at `./draft`) |",
        "| `serve.sh`, `triton/`, `snippets/` | trtllm-serve, Triton, vLLM (`method: dflash`) and SGLang (`DFLASH`) launchers |",
        "",
        "Every engine reads the mask token and the target layers from `draft/config.json`'s `dflash_config`.",
        "",
        "## Built with",
        "",
        ", ".join(f"{k} {v}" for k, v in package_versions().items()),
        "",
    ]
    (bundle / "README.md").write_text("\n".join(lines), encoding="utf-8")
