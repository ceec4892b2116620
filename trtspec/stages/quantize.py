"""The quantize stage: post-training quantization of the base with modelopt (mtq.quantize), calibrated on data/.

Writes quantize/quant.json and, when format != none, modelopt_state.pt and quant_tensors.safetensors (trtspec.ptq
says what each holds). `trtspec.ptq.restore_quantized(base_model, quant_dir)` rebuilds the quantized base (the
export stage uses it); the stage checks that the rebuilt model gives the same logits before it returns.

Measured on the held-out split: perplexity of the answers before/after, and greedy agreement with the
unquantized model (teacher-forced top-1 agreement on its greedy continuations; identical free-running outputs).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trtspec.chat import encode_row, prompt_rows, read_rows
from trtspec.errors import DataError
from trtspec.generation import hf_answer
from trtspec.pipeline.stage import StageContext
from trtspec.ptq import (
    BLOCK_FORMATS,
    QUANT_JSON,
    block_size_for,
    calibrate,
    check_quant_config,
    compare_with_reference,
    fold_weights,
    perplexity,
    quant_config,
    quant_info,
    quantized_linears,
    save_and_check_restore,
    token_rows,
)

if TYPE_CHECKING:
    from trtspec.config import BuildConfig

UPSTREAM = ("data",)
READS = ("quantize", "eval.num_prompts", "eval.max_new_tokens", "seed")


def preflight(cfg: BuildConfig, model_config: Any) -> None:
    """The quantize settings checked against the model's config, and a block format's block size against its layers'
    widths (the model built on the meta device: no weights), before the stages ahead of quantize run."""
    q = cfg.quantize
    if q.format == "none":
        return
    check_quant_config(q, model_config)
    if q.format in (*BLOCK_FORMATS, "nvfp4") and (skeleton := meta_model(model_config)) is not None:
        block_size_for(q, quantized_linears(skeleton, q.quantize_lm_head))


def meta_model(model_config: Any) -> Any:
    """The model of `model_config` on the meta device (its modules, no weights), or None where transformers cannot
    build it so (the stage then checks the loaded model)."""
    import torch
    from transformers import AutoModelForCausalLM

    try:
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(model_config)
    except Exception:  # noqa: BLE001 -- a model class that builds only with its weights: checked in the stage
        return None


def run(ctx: StageContext) -> dict:
    from transformers import AutoConfig

    from trtspec.artifacts import write_json
    from trtspec.models import load_model, target_tokenizer

    q = ctx.cfg.quantize
    if q.format == "none":
        write_json(ctx.out / QUANT_JSON, {"format": "none"})
        return {"format": "none", "headline": "not quantized (quantize.format: none)"}
    check_quant_config(q)  # nvfp4 on a CPU fails here, before anything is loaded
    path = ctx.model_path
    check_quant_config(q, AutoConfig.from_pretrained(path))
    tok = target_tokenizer(ctx.cfg, path)
    model = load_model(path, ctx.cfg.model.dtype)
    layers = quantized_linears(model, q.quantize_lm_head)
    block = block_size_for(q, layers)
    calib, heldout, prompts = measure_rows(ctx, tok)
    eos = tok.eos_token_id

    def greedy(m: Any) -> list[list[int]]:  # one prompt at a time: no padding effects
        return [hf_answer(m, p, ctx.cfg.eval.max_new_tokens, {eos}, pad_id=eos) for p in prompts]

    ctx.log(f"reference: perplexity and greedy outputs of the unquantized model on {len(prompts)} held-out prompts")
    ppl_before = perplexity(model, heldout)
    reference = greedy(model)

    ctx.log(f"quantizing {len(layers)} linear layers to {q.format}" + (f" (block {block})" if block else "")
            + (" + fp8 KV cache" if q.kv_cache == "fp8" else "") + f", calibrating on {len(calib)} conversations")
    model = calibrate(model, quant_config(q.format, q.kv_cache, block, q.quantize_lm_head), calib)
    saved, diff = save_and_check_restore(model, load_model(path, ctx.cfg.model.dtype), ctx.out, calib[0][0])

    ctx.log("measuring the quantized model")
    model = fold_weights(model)
    after = compare_with_reference(model, heldout, prompts, reference, greedy)
    info = quant_info(q, block, layers, model)
    write_json(ctx.out / QUANT_JSON, info)
    return metrics(info, ppl_before, after, len(calib), len(prompts), saved, diff)


def measure_rows(ctx: StageContext, tok: Any) -> tuple[list, list, list[list[int]]]:
    """Calibration rows (train split), held-out rows for perplexity and the held-out prompts, encoded; with no
    held-out split (holdout_fraction 0) the training conversations stand in, and the log says so."""
    data, n = ctx.inputs["data"], ctx.cfg.eval.num_prompts
    calib = token_rows(data / "train_tokens.pt", ctx.cfg.quantize.calib_samples, ctx.cfg.seed)
    heldout = token_rows(data / "heldout_tokens.pt", n)
    prompts_file = data / "heldout.jsonl"
    if not heldout:
        ctx.log("no held-out conversations: measuring on training conversations instead")
        heldout, prompts_file = token_rows(data / "train_tokens.pt", n), data / "train.jsonl"
    if not calib:
        raise DataError("data/train_tokens.pt has no conversation to calibrate on", "re-run the data stage with more data")
    prompts = [encode_row(tok, r) for r in prompt_rows(read_rows(prompts_file))[:n]]
    return calib, heldout, prompts


def metrics(info: dict, ppl_before: float, after: dict, calib: int, prompts: int, saved: int, diff: float) -> dict:
    """The stage's metrics and headline: what quantization cost against the unquantized model."""
    fmt, block, ppl_after, agree = info["format"], info["block_size"], after["perplexity"], after["agreement"]
    change = 100 * (ppl_after / ppl_before - 1)
    return {
        **{k: info[k] for k in ("format", "kv_cache", "block_size", "quantized_layers")},
        "calib_samples": calib,
        "eval_prompts": prompts,
        "perplexity_before": round(ppl_before, 4),
        "perplexity_after": round(ppl_after, 4),
        "perplexity_change_pct": round(change, 2),
        "greedy_agreement": round(agree, 4),
        "identical_outputs": after["identical"],
        "mean_matching_prefix": round(after["prefix"], 2),
        "saved_tensors": saved,
        "restore_max_logit_diff": diff,
        "headline": (
            f"{fmt}" + (f"/block {block}" if block else "") + (" + fp8 KV" if info["kv_cache"] == "fp8" else "")
            + f": perplexity {ppl_before:.2f} -> {ppl_after:.2f} ({change:+.1f}%), greedy agreement {agree:.1%}, "
            f"{after['identical']}/{prompts} outputs identical"
        ),
    }
