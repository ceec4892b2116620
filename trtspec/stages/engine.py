"""The engine stage: load the bundle in a serving engine and run the same checks as validate, through that engine.

The engines live in trtspec.engines, one package each behind one interface; this stage resolves engine.backend to one
of them once and calls it. engine.backend=trtllm (default): TensorRT-LLM's LLM API, LLM(model=bundle/target, speculative_config=...) built
from the bundle's llm_api_options.yaml — the very file trtllm-serve and Triton use; EAGLE-3, draft-target and
n-gram drafting all run on its PyTorch backend. Measured: load time, GPU memory, greedy outputs vs Hugging Face
generate on the original model, acceptance length from TensorRT-LLM's accepted/drafted token counts, tokens/s
against TensorRT-LLM without speculation and against HF generate, at engine.batch_sizes. Without tensorrt_llm or
a GPU the stage is skipped (exit 3). engine.backend=vllm: the same checks in vLLM (its CPU build runs here, but not a
DSpark draft: vLLM runs method dspark on a GPU only, and the stage is skipped saying so);
engine.backend=auto: TensorRT-LLM where it and a GPU exist, else vLLM where it is installed.
Multi-GPU: serve.tensor_parallel_size; LLM(...) spawns its own MPI workers on one node. On Slurm or
several nodes run under `srun/mpirun -n N trtllm-llmapi-launch trtspec engine CONFIG --out RUN`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtspec import engines
from trtspec.chat import encode_prompt
from trtspec.deploy.serving import llm_api_options, speculative_options
from trtspec.draft_families import family, speculative_method
from trtspec.engines import read_options
from trtspec.engines.worker import in_own_process
from trtspec.errors import ArtifactError
from trtspec.generation import compare, hf_reference
from trtspec.models import resolve_model
from trtspec.pipeline.stage import StageContext, StageSkipped

if TYPE_CHECKING:
    from trtspec.config import BuildConfig

UPSTREAM = ("export",)
# engine.batch_sizes and the eval sizes are measurement only: they redo this stage, not the bundle
READS = ("engine", "eval.num_prompts", "eval.max_new_tokens")


def models_read(cfg: BuildConfig) -> list[tuple[str, str]]:
    """A draft-target deployment's draft model, checked before the first stage."""
    return [("serve.draft_model", cfg.serve.draft_model)] if cfg.serve.decoding == "draft_target" and cfg.serve.draft_model else []

# built-in prompts (chat-templated with the target's tokenizer); a spread of the usual categories
PROMPTS = [
    "Name three colors and one thing of each color.",
    "What is 12 plus 30? Explain the steps.",
    "Write a haiku about rain.",
    "Explain what a CPU does in two sentences.",
    "Write a Python function that adds two numbers.",
    "Say hello to a friend who just moved to a new city.",
    "List the days of the week.",
    "Summarize why the sky is blue.",
    "Translate 'good morning' into French and Spanish.",
    "Give three tips for writing clear emails.",
    "What is the capital of Japan, and what is it known for?",
    "Write a short story opening about a lighthouse.",
    "Explain recursion to a beginner.",
    "What are the planets of the solar system?",
    "Describe how to make a cup of tea.",
    "Why do we have seasons?",
]


def preflight(cfg: BuildConfig, model_config: Any) -> None:
    """engine.backend naming an engine that serves no draft of this build's kind for the target's family
    (engines/<name>/support.py), engine.sweep without what it drives (check_sweep): one line before any stage spends
    minutes (backend auto skips the stage with the same reason and goes on)."""
    from trtspec.errors import ConfigError

    if cfg.engine.sweep:
        check_sweep(cfg)
    if cfg.engine.backend == "auto" or cfg.serve.decoding != "draft":
        return
    if "backend" in cfg.engine.model_fields_set and (why := family(cfg.draft.method).no_engine):  # named, not the default
        raise ConfigError(f"engine.backend {cfg.engine.backend} cannot serve this build: {why}",
                          "set engine.backend: auto (the engine stage is then skipped with this reason)")
    method = family(cfg.draft.method).engine_method(cfg)
    if why := engines.engine(cfg.engine.backend).build_refusal(model_config, method):
        raise ConfigError(f"engine.backend {cfg.engine.backend} cannot serve this build: {why}",
                          "set engine.backend: auto (the engine stage is then skipped with this reason) or stop the build "
                          "before the engine (--until export)")


def check_sweep(cfg: BuildConfig) -> None:
    """engine.sweep needs vLLM (backend vllm or auto), an EAGLE-3 bundle served as such, and for sweep_method aiperf
    the load generator."""
    from trtspec.engines.vllm.sweep import find_aiperf
    from trtspec.errors import ConfigError

    if cfg.engine.backend == "trtllm" or cfg.serve.decoding != "draft" or cfg.draft.method != "eagle3":
        raise ConfigError("engine.sweep runs the bundle's EAGLE-3 head in vLLM (engine.backend vllm or auto, "
                          f"serve.decoding draft); here engine.backend is {cfg.engine.backend}, "
                          f"serve.decoding {cfg.serve.decoding}, draft.method {cfg.draft.method}",
                          "set engine.backend: vllm, or engine.sweep: null")
    if cfg.engine.sweep_method == "aiperf":
        find_aiperf()
    check_sweep_memory(cfg)


def engines_that_fit(cfg: BuildConfig) -> int:
    """How many of the sweep's vLLM engines the memory free now holds at once on a CPU (0: all, and on a GPU, whose
    engines size themselves): the sweep loads its draft lengths in groups of that many (sweep.groups_of)."""
    import torch

    from trtspec.runtime.kernels import available_memory_mb

    free_mb = available_memory_mb()
    if torch.cuda.is_available() or free_mb is None:
        return 0
    from trtspec.engines import vllm as vllm_engine
    from trtspec.engines.vllm.sweep import engine_sizes

    target, kv, engines = engine_sizes(cfg)
    fit = int(free_mb / 1024 // vllm_engine.engines_memory_gib(target, 1, kv))
    return 0 if fit >= engines else fit


def check_sweep_memory(cfg: BuildConfig) -> None:
    """A sweep loads its draft lengths' engines together, in groups where the memory free cannot hold them all
    (engines_that_fit); refused in one line, before any stage runs, when it cannot hold no draft and one length."""
    from trtspec.engines import vllm as vllm_engine
    from trtspec.errors import ConfigError

    fit = engines_that_fit(cfg)
    if fit == 0 or fit >= 2:
        return
    from trtspec.engines.vllm.sweep import engine_sizes

    target, kv, _ = engine_sizes(cfg)
    raise ConfigError(f"engine.sweep compares each draft length with no draft, two vLLM engines of the target at once, "
                      f"about {vllm_engine.engines_memory_gib(target, 2, kv)} GiB (weights, {kv} GiB of KV cache and vLLM's own "
                      f"~{vllm_engine.ENGINE_OWN_GIB} GiB each), more than the memory free here holds",
                      "lower the concurrencies (engine.sweep), or run the sweep on a machine with more memory")


def environment_key() -> dict:
    """Part of the stage fingerprint: a machine that gains tensorrt_llm, vllm or a GPU re-attempts the stage."""
    return engines.environment_key()


def run(ctx: StageContext) -> dict:
    if no_engine := ctx.manifests.get("export", {}).get("metrics", {}).get("no_engine"):  # a draft no engine loads as trained
        raise StageSkipped(no_engine)
    eng, why = engines.resolve(ctx.cfg.engine.backend)
    if eng is None:
        raise StageSkipped(why)
    bundle = ctx.inputs["export"]
    method = speculative_method(bundle / "draft") if ctx.cfg.serve.decoding == "draft" else None
    if refused := eng.refusal(bundle / "target", method):
        raise StageSkipped(refused)
    if ctx.cfg.engine.backend == "auto":
        ctx.log(f"engine.backend auto: {why}")
    return measure_engine(ctx, ctx.inputs["export"], eng)


# --- inputs ---------------------------------------------------------------------------------------


def prompt_ids(target: Path, n: int) -> list[list[int]]:
    from trtspec.models import load_tokenizer

    tok = load_tokenizer(target)
    return [encode_prompt(tok, [{"role": "user", "content": p}]) for p in (PROMPTS * (n // len(PROMPTS) + 1))[:n]]


def options_for(ctx: StageContext, bundle: Path) -> dict:
    """The LLM-API options: the bundle's llm_api_options.yaml for EAGLE-3, the same builder for the others."""
    s = ctx.cfg.serve
    if s.decoding != "draft":
        draft = str(resolve_model(s.draft_model)) if s.draft_model else "./draft"
        return llm_api_options(ctx.cfg, draft, decoding=s.decoding)
    from trtspec.artifacts import read_json

    options = read_options(bundle)
    # an EAGLE-3 head's aux layers; a block drafter's (DFlash, DSpark) are in its dflash_config, which no option names
    aux = (read_json(bundle / "draft" / "config.json").get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    want = speculative_options(ctx.cfg, "./draft", "draft", aux, family(ctx.cfg.draft.method))
    if options["speculative_config"] != want:
        raise ArtifactError(
            f"{bundle}/llm_api_options.yaml was written for other engine settings ({options['speculative_config']})",
            "re-run the export stage with --force so the bundle matches the engine section",
        )
    return options


# --- measuring: one engine interface (trtspec.engines) ----------------------------------------------------


def measure_engine(ctx: StageContext, bundle: Path, engine: engines.Engine) -> dict:
    """The bundle in the engine with its draft and without, and HF generate on the original model, same prompts."""
    e, new = ctx.cfg.engine, ctx.cfg.eval.max_new_tokens
    options = options_for(ctx, bundle)
    prompts = prompt_ids(bundle / "target", ctx.cfg.eval.num_prompts)
    # HF first: vLLM's Transformers backend (OLMo 2, SmolLM3, ...) swaps transformers' layers for its own in the
    # process, after which transformers cannot build the model by itself
    ctx.log("Hugging Face generate on the original model")
    hf = hf_reference(ctx.model_path, prompts, new, e.batch_sizes, ctx.cfg.model.dtype)
    ctx.log(f"{engine.describe(options)}; {len(prompts)} prompts, batch sizes {e.batch_sizes}")
    run = in_own_process if engine.own_process(bundle / "target") else in_this_process
    ctx.log(f"{engine.NAME} with the draft and without it")
    both = run(engine.run_bundle, bundle, options, prompts, new, e.batch_sizes)
    spec, base = both["speculative"], both["base"]
    report = engine_report(ctx, engine, options, spec, base, hf)
    if engine.SHORT == "vllm" and ctx.cfg.serve.decoding == "draft" and report.get("acceptance_length"):
        ctx.log("trtspec's runtime on the same prompts, for its acceptance length beside the engine's")
        report["runtime_agreement"] = runtime_agreement(bundle, prompts, new, options, report["acceptance_length"])
    if e.sweep:
        report["sweep"] = serving_sweep(ctx, bundle, engine)
        report["headline"] += f"; sweep: {report['sweep'].get('decided') or report['sweep'].get('skipped')}"
    return report


def serving_sweep(ctx: StageContext, bundle: Path, engine: engines.Engine) -> dict:
    """engine.sweep: the bundle in vLLM at each draft length and concurrency, in lockstep in this process or in its
    OpenAI server under aiperf (engine.sweep_method; trtspec.engines.vllm.sweep); engine/sweep.json keeps the rows and the
    schedule they imply, for deploy --drafting auto."""
    from trtspec.artifacts import output_fingerprint, write_json
    from trtspec.draft_schedule import SWEEP_FILE
    from trtspec.engines.vllm import sweep

    e, k = ctx.cfg.engine, ctx.cfg.draft.length
    if engine.SHORT != "vllm" or ctx.cfg.serve.decoding != "draft":
        return {"skipped": f"engine.sweep runs the bundle's draft in vLLM; here the engine is "
                           f"{engine.SHORT} and decoding {ctx.cfg.serve.decoding}"}
    plan = sweep.SweepPlan(sorted(set(e.sweep)), sorted(set(e.sweep_draft_lengths or range(k + 1))), e.sweep_max_tokens,
                           min_requests=16, repeats=e.sweep_repeats, together=engines_that_fit(ctx.cfg))
    ctx.log(f"concurrency sweep ({e.sweep_method}): concurrency {plan.concurrency} x draft lengths {plan.draft_lengths}")
    if e.sweep_method == "lockstep":
        prompts = prompt_ids(bundle / "target", len(PROMPTS))
        own = engine.own_process(bundle / "target")
        log = {} if own else {"log": ctx.log}  # a spawned process prints its progress
        result = (in_own_process if own else in_this_process)(sweep.lockstep_sweep, bundle, prompts, plan, **log)
    else:
        sweep.write_prompts(PROMPTS, ctx.out / "sweep_prompts.jsonl")
        pool = sweep.ServerPool(bundle, plan, ctx.work / "sweep", sweep.find_aiperf(), ctx.out / "sweep_prompts.jsonl", ctx.log)
        result = sweep.run_sweep(pool, plan, log=ctx.log)
    result["bundle"] = output_fingerprint(ctx.manifests["export"])
    write_json(ctx.out / SWEEP_FILE, result)
    ctx.log("concurrency sweep:\n" + result["table"] + f"\nschedule: {result['schedule']} ({result['decided']})")
    return {key: result[key] for key in ("kind", "schedule", "decided", "crossover", "table")}


def runtime_agreement(bundle: Path, prompts: list[list[int]], new: int, options: dict, engine_al: float) -> dict:
    """trtspec's runtime (eager, greedy chains of the engine's draft length) on the engine's prompts: its acceptance
    length against the engine's counters (the same draft on the same prompts accepts the same tokens, up to
    rounding of the two implementations' numbers) -> {runtime AL, engine AL / runtime AL, the runtime's path}."""
    import torch

    from trtspec.draft_families import load_drafter
    from trtspec.generation import eos_ids
    from trtspec.models import load_tokenizer
    from trtspec.runtime import DraftSpec, load_target, speculative_on_prompts

    target, _ = load_target(bundle / "target", torch.float32)
    drafter = load_drafter(bundle / "draft", target, weights="float32")
    k = options["speculative_config"]["max_draft_len"]
    eos = eos_ids(bundle / "target", load_tokenizer(bundle / "target"))
    _, stats = speculative_on_prompts(target, drafter, prompts, new, DraftSpec(shape="chain", k=k), eos)
    al = stats.acceptance_length()
    return {"runtime_acceptance_length": round(al, 4), "engine_over_runtime": round(engine_al / al, 4), "runtime_path": target.path}


def in_this_process(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """fn(*args, **kwargs) here, then what its engines left in reference cycles collected now: vLLM's CPU GEMM handles
    collected later, under the inductor compile of validate's draft, print tracebacks from their destructors."""
    import gc

    result = fn(*args, **kwargs)
    gc.collect()
    return result


def speed_table(spec: dict, base: dict, hf: dict[int, float], engine: str) -> dict[str, dict]:
    """{batch size: tokens/s with the draft, without it (same engine), HF generate's, the ratios, and where the
    engine reports them (`latency_ms`) time to first token and inter-token latency with and without the draft}."""
    table = {}
    for bs, tps in spec["tokens_per_s"].items():
        base_tps = base["tokens_per_s"][bs]
        row = {"tokens_per_s": round(tps, 1), f"{engine}_base_tokens_per_s": round(base_tps, 1),
               "hf_tokens_per_s": round(hf[bs], 1), f"speedup_vs_{engine}": round(tps / base_tps, 3),
               "speedup_vs_hf": round(tps / hf[bs], 3)}
        for run, prefix in ((spec, ""), (base, f"{engine}_base_")):
            row.update({prefix + k: v for k, v in run.get("latency_ms", {}).get(bs, {}).items()})
        table[str(bs)] = row
    return table


def crossover(speed: dict[str, dict], engine: str) -> str:
    """Where speculation stops paying, in words: 'pays at 1-8 concurrent requests; costs at 32 (0.64x)'."""
    pays = [bs for bs, row in speed.items() if row[f"speedup_vs_{engine}"] >= 1]
    costs = [f"{bs} ({row[f'speedup_vs_{engine}']}x)" for bs, row in speed.items() if row[f"speedup_vs_{engine}"] < 1]
    parts = [f"pays at {', '.join(pays)} concurrent request(s)"] if pays else []
    parts += [f"costs at {', '.join(costs)}"] if costs else []
    return "; ".join(parts)


def engine_report(ctx: StageContext, engine: engines.Engine, options: dict, spec: dict, base: dict, hf: dict) -> dict:
    """The stage's metrics: greedy agreement with HF and with the engine alone, acceptance, speed by batch size."""
    short, e = engine.SHORT, ctx.cfg.engine
    speed = speed_table(spec, base, hf["tokens_per_s"], short)
    vs_hf, vs_base = compare(spec["outputs"], hf["outputs"]), compare(spec["outputs"], base["outputs"])
    acc, bs0, where = spec["acceptance"], str(e.batch_sizes[0]), crossover(speed, short)
    al = acc.get("acceptance_length")
    headline = (f"{engine.NAME} {engine.version()}: AL {al if al is not None else 'n/a'}, "
                f"{speed[bs0][f'speedup_vs_{short}']}x vs {engine.NAME}, {speed[bs0]['speedup_vs_hf']}x vs HF at bs {bs0}; "
                f"greedy = HF on {vs_hf['exact']}/{vs_hf['total']}; speculation {where}")
    return {
        "headline": headline,
        "backend": engine.SHORT,
        "decoding": ctx.cfg.serve.decoding,
        **engine.report_options(options),
        "versions": {engine.PACKAGE: engine.version(), **_torch_versions()},
        "load_s": {"speculative": spec["load_s"], "base": base["load_s"]},
        "gpu_memory_gib": spec.get("gpu_memory_gib"),
        **acc,
        "greedy_vs_hf": vs_hf,
        f"greedy_vs_{short}_base": vs_base,
        "speed": speed,
        "crossover": where,
        "prompts": len(spec["outputs"]),
        "max_new_tokens": ctx.cfg.eval.max_new_tokens,
    }


def _torch_versions() -> dict:
    import torch

    return {"torch": torch.__version__, "cuda": torch.version.cuda,
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
