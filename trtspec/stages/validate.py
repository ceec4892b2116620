"""The validate stage: the exported bundle, run by the project's PyTorch speculative runtime, against the original
PyTorch model — greedy outputs token-identical, acceptance length, speed against HF generate, a sampling check.

Writes report.json, report.md and PNG plots. Gates (validate.min_acceptance_length, min_speedup, require_exact)
raise ValidationFailed after the report is written (a copy is kept in RUN_DIR/validate-failed/).
"""

from __future__ import annotations

import json
import shutil
import statistics
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from trtspec.chat import encode_prompt, prompt_rows, read_prompt_file, read_rows
from trtspec.checkpoint import check_bundle
from trtspec.errors import ArtifactError, DataError, ModelError, ValidationFailed
from trtspec.generation import eos_ids, first_divergence, hf_answer, interleaved
from trtspec.stage import StageContext


def load_prompt_rows(ctx: StageContext) -> list[dict]:
    """{"id", "category", "messages"} rows: eval.prompts (JSONL prompt|messages, or text lines), else held-out data."""
    if ctx.cfg.eval.prompts:
        path = ctx.cfg.resolve_path(ctx.cfg.eval.prompts)
        rows, source = read_prompt_file(path, Counter(), "eval.prompts file", "check eval.prompts (relative to the YAML)"), str(path)
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


def hf_quantized_reference(source: Path, target_dir: Path) -> Any:
    """The original HF model with the bundle's (dequantized) weights: the quantized target as transformers runs it."""
    import torch

    from trtspec.models import load_model
    from trtspec.runtime.model import dequantize, read_safetensors

    model = load_model(source, "float32", "cpu")
    state, _ = dequantize(read_safetensors(target_dir), torch.float32)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or [k for k in missing if k != "lm_head.weight"]:
        raise ArtifactError(f"bundle target weights do not fit the original model: missing {missing[:3]}, unexpected {unexpected[:3]}")
    return model


def quantized_reference(source: Path, target_dir: Path, quant: dict, dq_notes: list[str], rows: list[dict],
                        prompts: list[list[int]], hf_out: list[list[int]], max_new: int, eos: set[int]) -> tuple[list, str, dict]:
    """A quantized target's reference: HF generate on the original architecture with the bundle's dequantized
    weights, and how far that is from the unquantized model. -> (outputs, what they are, the quantization report)."""
    import torch

    hfq = hf_quantized_reference(source, target_dir)
    with torch.inference_mode():
        reference = [hf_answer(hfq, p, max_new, eos) for p in prompts]
    div = [first_divergence(a, b) for a, b in zip(hf_out, reference, strict=True)]
    report = {
        "format": quant.get("quantization", quant).get("quant_algo", "?") if isinstance(quant, dict) else "?",
        "dequantized": True, "dropped": dq_notes,
        "note": "weights dequantized to float32 (weight * weight_scale); activation/KV quantization is not simulated",
        "identical_to_unquantized": sum(d is None for d in div),
        "first_divergence_from_unquantized": {r["id"]: d for r, d in zip(rows, div, strict=True) if d is not None},
    }
    return reference, "HF generate, original architecture with the bundle's weights dequantized (weight * weight_scale), float32", report


def sampling_check(target: Any, drafter: Any, prompt: list[int], spec: Any, temperature: float, eos: set[int], n: int, seed: int) -> dict:
    """Distribution of the first speculated token vs the target's exact one (chi-square, pooled small bins)."""
    import torch

    from trtspec.runtime.decode import generate, prefill, speculative_decode

    p = torch.tensor(prompt)
    first = generate(target, p, 1).tokens[0]
    with torch.inference_mode():
        exact = torch.softmax(prefill(target, torch.tensor(prompt + [first]))[0].float() / temperature, -1)
    g = torch.Generator().manual_seed(seed)
    counts = Counter()
    for _ in range(n):
        out = speculative_decode(target, drafter, p, 2, spec, eos=set(), temperature=temperature, generator=g, first_token=first).tokens
        counts[out[1]] += 1
    expected = exact * n
    big = (expected >= 5).nonzero().flatten().tolist()
    obs = [counts.get(t, 0) for t in big] + [n - sum(counts.get(t, 0) for t in big)]
    exp = [float(expected[t]) for t in big] + [n - float(expected[big].sum())]
    chi2 = sum((o - e) ** 2 / e for o, e in zip(obs, exp, strict=True) if e > 0)
    dof = max(1, len(obs) - 1)
    tv = 0.5 * sum(abs(counts.get(t, 0) / n - float(exact[t])) for t in set(counts) | set(big))
    return {"samples": n, "temperature": temperature, "bins": len(obs), "chi2": round(chi2, 2), "dof": dof,
            "threshold": round(dof + 4 * (2 * dof) ** 0.5, 2), "passed": chi2 < dof + 4 * (2 * dof) ** 0.5,
            "total_variation": round(tv, 4)}


def hf_assisted_methods(cfg: Any, hf: Any, source: Path, eos: set[int]) -> tuple[dict, dict[str, str], dict[str, str]]:
    """HF's own speed-ups to compare with: prompt lookup, and assisted generation with validate.assistant_model (or,
    without one, HF's self-speculation from the target's first layers). -> (methods, skipped, notes)."""
    from trtspec.models import load_model, resolve_model
    from trtspec.runtime.drafters import same_tokenizer

    v, n_new = cfg.validate_, cfg.eval.max_new_tokens
    if not v.compare_hf:
        why = "validate.compare_hf is false"
        return {}, {"hf_assisted": why, "hf_prompt_lookup": why}, {}
    methods = {"hf_prompt_lookup": lambda p: hf_answer(hf, p, n_new, eos, prompt_lookup_num_tokens=cfg.draft.length)}
    notes = {}
    if v.assistant_model:
        assistant_dir = resolve_model(v.assistant_model)
        if not same_tokenizer(assistant_dir, source):
            raise ModelError(f"validate.assistant_model '{v.assistant_model}' has another tokenizer than the target")
        assistant = load_model(assistant_dir, "float32", "cpu")
        methods["hf_assisted"] = lambda p: hf_answer(hf, p, n_new, eos, assistant_model=assistant)
    else:
        exit_layer = max(1, hf.config.num_hidden_layers // 4)
        methods["hf_assisted"] = lambda p: hf_answer(hf, p, n_new, eos, assistant_early_exit=exit_layer)
        notes["hf_assisted"] = f"HF assisted generation, assistant_early_exit={exit_layer} (validate.assistant_model not set)"
    return methods, {}, notes


def time_methods(methods: dict[str, Any], prompts: list[list[int]], repeats: int, kernels: dict) -> tuple[dict, dict | None]:
    """Interleaved repetitions: every prompt runs every method in turn, so machine noise hits all of them alike; the
    memory bandwidth is sampled among them (before, and after each prompt's round) for the decode limit.
    -> (interleaved's result, the bandwidth during the runs; None off a float32 CPU model)."""
    import torch
    from tqdm import tqdm

    from trtspec.runtime.kernels import bandwidth_during, memory_bandwidth

    on_cpu = "weight_mb" in kernels
    samples = [memory_bandwidth(kernels["one_row"], repeats=3)] if on_cpu else []
    bar = tqdm(total=repeats * len(prompts) * len(methods), desc="timed generations", unit="run")

    def after_run(rep: int, i: int, m: str) -> None:
        bar.set_postfix_str(f"rep {rep + 1}, prompt {i + 1}, {m}")
        bar.update()
        if on_cpu and m == list(methods)[-1]:
            samples.append(memory_bandwidth(kernels["one_row"], repeats=3))

    with torch.inference_mode():
        timed = interleaved(methods, prompts, repeats, after_run)
    bar.close()
    return timed, bandwidth_during(samples) if on_cpu else None


def run(ctx: StageContext) -> dict:
    import torch

    from trtspec.models import load_model, load_tokenizer, resolve_model
    from trtspec.runtime import (
        DraftSpec,
        Stats,
        compile_steps,
        generate,
        load_eagle3_drafter,
        load_transformer,
        speculative_decode,
    )
    from trtspec.runtime.kernels import cpu_description, speed_limits

    v, d, n_new = ctx.cfg.validate_, ctx.cfg.draft, ctx.cfg.eval.max_new_tokens
    bundle = ctx.inputs["export"]
    check_bundle(bundle)
    target_dir = bundle / "target"
    tok = load_tokenizer(target_dir)
    rows = load_prompt_rows(ctx)
    prompts = [encode_prompt(tok, r["messages"]) for r in rows]
    eos = eos_ids(target_dir, tok)

    target, dq_notes = load_transformer(target_dir, torch.float32)
    ctx_len = target.args.max_positions
    too_long = [r["id"] for r, p in zip(rows, prompts, strict=True) if len(p) + n_new > ctx_len]
    if too_long:
        raise DataError(f"{len(too_long)} prompt(s) (first: {too_long[0]}) plus {n_new} new tokens exceed the context of {ctx_len}",
                        "use shorter prompts or lower eval.max_new_tokens")
    drafter = load_eagle3_drafter(bundle / "draft", target)
    spec = DraftSpec(shape=d.shape, k=d.length, topk=d.tree_topk, total=d.tree_total_tokens)
    quant = json.loads((target_dir / "hf_quant_config.json").read_text()) if (target_dir / "hf_quant_config.json").is_file() else None
    source = resolve_model(ctx.cfg.model.source)
    ctx.log(f"{len(prompts)} prompts, {n_new} new tokens, draft {d.shape} k={d.length}, threads {torch.get_num_threads()}")

    kernels = target.kernel_choice
    ctx.log(f"kernels chosen on this machine for 1..{len(kernels['by_rows'])} rows: {', '.join(kernels['by_rows'])}")
    hf = load_model(source, "float32", "cpu")
    methods: dict[str, Any] = {
        "hf_generate": lambda p: hf_answer(hf, p, n_new, eos),
        "runtime_no_draft": lambda p: generate(target, torch.tensor(p), n_new, eos),
        "speculative": lambda p: speculative_decode(target, drafter, torch.tensor(p), n_new, spec, eos),
    }
    assisted, skipped, method_notes = hf_assisted_methods(ctx.cfg, hf, source, eos)
    methods.update(assisted)

    # compile the runtime's steps before timing: the first generations of each kind trigger it
    compile_s, compile_note = 0.0, "off (validate.compile: false)"
    if v.compile:
        ctx.log("compiling the runtime's decode, verify and draft passes (torch.compile; ~1-2 min on a CPU the first time)")
        compile_s, compile_note = compile_steps([target, drafter.net], lambda: [methods[m](prompts[0]) for m in ("runtime_no_draft", "speculative")])
        ctx.log(f"{compile_note} ({compile_s:.0f} s)")

    timed, bandwidth = time_methods(methods, prompts, ctx.cfg.eval.repeats, kernels)
    for rep in range(ctx.cfg.eval.repeats):
        ctx.log(f"repetition {rep + 1}/{ctx.cfg.eval.repeats}: " + ", ".join(f"{m} {timed[m]['tokens_per_s'][rep]:.1f} tok/s" for m in methods))
    tps = {m: round(statistics.median(timed[m]["tokens_per_s"]), 2) for m in methods}
    outputs = {m: timed[m]["outputs"] for m in methods}

    # 1. exactness
    hf_out = outputs["hf_generate"]
    reference, reference_name, quant_report = hf_out, "HF generate, original model, float32", None
    if quant:
        ctx.log("quantized target: HF reference with the bundle's dequantized weights")
        reference, reference_name, quant_report = quantized_reference(source, target_dir, quant, dq_notes, rows, prompts, hf_out, n_new, eos)
    spec_tokens = [g.tokens for g in outputs["speculative"]]
    nodraft_tokens = [g.tokens for g in outputs["runtime_no_draft"]]
    mismatches = {r["id"]: first_divergence(s, ref) for r, s, ref in zip(rows, spec_tokens, reference, strict=True) if s != ref}
    matched = len(prompts) - len(mismatches)

    # 2. acceptance
    total, per_cat = Stats(), defaultdict(Stats)
    for r, g in zip(rows, outputs["speculative"], strict=True):
        total.merge(g.stats)
        per_cat[r["category"]].merge(g.stats)
    k = d.length
    al = round(total.acceptance_length(), 3)

    # 4. sampling check (chains only: tree sampling is not lossless with top-k trees)
    sampling = None
    if v.sampling_temperature is not None:
        shortest = min(prompts, key=len)
        chain = DraftSpec(shape="chain", k=d.length)
        sampling = sampling_check(target, drafter, shortest, chain, v.sampling_temperature, eos, n=200, seed=ctx.cfg.seed)

    report = {
        "runtime": "trtspec PyTorch speculative runtime (EAGLE-3 draft from bundle/draft), CPU float32",
        "runtime_compiled": target.compiled_step is not None,
        "compile": {"seconds": compile_s, "note": compile_note},
        "bundle": str(bundle),
        "prompts": len(prompts),
        "prompt_source": ctx.cfg.eval.prompts or "data/heldout.jsonl",
        "max_new_tokens": n_new,
        "draft_len": k,
        "draft_shape": d.shape,
        "threads": torch.get_num_threads(),
        "reference": reference_name,
        "greedy_match": {"matched": matched, "total": len(prompts), "first_divergence": mismatches,
                         "runtime_no_draft_matched": sum(a == b for a, b in zip(nodraft_tokens, reference, strict=True))},
        "quantization": quant_report,
        "acceptance_length": al,
        "acceptance_histogram": total.histogram(k),
        "per_position_acceptance": [round(x, 4) for x in total.per_position(k)],
        "per_category": {c: {"acceptance_length": round(s.acceptance_length(), 3), "steps": s.steps} for c, s in sorted(per_cat.items())},
        "tokens_per_s": tps,
        "skipped": skipped,
        "method_notes": method_notes,
        "speedup_vs_hf": round(tps["speculative"] / tps["hf_generate"], 3),
        "runtime_no_draft_vs_hf": round(tps["runtime_no_draft"] / tps["hf_generate"], 3),
        "speculative_vs_no_draft": round(tps["speculative"] / tps["runtime_no_draft"], 3),
        "sampling_check": sampling,
    }
    report["speedup_over_al"] = round(report["speedup_vs_hf"] / al, 3)
    # what one speculative step (k draft passes + one verify pass over k+1 tokens) costs, in plain decode steps:
    # speculative_vs_no_draft = AL / step_cost, so speculation pays only while AL > step_cost
    report["step_cost_vs_decode"] = round(al / report["speculative_vs_no_draft"], 3)
    report["machine"] = cpu_description()
    report["kernels"] = {"target": kernels, "draft": drafter.net.kernel_choice}
    report["limits"] = None if bandwidth is None else {
        "bandwidth": bandwidth,
        **speed_limits(kernels, bandwidth, tps["runtime_no_draft"], al, report["step_cost_vs_decode"]),
    }
    report["gates"] = gates = check_gates(v, report)

    from trtspec.report import write_report

    write_report(ctx.out, report)
    failed_dir = ctx.run.path / "validate-failed"
    shutil.rmtree(failed_dir, ignore_errors=True)
    failures = [g["message"] for g in gates if not g["passed"]]
    if failures:
        shutil.copytree(ctx.out, failed_dir)
        raise ValidationFailed("; ".join(failures), f"report kept in {failed_dir}")
    return {
        "headline": f"greedy {matched}/{len(prompts)} identical, AL {al:.2f}, {report['speedup_vs_hf']:.2f}x vs HF generate",
        "greedy_match": report["greedy_match"]["matched"], "prompts": len(prompts), "acceptance_length": al,
        "speedup_vs_hf": report["speedup_vs_hf"], "tokens_per_s": tps,
    }


def check_gates(v: Any, report: dict) -> list[dict]:
    gates = []
    if v.require_exact:
        m = report["greedy_match"]
        gates.append({"gate": "require_exact", "passed": m["matched"] == m["total"],
                      "message": f"greedy outputs identical on {m['matched']}/{m['total']} prompts (required: all)"})
    if v.min_acceptance_length is not None:
        gates.append({"gate": "min_acceptance_length", "passed": report["acceptance_length"] >= v.min_acceptance_length,
                      "message": f"acceptance length {report['acceptance_length']:.2f} < required {v.min_acceptance_length}"})
    if v.min_speedup is not None:
        gates.append({"gate": "min_speedup", "passed": report["speedup_vs_hf"] >= v.min_speedup,
                      "message": f"speedup {report['speedup_vs_hf']:.2f}x over HF generate < required {v.min_speedup}x"})
    return gates
