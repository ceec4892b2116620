"""The validate stage: the exported bundle, run by the project's PyTorch speculative runtime, against the original
PyTorch model — greedy outputs token-identical, acceptance length, speed against HF generate, a sampling check.

Writes report.json, report.md and PNG plots. Gates (validate.min_acceptance_length, min_speedup, require_exact)
raise ValidationFailed after the report is written (a copy is kept in RUN_DIR/validate-failed/).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtspec.chat import (
    encode_prompts,
    encode_row,
    prompt_key,
    prompt_rows,
    read_prompt_file,
    read_rows,
    tools_field,
)
from trtspec.checks import (
    acceptance_summary,
    category_speeds,
    check_baseline_categories,
    check_context_length,
    check_gates,
    context_curve,
    drafting_summary,
    greedy_match,
    hf_assisted_methods,
    quantized_reference,
    read_baseline,
    runnable_comparisons,
    sampling_check,
    target_identity,
)
from trtspec.deploy.bundle import check_bundle
from trtspec.errors import ArtifactError, DataError, ValidationFailed
from trtspec.generation import eos_ids, hf_answer
from trtspec.measure import (
    median_speeds,
    speed_summary,
    step_cost_by_bytes,
    step_cost_by_products,
    time_methods,
    warm_up,
)
from trtspec.pipeline.stage import InputFile, StageContext

if TYPE_CHECKING:
    from trtspec.config import BuildConfig

UPSTREAM = ("data", "export")
READS = ("validate", "draft", "eval", "seed")


def files_read(cfg: BuildConfig) -> list[InputFile]:
    """eval.prompts, the jsonl files of eval.suites, read as load_prompt_rows reads them, eval.context_documents
    and validate.baseline."""
    from functools import partial

    from trtspec.suites import context_documents_read, read_suite_file

    files = []
    if cfg.eval.prompts:
        read = partial(read_prompt_file, what="eval.prompts file", hint="check eval.prompts (relative to the YAML)")
        files.append(InputFile("eval.prompts", "eval.prompts file", cfg.eval.prompts, cfg.resolve_path(cfg.eval.prompts),
                               "prompt", read))
    for i, s in enumerate(cfg.eval.suites):
        if s.kind == "jsonl" and s.path:
            name, what = f"eval.suites[{i}].path", f"eval.suites[{i}] file"
            read = partial(read_suite_file, s=s, what=what, hint=f"check {name} (relative to the YAML)")
            files.append(InputFile(name, what, s.path, cfg.resolve_path(s.path), "prompt", read))
    if base := cfg.validate_.baseline:  # hashed like the prompts: an edited baseline gates again (preflight reads it)
        files.append(InputFile("validate.baseline", "validate.baseline", base, cfg.resolve_path(base), "report", read_whole))
    return files + context_documents_read(cfg)


def read_whole(path: Path, skips: Counter) -> list[str]:
    """A file as one row (validate.baseline: its JSON is judged by read_baseline in the preflight)."""
    return [path.read_text(encoding="utf-8", errors="replace")]


def prompt_sources(cfg: BuildConfig, trained: set[str] | None = None) -> list[tuple[str, str, list[dict]]]:
    """(name, how errors name it, rows) of each source of prompts: eval.prompts (in file order), then each of
    eval.suites (its categories in turn); the builtin suite's rows less any whose prompt is in `trained`."""
    from trtspec.suites import suite_label, suite_rows

    readers = {f.name: f for f in files_read(cfg)}
    out = []
    if cfg.eval.prompts:
        f = readers["eval.prompts"]
        out.append((cfg.eval.prompts, f"eval.prompts file '{f.path}'", f.read(f.path, Counter())))
    for i, s in enumerate(cfg.eval.suites):
        f = readers.get(f"eval.suites[{i}].path")
        rows = suite_rows(cfg, i, f.read if f else None)
        if s.kind == "builtin" and trained:
            rows = [r for r in rows if prompt_key(r["messages"], tools_field(r)) not in trained]
        out.append((suite_label(s), f"eval.suites[{i}] ({suite_label(s)})", rows))
    return out


def taken_rows(sources: list[tuple[str, str, list[dict]]], n: int) -> list[dict]:
    """The first `n` prompts, the sources in turn (each row tagged with its source's name: `suite`)."""
    from trtspec.suites import interleave

    return interleave([{**r, "suite": name} for r in rows] for name, _, rows in sources)[:n]


def preflight(cfg: BuildConfig, model_config: Any) -> None:
    """A draft tree on a family validate runs on the runtime's hf path (chains only) refused; validate.baseline read
    and matched to this target and draft length; eval.prompts and eval.suites read (an hf
    suite loaded: with no network, one line) and the prompts the stage will take encoded as it will encode them,
    each with eval.max_new_tokens, against the target's window: a prompt no context holds is refused before any
    stage spends minutes (held-out prompts come from the data stage, cut to data.seq_len)."""
    from trtspec.config import check_fits_window
    from trtspec.errors import ConfigError
    from trtspec.models import resolve_model, target_tokenizer
    from trtspec.targets import family_of, text_config

    if cfg.draft.shape != "chain" and (family := family_of(model_config)).runtime == "hf":
        raise ConfigError(f"draft.shape {cfg.draft.shape}: validate runs {family.name} targets on the runtime's hf path, "
                          "which verifies chains only", "set draft.shape: chain (engines serve a chain or their own tree)")
    baseline = read_baseline(cfg.resolve_path(cfg.validate_.baseline), target_identity(model_config),
                             cfg.draft.length) if cfg.validate_.baseline else None
    window = text_config(model_config).max_position_embeddings
    for b in sorted(cfg.eval.context_bins or []):
        check_fits_window(f"eval.context_bins {b}", b, "eval.max_new_tokens", cfg.eval.max_new_tokens, window)
    if not (cfg.eval.prompts or cfg.eval.suites):
        return
    sources = prompt_sources(cfg)
    taken = taken_rows(sources, cfg.eval.num_prompts)
    if baseline:  # held-out prompts' categories are known after the data stage: checked when validate starts
        check_baseline_categories(baseline, {r["category"] for r in taken}, cfg.validate_.baseline)
    tok = target_tokenizer(cfg, resolve_model(cfg.model.source))
    for k, (name, label, _) in enumerate(sources):
        rows = [r for r in taken if r["suite"] == name]
        if k == 0 and cfg.eval.prompts:  # a file's prompts named by their place in it
            rows = [{**r, "id": f"row {j + 1}"} for j, r in enumerate(rows)]
        check_context_length(rows, encode_prompts(tok, rows, label), cfg.eval.max_new_tokens, window, label)


def models_read(cfg: BuildConfig) -> list[tuple[str, str]]:
    """HF assisted generation's assistant model, checked before the first stage."""
    v = cfg.validate_
    return [("validate.assistant_model", v.assistant_model)] if v.compare_hf and v.assistant_model else []


def load_prompt_rows(ctx: StageContext) -> list[dict]:
    """{"id", "category", "messages", "suite"} rows: eval.prompts (JSONL prompt|messages, or text lines) and
    eval.suites in turn, else held-out data. The builtin suite leaves out any prompt the run's training split holds."""
    cfg = ctx.cfg
    if cfg.eval.prompts or cfg.eval.suites:
        trained = trained_prompts(ctx) if any(s.kind == "builtin" for s in cfg.eval.suites) else set()
        sources = prompt_sources(cfg, trained)
        rows, source = taken_rows(sources, cfg.eval.num_prompts), "; ".join(label for _, label, _ in sources)
    else:
        if "data" not in ctx.inputs:
            raise DataError("no prompts: the data stage was skipped and neither eval.prompts nor eval.suites is set")
        path = ctx.inputs["data"] / "heldout.jsonl"
        if not path.is_file():
            raise ArtifactError(f"'{path}' is missing", "re-run the data stage")
        rows, source = prompt_rows(read_rows(path))[: cfg.eval.num_prompts], str(path)
    if not rows:
        raise DataError(f"no usable prompts in {source}", "give a JSONL with `prompt` or `messages`, or one prompt per line")
    return rows


def trained_prompts(ctx: StageContext) -> set[str]:
    """The prompts (prompt_key) of the run's training split, data/train.jsonl."""
    path = ctx.inputs["data"] / "train.jsonl" if "data" in ctx.inputs else None
    return {prompt_key(r["messages"], tools_field(r)) for r in prompt_rows(read_rows(path))} if path and path.is_file() else set()


def prompt_source(cfg: BuildConfig) -> str:
    """The report's name for where the prompts came from: eval.prompts and each suite, else the held-out split."""
    from trtspec.suites import suite_label

    names = ([cfg.eval.prompts] if cfg.eval.prompts else []) + [suite_label(s) for s in cfg.eval.suites]
    return "; ".join(names) or "data/heldout.jsonl"


@dataclass
class Bench:
    """What every measurement of the stage shares: the prompts and the bundle loaded into the runtime."""

    rows: list[dict]
    prompts: list[list[int]]
    eos: set[int]
    target: Any  # the runtime's target (bundle/target)
    dq_notes: list[str]  # how the runtime dequantized a quantized target
    drafter: Any  # the runtime's drafter (bundle/draft)
    spec: Any  # the runtime's DraftSpec from the draft section
    drafters: dict[str, Any] = field(default_factory=dict)  # timed method -> its drafter
    family: str = ""  # the target's family (trtspec.targets), which decides the runtime path
    settings: Any = None  # runtime.settings.RuntimeSettings the bundle was loaded with
    tok: Any = None  # the bundle's tokenizer


def load_bench(ctx: StageContext) -> Bench:
    """The bundle checked and loaded into the runtime, and the prompts encoded with its tokenizer."""
    import torch

    from trtspec.draft_families import load_drafter
    from trtspec.models import load_tokenizer
    from trtspec.runtime import DraftSpec, load_target
    from trtspec.runtime.settings import RuntimeSettings
    from trtspec.targets import read_family

    d, bundle = ctx.cfg.draft, ctx.inputs["export"]
    check_bundle(bundle)
    target_dir = bundle / "target"
    tok = load_tokenizer(target_dir)
    rows = load_prompt_rows(ctx)
    prompts = [encode_row(tok, r) for r in rows]
    eos = eos_ids(target_dir, tok)
    settings = RuntimeSettings(compile=ctx.cfg.validate_.compile)
    target, dq_notes = load_target(target_dir, torch.float32, settings)
    target_family = read_family(target_dir).name
    check_context_length(rows, prompts, ctx.cfg.eval.max_new_tokens, target.args.max_positions)
    drafter = load_drafter(bundle / "draft", target, settings=settings)
    spec = DraftSpec(shape=d.shape, k=d.length, topk=d.tree_topk, total=d.tree_total_tokens, suffix_len=d.suffix_len)
    return Bench(rows, prompts, eos, target, dq_notes, drafter, spec, family=target_family, settings=settings, tok=tok)


def timed_methods(ctx: StageContext, b: Bench, hf: Any) -> tuple[dict[str, Any], list[str], dict, dict]:
    """The generation methods timed against each other (prompt -> tokens), those among them that draft, and HF
    assisted generation's skipped methods and notes; b.drafters gets each drafting method's drafter."""
    import torch

    from trtspec.runtime import generate, speculative_decode
    from trtspec.runtime.suffix import SuffixDrafter, SuffixThenModelDrafter

    d, n_new, target, spec, eos = ctx.cfg.draft, ctx.cfg.eval.max_new_tokens, b.target, b.spec, b.eos
    methods: dict[str, Any] = {
        "hf_generate": lambda p: hf_answer(hf, p, n_new, eos),
        "runtime_no_draft": lambda p: generate(target, torch.tensor(p), n_new, eos),
        "speculative": lambda p: speculative_decode(target, b.drafter, torch.tensor(p), n_new, spec, eos),
    }
    b.drafters["speculative"] = b.drafter
    if d.suffix_len:  # suffix drafting alone, and a long suffix match in front of the head
        suffix_alone, suffix_first = SuffixDrafter(), SuffixThenModelDrafter(b.drafter, SuffixDrafter(min_match=d.suffix_min_match))
        methods["suffix"] = lambda p: speculative_decode(target, suffix_alone, torch.tensor(p), n_new, spec, eos)
        methods["eagle3_suffix"] = lambda p: speculative_decode(target, suffix_first, torch.tensor(p), n_new, spec, eos)
        b.drafters.update(suffix=suffix_alone, eagle3_suffix=suffix_first)
    drafting = [m for m in ("speculative", "suffix", "eagle3_suffix") if m in methods]
    assisted, skipped, method_notes = hf_assisted_methods(ctx.cfg, hf, ctx.model_path, eos)
    methods.update(runnable_comparisons(assisted, b.prompts[0], skipped, ctx.log, methods["hf_generate"],
                                        ctx.cfg.validate_.compare_hf_min_speed))
    return methods, drafting, skipped, method_notes


def compile_runtime(ctx: StageContext, b: Bench, methods: dict[str, Any], drafting: list[str]) -> tuple[float, str]:
    """The runtime's steps compiled before timing (the first generations of each kind trigger it): (seconds, note)."""
    from trtspec.runtime import HFTarget

    if not b.settings.compile:
        return 0.0, "off (validate.compile: false)"
    if isinstance(b.target, HFTarget):
        ctx.log("compiling the draft's passes (torch.compile; ~1 min on a CPU the first time; the target runs its own "
                "HF forward)")
    elif b.target.native_pass:
        ctx.log("compiling the draft's passes (torch.compile; ~1-2 min on a CPU the first time; the target's decode and "
                "verify passes run as one native call each)")
    else:
        ctx.log("compiling the runtime's decode, verify and draft passes (torch.compile; ~1-2 min on a CPU the first time)")
    compile_s, compile_note = warm_up(b.target, [(b.drafter, b.spec)],
                                      lambda: [methods[m](b.prompts[0]) for m in ("runtime_no_draft", *drafting)])
    ctx.log(f"{compile_note} ({compile_s:.0f} s)")
    return compile_s, compile_note


def reference_outputs(ctx: StageContext, b: Bench, hf_outputs: list) -> tuple[list, str, dict | None]:
    """The outputs greedy decoding must equal: HF generate on the original model, or with a quantized target, HF
    with the bundle's dequantized weights; (outputs, how the report names them, the quantization report)."""
    quant_file = ctx.inputs["export"] / "target" / "hf_quant_config.json"
    if not quant_file.is_file():
        return hf_outputs, "HF generate, original model, float32", None
    ctx.log("quantized target: HF reference with the bundle's dequantized weights")
    return quantized_reference(ctx.model_path, quant_file.parent, json.loads(quant_file.read_text()), b.dq_notes, b.rows,
                               b.prompts, hf_outputs, ctx.cfg.eval.max_new_tokens, b.eos)


def sampling_checks(ctx: StageContext, b: Bench) -> dict | None:
    """validate.sampling_temperature: each drafting method's samples against the target's own (chains only:
    sampling from a top-k tree is not lossless)."""
    from trtspec.runtime import DraftSpec

    v, d = ctx.cfg.validate_, ctx.cfg.draft
    if v.sampling_temperature is None:
        return None
    chain = DraftSpec(shape="chain", k=d.length, suffix_len=d.suffix_len)
    return {m: sampling_check(b.target, dr, min(b.prompts, key=len), chain, v.sampling_temperature, b.eos, n=200, seed=ctx.cfg.seed,
                              repeat=m != "speculative") for m, dr in b.drafters.items()}


def context_acceptance(ctx: StageContext, b: Bench) -> list[dict] | None:
    """eval.context_bins: the draft's acceptance at each context length (checks.context_curve), the context
    from the run's training conversations or from documents (suites.context_fill)."""
    from trtspec.suites import context_fill

    e = ctx.cfg.eval
    if not e.context_bins:
        return None
    fill = context_fill(ctx.cfg, ctx.inputs.get("data"))
    ctx.log(f"acceptance by context length ({e.context_source}): bins {e.context_bins}, {e.context_prompts} prompts each")
    prompts = [{"id": r["id"], "messages": r["messages"], **tools_field(r)} for r in b.rows[: e.context_prompts]]
    return context_curve(b.target, b.drafter, prompts, fill, b.tok, sorted(e.context_bins), ctx.cfg.draft.length,
                         e.max_new_tokens, b.eos, log=ctx.log)


def run(ctx: StageContext) -> dict:
    import torch
    from transformers import AutoConfig

    from trtspec.draft_families import family
    from trtspec.models import load_model
    from trtspec.report import write_report
    from trtspec.runtime.kernels import cpu_description, row_labels

    v, d, n_new = ctx.cfg.validate_, ctx.cfg.draft, ctx.cfg.eval.max_new_tokens
    b = load_bench(ctx)
    target, drafter, spec, prompts = b.target, b.drafter, b.spec, b.prompts
    identity = target_identity(AutoConfig.from_pretrained(ctx.inputs["export"] / "target"))
    baseline = read_baseline(ctx.cfg.resolve_path(v.baseline), identity, d.length) if v.baseline else None
    if baseline is not None and not (ctx.cfg.eval.prompts or ctx.cfg.eval.suites):  # held-out prompts: known now
        check_baseline_categories(baseline, {r["category"] for r in b.rows}, v.baseline)
    kernels = target.kernel_choice
    ctx.log(f"{len(prompts)} prompts, {n_new} new tokens, draft {d.shape} k={d.length}, threads {torch.get_num_threads()}")
    native = target.path == "native"
    if native:
        ctx.log("kernels chosen on this machine, by rows: " + ", ".join(f"{n} {c}" for n, c in zip(row_labels(), kernels["by_rows"], strict=True)))
    else:
        ctx.log(f"target family {b.family}: the runtime's HF path (the model's own forward and cache)")

    hf = load_model(ctx.model_path, "float32", "cpu")
    methods, drafting, skipped, method_notes = timed_methods(ctx, b, hf)
    compile_s, compile_note = compile_runtime(ctx, b, methods, drafting)
    timed, bandwidth = time_methods(methods, prompts, ctx.cfg.eval.repeats, kernels)
    for rep in range(ctx.cfg.eval.repeats):
        ctx.log(f"repetition {rep + 1}/{ctx.cfg.eval.repeats}: " + ", ".join(f"{m} {timed[m]['tokens_per_s'][rep]:.1f} tok/s" for m in methods))
    tps, outputs = median_speeds(timed), {m: timed[m]["outputs"] for m in methods}
    decode_tps = median_speeds(timed, "decode_tokens_per_s")  # after each answer's prefill
    reference, reference_name, quant_report = reference_outputs(ctx, b, outputs["hf_generate"])
    acceptance = acceptance_summary(b.rows, outputs["speculative"], d.length, reference)
    for c, speed in category_speeds(b.rows, timed).items():  # the draft's speed where its acceptance is
        acceptance["per_category"][c].update(speed)
    sampling = sampling_checks(ctx, b)
    per_context = context_acceptance(ctx, b)
    source = prompt_source(ctx.cfg)

    report = {
        "runtime": f"trtspec PyTorch speculative runtime ({family(drafter.name).title} from bundle/draft), CPU float32",
        "draft_method": drafter.name,
        "target_family": b.family,
        "target": identity,
        "target_path": "native" if native else "hf",  # which runtime path served the target (trtspec.targets)
        "runtime_compiled": drafter.net.compiled is not None,
        "compile": {"seconds": compile_s, "note": compile_note},
        "runtime_settings": dataclasses.asdict(b.settings),
        "bundle": str(ctx.inputs["export"]),
        "prompts": len(prompts),
        "prompt_source": source,
        "prompts_per_source": dict(Counter(r.get("suite", source) for r in b.rows)),
        "max_new_tokens": n_new,
        "draft_len": d.length,
        "draft_shape": d.shape,
        "verify_rows": spec.max_nodes(),  # rows the target verifies a step at most: the draft and its root
        "threads": torch.get_num_threads(),
        "reference": reference_name,
        "greedy_match": greedy_match(b.rows, outputs, reference),
        "quantization": quant_report,
        **acceptance,
        "tokens_per_s": tps,
        "decode_tokens_per_s": decode_tps,
        "repeats": ctx.cfg.eval.repeats,
        "run_seconds": {m: timed[m]["run_seconds"] for m in methods},
        "skipped": skipped,
        "method_notes": method_notes,
        **speed_summary(tps, acceptance["acceptance_length"], kernels, bandwidth,
                        decode_tps,
                        timed["runtime_no_draft"].get("decode_runs"), step_cost_by_bytes(target, drafter, spec) if native else None,
                        step_cost_by_products(target, drafter, spec) if native else None),
        "drafting": drafting_summary(outputs, reference, tps, drafting, d.suffix_len) if len(drafting) > 1 else None,
        "sampling_check": sampling,
        "per_context": per_context,
        "machine": cpu_description(),
        "kernels": {"target": kernels, "draft": drafter.net.kernel_choice},
    }
    report["gates"] = check_gates(v, report, baseline)
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
