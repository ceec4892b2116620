"""The engine stage: load the bundle in a serving engine and run the same checks as validate, through that engine.

engine.backend=pytorch (default): TensorRT-LLM's LLM API, LLM(model=bundle/target, speculative_config=...) built
from the bundle's llm_api_options.yaml — the very file trtllm-serve and Triton use; EAGLE-3, draft-target and
n-gram drafting all run on its PyTorch backend. Measured: load time, GPU memory, greedy outputs vs Hugging Face
generate on the original model, acceptance length from TensorRT-LLM's accepted/drafted token counts, tokens/s
against TensorRT-LLM without speculation and against HF generate, at engine.batch_sizes. Without tensorrt_llm or
a GPU the stage is skipped (exit 3). engine.backend=vllm: the same checks in vLLM (its CPU build runs here);
engine.backend=auto: TensorRT-LLM where it and a GPU exist, else vLLM where it is installed.
Multi-GPU: serve.tensor_parallel_size; LLM(...) spawns its own MPI workers on one node. On Slurm or
several nodes run under `srun/mpirun -n N trtllm-llmapi-launch trtspec engine CONFIG --out RUN`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from trtspec.chat import encode_prompt
from trtspec.deploy import trtllm
from trtspec.deploy.serving import llm_api_options, read_options, speculative_options
from trtspec.errors import ArtifactError
from trtspec.generation import compare, hf_greedy, tokens_per_s
from trtspec.models import resolve_model
from trtspec.pipeline.stage import StageContext, StageSkipped

UPSTREAM = ("export",)
# engine.batch_sizes and the eval sizes are measurement only: they redo this stage, not the bundle
READS = ("engine", "eval.num_prompts", "eval.max_new_tokens")


def models_read(cfg: Any) -> list[tuple[str, str]]:
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


def environment_key() -> dict:
    """Part of the stage fingerprint: a machine that gains tensorrt_llm, vllm or a GPU re-attempts the stage."""
    from trtspec.deploy import vllm_engine

    return {"tensorrt_llm": trtllm.version(), "vllm": vllm_engine.version(), "cuda": trtllm.cuda_available()}


def resolve_backend(backend: str) -> tuple[str | None, str]:
    """(the engine that runs the bundle here, why); (None, why) when the configured one (or, for auto, neither)
    can run. auto: TensorRT-LLM where it and a GPU exist, else vLLM where it is installed."""
    from trtspec.deploy import vllm_engine

    trt_ok, trt_why = trtllm.availability()
    if backend == "pytorch" or (backend == "auto" and trt_ok):
        return ("pytorch", trt_why) if trt_ok else (None, f"{trt_why}; the bundle's serve.sh and triton/ run on a GPU server")
    vllm_ok, vllm_why = vllm_engine.availability()
    if backend == "auto":
        return ("vllm", f"{trt_why}: {vllm_why} instead") if vllm_ok else (None, f"{trt_why}; {vllm_why}")
    return ("vllm", vllm_why) if vllm_ok else (None, f"{vllm_why}; the bundle's snippets/vllm.sh serves it wherever vLLM is installed")


def run(ctx: StageContext) -> dict:
    backend, why = resolve_backend(ctx.cfg.engine.backend)
    if backend is None:
        raise StageSkipped(why)
    if ctx.cfg.engine.backend == "auto":
        ctx.log(f"engine.backend auto: {why}")
    if backend == "vllm":
        return run_vllm(ctx, ctx.inputs["export"])
    return run_llm_api(ctx, ctx.inputs["export"])


# --- inputs ---------------------------------------------------------------------------------------


def prompt_ids(target: Path, n: int) -> list[list[int]]:
    from trtspec.models import load_tokenizer

    tok = load_tokenizer(target)
    return [encode_prompt(tok, [{"role": "user", "content": p}]) for p in (PROMPTS * (n // len(PROMPTS) + 1))[:n]]


def options_for(ctx: StageContext, bundle: Path) -> dict:
    """The LLM-API options: the bundle's llm_api_options.yaml for EAGLE-3, the same builder for the others."""
    s = ctx.cfg.serve
    if s.decoding != "eagle3":
        draft = str(resolve_model(s.draft_model)) if s.draft_model else "./draft"
        return llm_api_options(ctx.cfg, draft, decoding=s.decoding)
    from trtspec.artifacts import read_json

    options = read_options(bundle)
    aux = read_json(bundle / "draft" / "config.json")["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    want = speculative_options(ctx.cfg, "./draft", "eagle3", aux)
    if options["speculative_config"] != want:
        raise ArtifactError(
            f"{bundle}/llm_api_options.yaml was written for other engine settings ({options['speculative_config']})",
            "re-run the export stage with --force so the bundle matches the engine section",
        )
    return options


# --- measuring ------------------------------------------------------------------------------------


def trt_generate(llm: Any, prompts: list[list[int]], params: Any) -> list[Any]:
    return list(llm.generate(prompts, params))


def trt_tokens_per_s(llm: Any, prompts: list[list[int]], params: Any, batch_size: int) -> float:
    return tokens_per_s(lambda batch: [list(o.outputs[0].token_ids) for o in trt_generate(llm, batch, params)], prompts, batch_size)


def sampling_params(SamplingParams: type, max_tokens: int) -> Any:
    try:
        return SamplingParams(max_tokens=max_tokens, temperature=0.0, return_perf_metrics=True)
    except TypeError:  # releases without per-request perf metrics
        return SamplingParams(max_tokens=max_tokens, temperature=0.0)


def acceptance(outputs: list[Any], draft_per_step: int) -> dict:
    """Acceptance from TensorRT-LLM's counters.

    Each decoding step drafts `draft_per_step` tokens; the target verifies them in one forward and emits the
    accepted ones plus one of its own. So steps = drafted / draft_per_step and
    acceptance length AL = tokens per step = (accepted + steps) / steps = 1 + accepted / steps."""
    counts = [c for c in (trtllm.spec_metrics(o) for o in outputs) if c is not None]
    if not counts:
        return {"acceptance_length": None, "acceptance_note": "this TensorRT-LLM release reports no draft counters"}
    accepted, drafted = sum(c[0] for c in counts), sum(c[1] for c in counts)
    steps = drafted / draft_per_step
    return {
        "acceptance_length": round(1 + accepted / steps, 3) if steps else None,
        "acceptance_rate": round(accepted / drafted, 4) if drafted else None,
        "accepted_draft_tokens": accepted,
        "draft_tokens": drafted,
    }


def hf_reference(source: Path, prompts: list[list[int]], max_new: int, batch_sizes: list[int], dtype: str) -> dict:
    """Greedy outputs (one prompt at a time) and tokens/s of HF generate on the original model."""
    import torch

    from trtspec.models import load_model, load_tokenizer

    model, tok = load_model(source, dtype), load_tokenizer(source)
    eos = model.generation_config.eos_token_id

    def generate(batch: list[list[int]]) -> list[list[int]]:
        return hf_greedy(model, batch, max_new, eos if isinstance(eos, list) else [eos], tok.pad_token_id)

    with torch.inference_mode():
        outputs = [generate([p])[0] for p in prompts]
        speed = {bs: tokens_per_s(generate, prompts, bs) for bs in batch_sizes}
    return {"outputs": outputs, "tokens_per_s": speed}


def speed_table(spec: dict[int, float], base: dict[int, float], hf: dict[int, float], engine: str) -> dict[str, dict]:
    """{batch size: tokens/s with the draft, without it (same engine), HF generate's, and the ratios}."""
    return {
        str(bs): {
            "tokens_per_s": round(spec[bs], 1),
            f"{engine}_base_tokens_per_s": round(base[bs], 1),
            "hf_tokens_per_s": round(hf[bs], 1),
            f"speedup_vs_{engine}": round(spec[bs] / base[bs], 3),
            "speedup_vs_hf": round(spec[bs] / hf[bs], 3),
        }
        for bs in spec
    }


# --- PyTorch backend (LLM API) --------------------------------------------------------------------


def run_llm_api(ctx: StageContext, bundle: Path) -> dict:
    from tensorrt_llm import LLM, SamplingParams

    e = ctx.cfg.engine
    options = options_for(ctx, bundle)
    spec = options["speculative_config"]
    target = bundle / "target"
    prompts = prompt_ids(target, ctx.cfg.eval.num_prompts)
    params = sampling_params(SamplingParams, ctx.cfg.eval.max_new_tokens)
    ctx.log(f"tensorrt_llm {trtllm.version()}: LLM({target.name}, {spec['decoding_type']}, max_draft_len={spec['max_draft_len']}, "
            f"tp={options.get('tensor_parallel_size', 1)})")

    t0 = time.perf_counter()
    llm = LLM(**trtllm.llm_kwargs(options, target, bundle))
    load_s = time.perf_counter() - t0
    trt_generate(llm, prompts[:1], params)  # warm-up (CUDA graphs, autotuning)
    gpu_gib = trtllm.gpu_memory_used_gib()
    spec_out = trt_generate(llm, prompts, params)
    spec_tokens = [list(o.outputs[0].token_ids) for o in spec_out]
    acc = acceptance(spec_out, spec.get("max_total_draft_tokens") or spec["max_draft_len"])
    spec_tps = {bs: trt_tokens_per_s(llm, prompts, params, bs) for bs in e.batch_sizes}
    llm.shutdown()

    ctx.log("TensorRT-LLM without speculation")
    base = LLM(**trtllm.llm_kwargs(options, target, bundle, speculative=False))
    base_tokens = [list(o.outputs[0].token_ids) for o in trt_generate(base, prompts, params)]
    base_tps = {bs: trt_tokens_per_s(base, prompts, params, bs) for bs in e.batch_sizes}
    base.shutdown()

    ctx.log("Hugging Face generate on the original model")
    hf = hf_reference(ctx.model_path, prompts, ctx.cfg.eval.max_new_tokens, e.batch_sizes, ctx.cfg.model.dtype)

    speed = speed_table(spec_tps, base_tps, hf["tokens_per_s"], "trtllm")
    vs_hf, vs_base = compare(spec_tokens, hf["outputs"]), compare(spec_tokens, base_tokens)
    bs0 = str(e.batch_sizes[0])
    al = acc["acceptance_length"]
    headline = (
        f"TensorRT-LLM {trtllm.version()}: AL {al if al is not None else 'n/a'}, "
        f"{speed[bs0]['speedup_vs_trtllm']}x vs TRT-LLM, {speed[bs0]['speedup_vs_hf']}x vs HF at bs {bs0}; "
        f"greedy = HF on {vs_hf['exact']}/{vs_hf['total']}"
    )
    return {
        "headline": headline,
        "backend": "pytorch",
        "decoding": ctx.cfg.serve.decoding,
        "llm_api_options": options,
        "versions": {"tensorrt_llm": trtllm.version(), **_torch_versions()},
        "load_s": round(load_s, 2),
        "gpu_memory_gib": gpu_gib,
        **acc,
        "greedy_vs_hf": vs_hf,
        "greedy_vs_trtllm_base": vs_base,
        "speed": speed,
        "prompts": len(prompts),
        "max_new_tokens": ctx.cfg.eval.max_new_tokens,
    }


def _torch_versions() -> dict:
    import torch

    return {"torch": torch.__version__, "cuda": torch.version.cuda,
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


# --- vLLM ------------------------------------------------------------------------------------------


def crossover(speed: dict[str, dict], engine: str) -> str:
    """Where speculation stops paying, in words: 'pays at 1-8 concurrent requests; costs at 32 (0.64x)'."""
    pays = [bs for bs, row in speed.items() if row[f"speedup_vs_{engine}"] >= 1]
    costs = [f"{bs} ({row[f'speedup_vs_{engine}']}x)" for bs, row in speed.items() if row[f"speedup_vs_{engine}"] < 1]
    parts = [f"pays at {', '.join(pays)} concurrent request(s)"] if pays else []
    parts += [f"costs at {', '.join(costs)}"] if costs else []
    return "; ".join(parts)


def run_vllm(ctx: StageContext, bundle: Path) -> dict:
    from trtspec.deploy import vllm_engine

    e = ctx.cfg.engine
    options = options_for(ctx, bundle)
    k = options["speculative_config"]["max_draft_len"]
    target = bundle / "target"
    prompts = prompt_ids(target, ctx.cfg.eval.num_prompts)
    ctx.log(f"vllm {vllm_engine.version()}: {len(prompts)} prompts, EAGLE-3 k={k}, batch sizes {e.batch_sizes}")
    spec = vllm_engine.measure(target, bundle / "draft", k, prompts, ctx.cfg.eval.max_new_tokens, e.batch_sizes)
    ctx.log("vLLM without speculation")
    base = vllm_engine.measure(target, None, k, prompts, ctx.cfg.eval.max_new_tokens, e.batch_sizes)
    ctx.log("Hugging Face generate on the original model")
    hf = hf_reference(ctx.model_path, prompts, ctx.cfg.eval.max_new_tokens, e.batch_sizes, ctx.cfg.model.dtype)

    speed = speed_table(spec["tokens_per_s"], base["tokens_per_s"], hf["tokens_per_s"], "vllm")
    vs_hf, vs_base = compare(spec["outputs"], hf["outputs"]), compare(spec["outputs"], base["outputs"])
    acc = spec["acceptance"]
    bs0 = str(e.batch_sizes[0])
    where = crossover(speed, "vllm")
    headline = (f"vLLM {vllm_engine.version()}: AL {acc['acceptance_length']} (k={k}), {speed[bs0]['speedup_vs_vllm']}x vs vLLM "
                f"at bs {bs0}; greedy = HF on {vs_hf['exact']}/{vs_hf['total']}; speculation {where}")
    return {
        "headline": headline,
        "backend": "vllm",
        "decoding": "eagle3",
        "vllm_speculative_config": {"method": "eagle3", "model": "./draft", "num_speculative_tokens": k},
        "versions": {"vllm": vllm_engine.version(), **_torch_versions()},
        "load_s": {"speculative": spec["load_s"], "base": base["load_s"]},
        **acc,
        "greedy_vs_hf": vs_hf,
        "greedy_vs_vllm_base": vs_base,
        "speed": speed,
        "crossover": where,
        "prompts": len(prompts),
        "max_new_tokens": ctx.cfg.eval.max_new_tokens,
    }
