"""The export stage: the deployment bundle (RUN_DIR/bundle), movable as one folder.

  target/   the base as an HF folder: modelopt's unified checkpoint (export_hf_checkpoint, + hf_quant_config.json)
            when quantized, else a plain save_pretrained; tokenizer and generation_config beside it
  draft/    the draft as its family's export writes it (DraftFamily.export_draft): the EAGLE-3 head as modelopt's
            export_speculative_decoding writes it (LlamaForCausalLMEagle3), rebuilt on the *unquantized* base from
            train/head.safetensors, checked against trtspec/eagle/checkpoint.py's table (trtspec.eagle.export); a
            DFlash drafter as Model Optimizer's DFlashExporter writes it, a DSpark one as its DSparkExporter with the
            engines' keys (which engine serves which DSpark draft: DraftFamily.engines_refusing)
  onnx/     the EAGLE-3 head as ONNX, checked against PyTorch with onnxruntime (export.onnx)
  README.md what was built and how to serve it (deploy/bundle.py); llm_api_options.yaml, serve.sh, triton/,
            snippets/ (serving.py)

Every path written into the bundle is relative to it. The draft was trained on the unquantized base and is
served with the quantized one: when the base is quantized, acceptance with both is measured here.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from trtspec.deploy.bundle import ExportedDraft, export_target
from trtspec.deploy.compat import check_engines_load
from trtspec.draft_families import family
from trtspec.pipeline.stage import StageContext

if TYPE_CHECKING:
    from trtspec.config import BuildConfig

UPSTREAM = ("convert", "train", "quantize")
READS = ("export", "serve", "draft", "engine.backend", "eval.acceptance_prompts")  # the bundle's serving options


def preflight(cfg: BuildConfig, model_config: Any) -> None:
    """The family's export settings (DraftFamily.check_export), refused before any stage spends minutes."""
    family(cfg.draft.method).check_export(cfg)


def quantized_acceptance(ctx: StageContext, draft_model: Any, quant: dict) -> dict:
    """AL of the trained draft with the unquantized target and with the quantized one it will be served with (it
    was trained on the first), on the train stage's held-out prompts; a warning when it falls by more than 10%.
    {} where there is nothing to compare (no quantization, no draft model kept, no held-out prompt)."""
    from trtspec.chat import read_rows
    from trtspec.models import load_model, target_tokenizer
    from trtspec.ptq import fold_weights, restore_quantized
    from trtspec.training.acceptance import EVAL_SEQS, acceptance_by_target

    fmt = quant["format"]
    if draft_model is None or fmt == "none":
        return {}
    t0 = time.time()
    data_dir, _ = ctx.run.require("data")  # upstream of both train and quantize
    rows = read_rows(data_dir / "heldout.jsonl")[: ctx.cfg.eval.acceptance_prompts]  # the train stage's evaluation prompts
    if not rows:
        return {}
    path, dtype, quant_dir = ctx.model_path, ctx.cfg.model.dtype, ctx.inputs["quantize"]
    # the unquantized target's answers are the train stage's (same prompts, model and dtype): read, not regenerated
    targets = {"unquantized": (lambda: load_model(path, dtype), ctx.inputs["train"] / EVAL_SEQS),
               fmt: (lambda: fold_weights(restore_quantized(load_model(path, dtype), quant_dir)), None)}
    fam = family(ctx.cfg.draft.method)
    al = acceptance_by_target(draft_model, targets, target_tokenizer(ctx.cfg, path), rows, ctx.cfg.data.max_new_tokens, ctx.work,
                              ctx.cfg.draft.length, ctx.log, fam.state_layers(fam.read_config(ctx.inputs["train"])),
                              fam.drafts)
    before, after = al["unquantized"], al[fmt]
    change = round(100 * (after / before - 1), 1)
    if after < 0.9 * before:
        ctx.log(f"warning: the {fmt} target lowers acceptance by {-change:.0f}% "
                "(more than 10%): consider a milder format, or training the head on the quantized target")
    return {"acceptance_length_unquantized": before, "acceptance_length_quantized": after,
            "acceptance_s": round(time.time() - t0, 1), "acceptance_change_pct": change}


def write_target(ctx: StageContext, quant: dict, dtype: Any) -> float:
    """bundle/target: the base (restored quantized, where it is) with its tokenizer; returns the export's seconds."""
    from trtspec.models import load_model, target_tokenizer
    from trtspec.ptq import restore_quantized

    quantized = quant["format"] != "none"
    ctx.log(f"target: {'modelopt unified checkpoint, ' + quant['format'] if quantized else 'HF save'}, {dtype}")
    target = load_model(ctx.model_path, ctx.cfg.model.dtype)
    if quantized:
        target = restore_quantized(target, ctx.inputs["quantize"])
    t0 = time.time()
    export_target(target, target_tokenizer(ctx.cfg, ctx.model_path), ctx.out / "target", dtype, quantized)
    return time.time() - t0


def engines_not_served(ctx: StageContext, draft: ExportedDraft) -> dict[str, list[str]]:
    """The engines the bundle ships no launcher for, and why: the engines' loaders checked against the draft where
    its family has that check (EAGLE-3); a required engine that would not load it is an error."""
    if draft.tensors is None:
        return {}
    required = {"TensorRT-LLM"} if ctx.cfg.engine.backend == "trtllm" else {"TensorRT-LLM", "vLLM"}  # auto may run vLLM
    not_served = check_engines_load(ctx.out / "draft", ctx.out / "target", draft.tensors, required)
    for engine, problems in not_served.items():
        ctx.log(f"warning: no {engine} launcher in the bundle: {'; '.join(problems)}")
    return not_served


def run(ctx: StageContext) -> dict:
    from trtspec.deploy import serving
    from trtspec.models import load_model, torch_dtype
    from trtspec.ptq import read_quant_json

    t0 = time.time()
    cfg, out = ctx.cfg, ctx.out
    fam = family(cfg.draft.method)
    quant = read_quant_json(ctx.inputs["quantize"])
    dtype = torch_dtype(cfg.model.dtype)

    ctx.log(f"draft: the trained {fam.title} on the unquantized base, exported as {dtype}")
    t_draft = time.time()
    draft = fam.export_draft(load_model(ctx.model_path, cfg.model.dtype), ctx.inputs["train"], out / "draft", dtype, ctx.model_path)
    export_s = time.time() - t_draft
    metrics: dict[str, Any] = quantized_acceptance(ctx, draft.model, quant)
    draft.model = None  # one model in memory at a time: the target's turn
    export_s += write_target(ctx, quant, dtype)

    not_served = engines_not_served(ctx, draft)
    if cfg.export.onnx and fam.exports_onnx:
        metrics["onnx"] = fam.export_onnx(out / "draft", out / "onnx")
        ctx.log("onnx: " + fam.format_onnx_check(metrics["onnx"]))

    info = {"target_dtype": str(dtype).removeprefix("torch."), "quant_format": quant["format"],
            "kv_cache": quant.get("kv_cache", "none"), **draft.info, "max_draft_len": cfg.draft.length,
            "drafting": list(fam.drafting)}  # what `deploy triton --drafting` may serve of this bundle, besides suffix
    problems, no_engine = fam.engines_refusing(info)  # DSpark: engines serve some heads and block lengths only
    draft.no_engine = draft.no_engine or no_engine
    not_served.update(problems)
    if not_served:
        metrics["engines_not_served"] = not_served
    if draft.no_engine:
        ctx.log(f"warning: {draft.no_engine}")
        metrics["no_engine"] = draft.no_engine  # the engine stage skips on it
    fam.write_readme(out, cfg, info, metrics)
    serving_files = [] if draft.no_engine else serving.write_serving_files(out, cfg, info, fam, skip=set(not_served) | fam.no_launcher)
    metrics.update(info, serving_files=serving_files, export_s=round(export_s, 1), stage_s=round(time.time() - t0, 1))
    if lineage := (ctx.manifests.get("convert", {}).get("metrics") or {}).get("init_from"):
        metrics["lineage"] = lineage  # the draft this one was adapted from (draft.init_from), and its own lineage
    metrics["headline"] = f"target ({quant['format']}) + {draft.label} written in {export_s:.0f}s" + checks_note(metrics)
    return metrics


def checks_note(metrics: dict) -> str:
    """The headline's checks: ONNX against PyTorch, acceptance with the quantized target."""
    note = f", ONNX ✓ (max diff {max(metrics['onnx']['max_abs_diff'].values()):.1g})" if "onnx" in metrics else ""
    if "acceptance_length_quantized" in metrics:
        before, after = metrics["acceptance_length_unquantized"], metrics["acceptance_length_quantized"]
        note += f", AL {before:.2f} -> {after:.2f} with the {metrics['quant_format']} target"
    return note
