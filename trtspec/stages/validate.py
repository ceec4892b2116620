"""The validate stage: the exported bundle, run by the project's PyTorch speculative runtime, against the original
PyTorch model — greedy outputs token-identical, acceptance length, speed against HF generate, a sampling check.

Writes report.json, report.md and PNG plots. Gates (validate.min_acceptance_length, min_speedup, require_exact)
raise ValidationFailed after the report is written (a copy is kept in RUN_DIR/validate-failed/).
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from typing import Any

from trtspec.chat import encode_prompt, prompt_rows, read_prompt_file, read_rows
from trtspec.eagle.checkpoint import check_bundle
from trtspec.errors import ArtifactError, DataError, ValidationFailed
from trtspec.generation import eos_ids, hf_answer
from trtspec.pipeline.stage import InputFile, StageContext
from trtspec.validation import (
    acceptance_summary,
    check_context_length,
    check_gates,
    drafting_summary,
    greedy_match,
    hf_assisted_methods,
    median_speeds,
    quantized_reference,
    sampling_check,
    speed_summary,
    time_methods,
)

UPSTREAM = ("data", "export")
READS = ("validate", "draft", "eval", "seed")


def files_read(cfg: Any) -> list[InputFile]:
    """eval.prompts, read as load_prompt_rows reads it."""
    from functools import partial

    if not cfg.eval.prompts:
        return []
    read = partial(read_prompt_file, what="eval.prompts file", hint="check eval.prompts (relative to the YAML)")
    return [InputFile("eval.prompts", "eval.prompts file", cfg.eval.prompts, cfg.resolve_path(cfg.eval.prompts), "prompt", read)]


def models_read(cfg: Any) -> list[tuple[str, str]]:
    """HF assisted generation's assistant model, checked before the first stage."""
    v = cfg.validate_
    return [("validate.assistant_model", v.assistant_model)] if v.compare_hf and v.assistant_model else []


def load_prompt_rows(ctx: StageContext) -> list[dict]:
    """{"id", "category", "messages"} rows: eval.prompts (JSONL prompt|messages, or text lines), else held-out data."""
    if ctx.cfg.eval.prompts:
        (f,) = files_read(ctx.cfg)
        rows, source = f.read(f.path, Counter()), str(f.path)
    else:
        if "data" not in ctx.inputs:
            raise DataError("no prompts: the data stage was skipped and eval.prompts is not set")
        path = ctx.inputs["data"] / "heldout.jsonl"
        if not path.is_file():
            raise ArtifactError(f"'{path}' is missing", "re-run the data stage")
        rows, source = prompt_rows(read_rows(path)), str(path)
    if not rows:
        raise DataError(f"no usable prompts in '{source}'", "give a JSONL with `prompt` or `messages`, or one prompt per line")
    return rows[: ctx.cfg.eval.num_prompts]


def run(ctx: StageContext) -> dict:
    import torch

    from trtspec.drafting import family, load_drafter
    from trtspec.models import load_model, load_tokenizer
    from trtspec.report import write_report
    from trtspec.runtime import (
        DraftSpec,
        compile_steps,
        generate,
        load_transformer,
        speculative_decode,
    )
    from trtspec.runtime.decode import warm_up_row_counts
    from trtspec.runtime.kernels import cpu_description, step_cost_by_bytes
    from trtspec.runtime.suffix import SuffixDrafter, SuffixThenModelDrafter

    v, d, n_new = ctx.cfg.validate_, ctx.cfg.draft, ctx.cfg.eval.max_new_tokens
    bundle = ctx.inputs["export"]
    check_bundle(bundle)
    target_dir = bundle / "target"
    tok = load_tokenizer(target_dir)
    rows = load_prompt_rows(ctx)
    prompts = [encode_prompt(tok, r["messages"]) for r in rows]
    eos = eos_ids(target_dir, tok)
    target, dq_notes = load_transformer(target_dir, torch.float32)
    check_context_length(rows, prompts, n_new, target.args.max_positions)
    drafter = load_drafter(bundle / "draft", target)
    spec = DraftSpec(shape=d.shape, k=d.length, topk=d.tree_topk, total=d.tree_total_tokens, suffix_len=d.suffix_len)
    source = ctx.model_path
    kernels = target.kernel_choice
    ctx.log(f"{len(prompts)} prompts, {n_new} new tokens, draft {d.shape} k={d.length}, threads {torch.get_num_threads()}")
    ctx.log(f"kernels chosen on this machine for 1..{len(kernels['by_rows'])} rows: {', '.join(kernels['by_rows'])}")

    hf = load_model(source, "float32", "cpu")
    methods: dict[str, Any] = {
        "hf_generate": lambda p: hf_answer(hf, p, n_new, eos),
        "runtime_no_draft": lambda p: generate(target, torch.tensor(p), n_new, eos),
        "speculative": lambda p: speculative_decode(target, drafter, torch.tensor(p), n_new, spec, eos),
    }
    if d.suffix_len:  # suffix drafting alone, and a long suffix match in front of the head
        suffix_alone, suffix_first = SuffixDrafter(), SuffixThenModelDrafter(drafter, SuffixDrafter(min_match=d.suffix_min_match))
        methods["suffix"] = lambda p: speculative_decode(target, suffix_alone, torch.tensor(p), n_new, spec, eos)
        methods["eagle3_suffix"] = lambda p: speculative_decode(target, suffix_first, torch.tensor(p), n_new, spec, eos)
    drafting = [m for m in ("speculative", "suffix", "eagle3_suffix") if m in methods]
    assisted, skipped, method_notes = hf_assisted_methods(ctx.cfg, hf, source, eos)
    methods.update(assisted)

    # compile the runtime's steps before timing: the first generations of each kind trigger it
    compile_s, compile_note = 0.0, "off (validate.compile: false)"
    if v.compile:
        ctx.log("compiling the runtime's decode, verify and draft passes (torch.compile; ~1-2 min on a CPU the first time)")
        compile_s, compile_note = compile_steps([target, drafter.net], lambda: (warm_up_row_counts(target, drafter, spec),
                                                                                    [methods[m](prompts[0]) for m in ("runtime_no_draft", *drafting)]))
        ctx.log(f"{compile_note} ({compile_s:.0f} s)")

    timed, bandwidth = time_methods(methods, prompts, ctx.cfg.eval.repeats, kernels)
    for rep in range(ctx.cfg.eval.repeats):
        ctx.log(f"repetition {rep + 1}/{ctx.cfg.eval.repeats}: " + ", ".join(f"{m} {timed[m]['tokens_per_s'][rep]:.1f} tok/s" for m in methods))
    tps, outputs = median_speeds(timed), {m: timed[m]["outputs"] for m in methods}

    reference, reference_name, quant_report = outputs["hf_generate"], "HF generate, original model, float32", None
    quant_file = target_dir / "hf_quant_config.json"
    if quant_file.is_file():
        ctx.log("quantized target: HF reference with the bundle's dequantized weights")
        reference, reference_name, quant_report = quantized_reference(
            source, target_dir, json.loads(quant_file.read_text()), dq_notes, rows, prompts, outputs["hf_generate"], n_new, eos)
    acceptance = acceptance_summary(rows, outputs["speculative"], d.length)
    sampling = None
    if v.sampling_temperature is not None:  # chains only: sampling from a top-k tree is not lossless
        chain = DraftSpec(shape="chain", k=d.length, suffix_len=d.suffix_len)
        drafters = {"speculative": drafter, **({"suffix": suffix_alone, "eagle3_suffix": suffix_first} if d.suffix_len else {})}
        sampling = {m: sampling_check(target, dr, min(prompts, key=len), chain, v.sampling_temperature, eos, n=200, seed=ctx.cfg.seed,
                                      repeat=m != "speculative") for m, dr in drafters.items()}

    report = {
        "runtime": f"trtspec PyTorch speculative runtime ({family(drafter.name).title} from bundle/draft), CPU float32",
        "draft_method": drafter.name,
        "runtime_compiled": target.compiled is not None,
        "compile": {"seconds": compile_s, "note": compile_note},
        "bundle": str(bundle),
        "prompts": len(prompts),
        "prompt_source": ctx.cfg.eval.prompts or "data/heldout.jsonl",
        "max_new_tokens": n_new,
        "draft_len": d.length,
        "draft_shape": d.shape,
        "threads": torch.get_num_threads(),
        "reference": reference_name,
        "greedy_match": greedy_match(rows, outputs, reference),
        "quantization": quant_report,
        **acceptance,
        "tokens_per_s": tps,
        "skipped": skipped,
        "method_notes": method_notes,
        **speed_summary(tps, acceptance["acceptance_length"], kernels, bandwidth,
                        median_speeds(timed, "decode_tokens_per_s").get("runtime_no_draft"),
                        timed["runtime_no_draft"].get("decode_runs"), step_cost_by_bytes(target, drafter, spec)),
        "drafting": drafting_summary(outputs, reference, tps, drafting, d.suffix_len) if len(drafting) > 1 else None,
        "sampling_check": sampling,
        "machine": cpu_description(),
        "kernels": {"target": kernels, "draft": drafter.net.kernel_choice},
    }
    report["gates"] = check_gates(v, report)
    write_report(ctx.out, report)
    return finish(ctx, report)


def finish(ctx: StageContext, report: dict) -> dict:
    """The stage's metrics; with a gate missed, the report is also kept in RUN_DIR/validate-failed and the stage fails."""
    failed_dir = ctx.run.path / "validate-failed"
    shutil.rmtree(failed_dir, ignore_errors=True)
    failures = [g["message"] for g in report["gates"] if not g["passed"]]
    if failures:
        shutil.copytree(ctx.out, failed_dir)
        raise ValidationFailed("; ".join(failures), f"report kept in {failed_dir}")
    m, al = report["greedy_match"], report["acceptance_length"]
    return {
        "headline": f"greedy {m['matched']}/{m['total']} identical, AL {al:.2f}, {report['speedup_vs_hf']:.2f}x vs HF generate",
        "greedy_match": m["matched"], "prompts": m["total"], "acceptance_length": al,
        "speedup_vs_hf": report["speedup_vs_hf"], "tokens_per_s": report["tokens_per_s"],
    }
