"""How trtspec times things and what the numbers mean: one measurement harness, used by the validate stage and by
every benchmark script, so that every number trtspec reports is measured one way.

- Timing: `timed` (a call's result and its wall seconds), `step_ms` (ms per decode or speculative step of a runtime
  generation, its prefill excluded), `ms_per_call` (ms per call over calls back to back), `tokens_per_s` (batches
  submitted together), `interleaved` (every prompt through every method in turn, so machine noise hits all alike),
  `time_methods` (interleaved repetitions with the memory bandwidth sampled among the runs) and `median_speeds`.
- Warm-up: `warm_up` compiles the runtime's passes (runtime.compile_steps) on every row count each draft verifies
  and drafts, then on the generations that will be timed, so that no compilation lands inside a timed run.
- Bandwidth: `memory_bandwidth` (what bounds a memory-bound decode step) and `bandwidth_during` (one figure from the
  samples taken among the timed runs: a shared host's bandwidth moves within minutes).
- Step cost: what one speculative step costs in plain decode steps if each pass cost its weights' bytes alone
  (`step_cost_by_bytes`), or with the verify pass at its products' load-time timing (`products_cost`,
  `step_cost_by_products`).
- Speed limits: `speed_limits` (the decode limit bandwidth / weight bytes, and how close the runtime comes) and
  `speed_summary` (speedups against HF generate and the runtime without a draft, and those limits).

Nothing heavy is imported here at module import time (torch and the runtime are imported by the functions that use
them). The runtime's kernels and their load-time choice stay in runtime/kernels.py (so does `weight_mb`, which that
choice reports).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from torch import nn

T = TypeVar("T")

# ---------------------------------------------------------------------------------------------- timing


def timed(run: Callable[[], T]) -> tuple[T, float]:
    """`run()`'s result and the wall seconds it took (perf_counter): every timed call in trtspec is read this way."""
    t0 = time.perf_counter()
    out = run()
    return out, time.perf_counter() - t0


def step_ms(generation: Any, seconds: float, steps: int | None = None) -> float:
    """Milliseconds per decode (or speculative) step of a runtime generation that took `seconds` in all: its prefill
    (`generation.prefill_s`, the prompt's pass and first token) excluded, divided by `steps` (default
    `generation.stats.steps`, the target passes after the prefill), so that "a step's time" means one thing."""
    return (seconds - generation.prefill_s) / (generation.stats.steps if steps is None else steps) * 1e3


def ms_per_call(fn: Callable[[], object], n: int) -> float:
    """Milliseconds per call of `fn` over `n` calls back to back, one clock reading around them all (for calls too
    short to time one by one)."""
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e3


def chunks(items: list, size: int) -> list[list]:
    """Consecutive batches of `size`, cycling the items so there is at least one full batch."""
    items = (items * (size // len(items) + 1))[: max(size, len(items))]
    return [items[i : i + size] for i in range(0, len(items), size)]


def tokens_per_s(generate: Callable[[list[list[int]]], list[list[int]]], prompts: list[list[int]], batch_size: int) -> float:
    """Generated tokens per second with `batch_size` requests submitted together (the engine batches them)."""
    n, t0 = 0, time.perf_counter()
    for batch in chunks(prompts, batch_size):
        n += sum(map(len, generate(batch)))
    return n / (time.perf_counter() - t0)


def interleaved(methods: dict[str, Callable[[list[int]], Any]], prompts: list[list[int]], repeats: int = 1,
                on_run: Callable[[int, int, str], None] | None = None) -> dict[str, dict]:
    """Every prompt through every method in turn, `repeats` times, so machine noise hits all methods alike.

    A method returns a token list or an object with `.tokens` (and `.prefill_s`: the runtime's generations).
    -> {method: {"tokens_per_s": [one per repetition], "outputs": [the first repetition's outputs], "run_seconds":
    [each run's wall time, in the order they ran]}}, and for methods that time their prefill, "decode_tokens_per_s":
    the tokens after the first over the time after the prefill, per repetition, and "decode_runs": the same per run,
    in the order they ran (None for a run that stopped at its first token).
    `on_run(repetition, prompt index, method)` after each run."""
    seconds = {m: [0.0] * repeats for m in methods}
    prefill = {m: [0.0] * repeats for m in methods}
    tokens = {m: [0] * repeats for m in methods}
    runs: dict[str, list[float | None]] = {m: [] for m in methods}
    run_seconds: dict[str, list[float]] = {m: [] for m in methods}
    outputs: dict[str, list] = {m: [] for m in methods}
    for rep in range(repeats):
        for i, p in enumerate(prompts):
            for m, fn in methods.items():
                out, s = timed(partial(fn, p))
                n, f = len(out if isinstance(out, list) else out.tokens), getattr(out, "prefill_s", 0.0)
                seconds[m][rep] += s
                tokens[m][rep] += n
                prefill[m][rep] += f
                runs[m].append((n - 1) / (s - f) if f and n > 1 else None)
                run_seconds[m].append(round(s, 3))
                if rep == 0:
                    outputs[m].append(out)
                if on_run:
                    on_run(rep, i, m)
    result = {m: {"tokens_per_s": [t / s for t, s in zip(tokens[m], seconds[m], strict=True)], "outputs": outputs[m],
                  "run_seconds": run_seconds[m]} for m in methods}
    for m in methods:
        if all(prefill[m]):
            result[m]["decode_tokens_per_s"] = [(t - len(prompts)) / (s - f) for t, s, f in
                                                zip(tokens[m], seconds[m], prefill[m], strict=True)]
            result[m]["decode_runs"] = runs[m]
    return result


def time_methods(methods: dict[str, Any], prompts: list[list[int]], repeats: int, kernels: dict) -> tuple[dict, dict | None]:
    """Interleaved repetitions: every prompt runs every method in turn, so machine noise hits all of them alike.

    For the decode limit the memory bandwidth is sampled among the runs: right before and right after every run of
    the runtime without a draft (each such run is then measured against the bandwidth of its own moment: a shared
    host's moves by tens of percent within a minute), and after each prompt's round.
    -> (interleaved's result, the bandwidth during the runs with "no_draft_runs_gb_per_s": the mean of the samples
    around each no-draft run, in run order; None off a float32 CPU model)."""
    import torch
    from tqdm import tqdm

    on_cpu = "weight_mb" in kernels
    sample = lambda: memory_bandwidth(kernels["one_row"], repeats=3)  # noqa: E731
    order = list(methods)
    before_no_draft = order[order.index("runtime_no_draft") - 1]  # the method that runs just before it (cyclically)
    samples = [sample()] if on_cpu else []
    around: list[float] = []
    bar = tqdm(total=repeats * len(prompts) * len(methods), desc="timed generations", unit="run")

    def after_run(rep: int, i: int, m: str) -> None:
        bar.set_postfix_str(f"rep {rep + 1}, prompt {i + 1}, {m}")
        bar.update()
        if on_cpu and m in (before_no_draft, "runtime_no_draft", order[-1]):
            last = samples[-1]
            samples.append(sample())
            if m == "runtime_no_draft":
                around.append((last["gb_per_s"] + samples[-1]["gb_per_s"]) / 2)

    with torch.inference_mode():
        timed = interleaved(methods, prompts, repeats, after_run)
    bar.close()
    return timed, {**bandwidth_during(samples), "no_draft_runs_gb_per_s": [round(b, 2) for b in around]} if on_cpu else None


def median_speeds(timed: dict, key: str = "tokens_per_s") -> dict[str, float]:
    """{method: median over the repetitions of `key`} for the methods that measured it."""
    return {m: round(statistics.median(t[key]), 2) for m, t in timed.items() if key in t}


# ---------------------------------------------------------------------------------------------- warm-up


def warm_up(target: Any, drafts: list[tuple[Any, Any]], extra: Callable[[], object] | None = None,
            before_draft: Callable[[Any], object] | None = None) -> tuple[float, str]:
    """Compile the runtime's passes before anything is timed (runtime.compile_steps) -> (seconds, what happened).

    The networks compiled: the target's (not an HF target's: it runs its own HF forward, eagerly) and each drafter's
    network in `drafts`. The warm-up runs, for every (drafter, DraftSpec) in `drafts` in turn, the target's verify
    pass and the drafter's passes on every row count that spec verifies (decode.warm_up_row_counts: a graph per run
    of counts that share a product kernel, each compiled on first use), then `extra()`: the generations that will be
    timed, for the graphs of their own shapes. `before_draft(drafter)` runs before each drafter's row counts (e.g. to
    hand the target the layers that draft reads)."""
    from trtspec.runtime import HFTarget, compile_steps
    from trtspec.runtime.decode import warm_up_row_counts

    nets = [] if isinstance(target, HFTarget) else [target]
    for drafter, _ in drafts:
        net = getattr(drafter, "net", None)
        if net is not None and all(net is not n for n in nets):
            nets.append(net)

    def run() -> None:
        for drafter, spec in drafts:
            if before_draft is not None:
                before_draft(drafter)
            warm_up_row_counts(target, drafter, spec)
        if extra is not None:
            extra()

    return compile_steps(nets, run)


# ---------------------------------------------------------------------------------------------- bandwidth


def memory_bandwidth(kernel: str = "linear", mb: int = 512, repeats: int = 5) -> dict:
    """Read bandwidth of this machine in GB/s, two ways: a streaming read (sum over `mb` megabytes, larger than any
    cache) and a matrix-vector product over a weight of that size with `kernel` (what a decode step does). The
    best of each over `repeats`; `gb_per_s` is the larger of the two: the bound a decode step cannot beat."""
    import torch

    from trtspec.runtime.kernels import product

    n = mb * 2**20 // 4
    data = torch.ones(n)
    weight, x = data.view(n // 4096, 4096), torch.ones(1, 4096)
    if kernel == "packed":  # the same ones, seen as panels ([N / 32, K, 32]; N = n / 4096 is a multiple of 32)
        weight = data.view(n // 4096 // 32, 4096, 32)
    best = {"stream_read": 0.0, "gemv": 0.0}
    with torch.inference_mode():
        for _ in range(repeats):
            t0 = time.perf_counter()
            data.sum()
            t1 = time.perf_counter()
            product(x, weight, kernel)
            t2 = time.perf_counter()
            best["stream_read"] = max(best["stream_read"], n * 4 / (t1 - t0) / 1e9)
            best["gemv"] = max(best["gemv"], n * 4 / (t2 - t1) / 1e9)
    return {"stream_read_gb_per_s": round(best["stream_read"], 2), f"gemv_{kernel}_gb_per_s": round(best["gemv"], 2),
            "gb_per_s": round(max(best.values()), 2), "megabytes": mb}


def bandwidth_during(samples: list[dict]) -> dict:
    """One bandwidth from `memory_bandwidth` samples taken between the timed generations: the median of each figure.

    A shared machine's bandwidth moves by tens of percent within minutes (other tenants): a limit measured once,
    before or after, can be far from what the timed decoding had; samples taken among the generations are not."""
    out = {k: round(statistics.median(s[k] for s in samples), 2) for k in samples[0] if k.endswith("gb_per_s")}
    return {**out, "samples_gb_per_s": [s["gb_per_s"] for s in samples], "megabytes": samples[0]["megabytes"]}


# ---------------------------------------------------------------------------------------------- step cost


def step_cost_by_bytes(target: nn.Module, drafter, spec) -> float:
    """What one speculative step would cost in plain decode steps if every pass cost its weights' bytes alone: the
    verify pass reads the target's weights once, as a decode step does (its few rows add no bytes), and each of the
    drafter's passes (`drafter.passes_per_step(spec)`) reads the draft network's; a DSpark draft's Markov head reads
    its projection once per guess."""
    from trtspec.runtime.kernels import weight_mb

    markov = getattr(drafter, "markov", None)
    head_mb = spec.k * weight_mb(markov) if markov is not None else 0.0
    return 1.0 + (drafter.passes_per_step(spec) * weight_mb(drafter.net) + head_mb) / weight_mb(target)


def products_cost(kernel_choice: dict, rows: int) -> float | None:
    """What the target's weight products over `rows` rows cost against one row's, by the load-time timing of the
    kernels chosen (`ms_per_pass`); 9..MANY_ROWS rows on the line through that bucket's kernel at FEW_ROWS and
    TREE_ROWS rows (beyond TREE_ROWS its slope continues). None where nothing was timed (not a float32 CPU model)."""
    from trtspec.runtime.kernels import FEW_ROWS, MANY_ROWS, TREE_ROWS, bucket

    ms, by = kernel_choice.get("ms_per_pass"), kernel_choice["by_rows"]
    if not ms or not 0 < rows <= MANY_ROWS:
        return None
    one, kernel = ms["1_rows"][by[0]], by[bucket(rows)]
    if rows <= FEW_ROWS:
        return ms[f"{rows}_rows"][kernel] / one
    at_few, at_tree = ms[f"{FEW_ROWS}_rows"][kernel], ms[f"{TREE_ROWS}_rows"][kernel]
    return (at_few + (at_tree - at_few) * (rows - FEW_ROWS) / (TREE_ROWS - FEW_ROWS)) / one


def step_cost_by_products(target: nn.Module, drafter, spec) -> float | None:
    """`step_cost_by_bytes` with the verify pass at what its products over its rows (spec.max_nodes()) cost in the
    load-time timing, not at one row's: the same where a few rows stream at the one-row rate, more where each row's
    arithmetic costs (a tree's rows on a CPU of few cores)."""
    verify = products_cost(target.kernel_choice or {"by_rows": []}, spec.max_nodes())
    return None if verify is None else verify - 1.0 + step_cost_by_bytes(target, drafter, spec)


# ---------------------------------------------------------------------------------------------- speed limits


def speed_limits(kernel_choice: dict, bandwidth: dict, no_draft_tps: float, acceptance_length: float,
                 step_cost: float, no_draft_decode_tps: float | None = None, decode_runs: list | None = None,
                 step_cost_ideal: float | None = None, step_cost_products: float | None = None) -> dict:
    """What bounds the runtime's speed on this machine, from what was measured.

    Plain decoding reads every Linear weight once per token (the embedding row and the KV cache are small beside
    them), so decode steps run at most bandwidth / weight bytes tokens/s: `limit_tokens_per_s`.
    `decode_fraction_of_limit` is how close the runtime's decode steps come (tokens after the first over the time
    after the prompt's prefill, which reads the weights once for the whole prompt and is bound by arithmetic
    instead). With `decode_runs` (each no-draft run's decode tokens/s) and the bandwidth sampled around each of those
    runs (`bandwidth["no_draft_runs_gb_per_s"]`), each run is held against its own moment's limit and the fraction is
    the median over runs (`decode_fraction_runs`: all of them); otherwise the median decode speed against the median
    bandwidth. `no_draft_fraction_of_limit`: the same with the prefill's time included (what a user sees per answer).
    `weight_products_share` is the part of a decode step spent in the weight products alone (the rest: attention,
    norms, rope, Python). Speculation multiplies plain decoding by AL / step cost; `step_cost_ideal` is the step's
    cost by bytes (`step_cost_by_bytes`): the overhead beyond it is the runtime's, not the draft's size;
    `step_cost_products` the same with the verify pass's products at their timed cost for its rows
    (`step_cost_by_products`): beyond bytes, what many rows' arithmetic adds on this machine.
    """
    mb = kernel_choice["weight_mb"]
    limit = bandwidth["gb_per_s"] * 1e3 / mb
    decode_tps = no_draft_decode_tps or no_draft_tps
    step_ms = 1e3 / decode_tps
    # the products as fast as the one-row kernel streamed a large weight in the samples among the runs (the load-time
    # timing's rate where none was sampled): the same moment's host as the decode steps
    streamed = bandwidth.get(f"gemv_{kernel_choice.get('one_row')}_gb_per_s") or kernel_choice["gb_per_s_one_row"]
    products_ms = mb / streamed
    around = bandwidth.get("no_draft_runs_gb_per_s") or []
    runs = [round(t / (b * 1e3 / mb), 3) for t, b in zip(decode_runs, around, strict=True) if t] if decode_runs and around else []
    return {
        "weight_mb_per_token": mb, "bandwidth_gb_per_s": bandwidth["gb_per_s"],
        "limit_tokens_per_s": round(limit, 2), "no_draft_tokens_per_s": round(no_draft_tps, 2),
        "no_draft_fraction_of_limit": round(no_draft_tps / limit, 3),
        "decode_tokens_per_s": round(decode_tps, 2),
        "decode_fraction_of_limit": round(statistics.median(runs) if runs else decode_tps / limit, 3),
        "decode_runs_tokens_per_s": [round(t, 2) if t else None for t in decode_runs or []], "decode_fraction_runs": runs,
        "decode_step_ms": round(step_ms, 3), "weight_products_ms": round(products_ms, 3),
        "weight_products_share": round(min(1.0, products_ms / step_ms), 3),
        "acceptance_length": round(acceptance_length, 3), "step_cost_vs_decode": round(step_cost, 3),
        "step_cost_by_bytes": None if step_cost_ideal is None else round(step_cost_ideal, 3),
        "step_cost_by_products": None if step_cost_products is None else round(step_cost_products, 3),
        "speculative_over_no_draft": round(acceptance_length / step_cost, 3),
    }


def speed_summary(tps: dict[str, float], al: float, kernels: dict, bandwidth: dict | None,
                  decode_tps: dict[str, float] | None = None, decode_runs: list | None = None,
                  step_cost_ideal: float | None = None, step_cost_products: float | None = None) -> dict:
    """Speedups against HF generate and against the runtime without a draft, and what limits them
    (`decode_tps`: each runtime method's decode steps alone, without the prompts' prefill; `decode_runs`: the
    no-draft runtime's per run, each held against the bandwidth sampled around it: `speed_limits`)."""
    decode_tps = decode_tps or {}
    out = {
        "speedup_vs_hf": round(tps["speculative"] / tps["hf_generate"], 3),
        "runtime_no_draft_vs_hf": round(tps["runtime_no_draft"] / tps["hf_generate"], 3),
        "speculative_vs_no_draft": round(tps["speculative"] / tps["runtime_no_draft"], 3),
    }
    out["speedup_over_al"] = round(out["speedup_vs_hf"] / al, 3)
    # what one speculative step (k draft passes + one verify pass over k+1 tokens) costs, in plain decode steps,
    # from the decode steps alone (each answer's prefill is the same pass with or without a draft, not a step):
    # speculative decode tokens/s = AL / step time, decode tokens/s = 1 / decode step, so
    # step cost = AL x decode tokens/s / speculative decode tokens/s, and speculation pays only while AL > step cost
    if {"runtime_no_draft", "speculative"} <= set(decode_tps):
        out["step_cost_vs_decode"] = round(al * decode_tps["runtime_no_draft"] / decode_tps["speculative"], 3)
    else:  # no prefill timings: the whole answers' speeds
        out["step_cost_vs_decode"] = round(al / out["speculative_vs_no_draft"], 3)
    out["limits"] = None if bandwidth is None else {
        "bandwidth": bandwidth,
        **speed_limits(kernels, bandwidth, tps["runtime_no_draft"], al, out["step_cost_vs_decode"],
                       decode_tps.get("runtime_no_draft"), decode_runs, step_cost_ideal, step_cost_products),
    }
    return out
