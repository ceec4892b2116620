#!/usr/bin/env python
"""A run's bundle in vLLM beside trtspec's runtime and HF generate, on the same prompts, in one run.

    python scripts/bench_engines.py runs/demo                          # table on stdout
    python scripts/bench_engines.py runs/demo --prompts 8 --k 3 --concurrency 1,32 --json
    python scripts/bench_engines.py runs/demo --draft-off --concurrency 4,16,32 --rounds 6

Acceptance: trtspec's runtime (greedy chains of k drafts) and vLLM's own counters (EAGLE-3, k speculative tokens),
prompt by prompt; AL, per-position rates and their ratio. Greedy outputs: vLLM with the draft against HF generate
on the original model, against the runtime, and against vLLM without the draft. Speed: vLLM's tokens/s with and
without the draft at each concurrency (that many requests submitted together), measured one engine after the
other in this run. Needs vLLM (bash scripts/setup.sh --engines vllm).

--draft-off: what a draft length of 0 in a schedule costs vLLM. Three engines loaded at once in this process: without
the draft, with it drafting k tokens, and with it drafting 0 from batch size 2 on (num_speculative_tokens_per_batch_size,
what serve.draft_len_schedule's 0 serves); at each concurrency (2 or more) their batches run in turn, --rounds times,
and the median tokens/s of each is printed against no draft.
"""

from __future__ import annotations

import json
import sys
from functools import partial
from pathlib import Path

from trtspec.bench import arg_parser
from trtspec.measure import timed


def main() -> None:
    ap = arg_parser(__doc__)
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--prompts", type=int, default=8, help="prompts (the first N of the split)")
    ap.add_argument("--split", default="heldout", choices=["heldout", "train"],
                    help="the data stage's held-out prompts, or those the head trained on (high acceptance)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--k", type=int, default=3, help="draft tokens per step")
    ap.add_argument("--concurrency", default="1,32", help="requests submitted together when timing, comma separated")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    ap.add_argument("--draft-off", action="store_true", help="measure what drafting 0 tokens costs (see above)")
    ap.add_argument("--rounds", type=int, default=6, help="--draft-off: interleaved rounds at each concurrency")
    a = ap.parse_args()

    from trtspec.bench import load_prompts, model_source, open_bundle
    from trtspec.deploy import vllm_engine
    from trtspec.generation import compare, hf_answer
    from trtspec.models import load_model
    from trtspec.runtime import DraftSpec, speculative_on_prompts

    ok, why = vllm_engine.availability()
    if not ok:
        sys.exit(f"error: {why}")
    run, opened = a.run_dir, open_bundle(a.run_dir)
    bundle, source = opened.path, model_source(run)
    prompts, eos, new = load_prompts(run, opened.tok, a.prompts, a.split), opened.eos, a.max_new_tokens
    levels = [int(x) for x in a.concurrency.split(",")]
    if a.draft_off:
        return draft_off(bundle, prompts, new, a.k, levels, a.rounds, a.json)

    print(f"HF generate on {len(prompts)} prompts", file=sys.stderr)
    hf = load_model(source, "float32", "cpu")
    hf_out = [hf_answer(hf, p, new, eos) for p in prompts]
    del hf
    print(f"trtspec runtime, chains of {a.k}", file=sys.stderr)
    target, drafter = opened.runtime()
    (rt_out, stats), rt_s = timed(partial(speculative_on_prompts, target, drafter, prompts, new, DraftSpec(shape="chain", k=a.k), eos))
    del target, drafter
    print(f"vLLM {vllm_engine.version()} with the draft and without, loaded together, timed in turn", file=sys.stderr)
    both = vllm_engine.measure(bundle / "target", {"spec": (bundle / "draft", None), "base": (None, None)}, a.k, prompts, new, levels)
    spec, base = both["spec"], both["base"]

    acc = spec["acceptance"]
    rt_al, rt_pos = stats.acceptance_length(), stats.per_position(a.k)
    result = {
        "prompts": len(prompts), "split": a.split, "max_new_tokens": new, "k": a.k, "vllm": vllm_engine.version(),
        "acceptance": {
            "runtime": {"acceptance_length": round(rt_al, 4), "per_position": [round(x, 4) for x in rt_pos], "steps": stats.steps},
            "vllm": {k: acc[k] for k in ("acceptance_length", "per_position", "drafts")},
            "vllm_over_runtime": round(acc["acceptance_length"] / rt_al, 4),
        },
        "greedy": {"vllm_vs_hf": compare(spec["outputs"], hf_out), "vllm_vs_runtime": compare(spec["outputs"], rt_out),
                   "vllm_vs_vllm_alone": compare(spec["outputs"], base["outputs"]), "runtime_vs_hf": compare(rt_out, hf_out)},
        "vllm_tokens_per_s": {str(c): {"with_draft": round(spec["tokens_per_s"][c], 1), "without": round(base["tokens_per_s"][c], 1),
                                       "ratio": round(spec["tokens_per_s"][c] / base["tokens_per_s"][c], 3)} for c in levels},
        "runtime_s": round(rt_s, 1),
    }
    if a.json:
        print(json.dumps(result, indent=2))
        return
    r = result["acceptance"]
    print(f"\nacceptance at k={a.k} on {len(prompts)} {a.split} prompts ({new} new tokens)")
    print(f"  {'':18}{'AL':>7}  per position")
    print(f"  {'trtspec runtime':18}{r['runtime']['acceptance_length']:>7.3f}  {r['runtime']['per_position']}")
    print(f"  {'vLLM counters':18}{r['vllm']['acceptance_length']:>7.3f}  {r['vllm']['per_position']}")
    print(f"  vLLM / runtime: {r['vllm_over_runtime']:.4f}")
    print("\ngreedy outputs identical (prompts)")
    for name, c in result["greedy"].items():
        print(f"  {name:22}{c['exact']}/{c['total']}  (mean common prefix {c['mean_common_prefix']:.0%})")
    print("\nvLLM tokens/s")
    print(f"  {'concurrent':>10}{'with draft':>12}{'without':>10}{'ratio':>8}")
    for c, row in result["vllm_tokens_per_s"].items():
        print(f"  {c:>10}{row['with_draft']:>12.1f}{row['without']:>10.1f}{row['ratio']:>8.2f}")


def draft_off(bundle: Path, prompts: list[list[int]], new: int, k: int, levels: list[int], rounds: int, as_json: bool) -> None:
    """vLLM without the draft, drafting k, and drafting 0 from batch size 2 on, loaded together; each level's batches
    interleaved over `rounds` -> median tokens/s of each and its ratio to no draft."""
    import statistics

    from trtspec.deploy import vllm_engine

    if bad := [c for c in levels if c < 2]:
        sys.exit(f"error: --draft-off measures concurrency 2 or more (batch size 1 drafts k), not {bad[0]}")
    window = max(map(len, prompts)) + new + k + 8
    engines = {"no draft": vllm_engine.load(bundle / "target", None, k, window, max(levels)),
               f"k={k}": vllm_engine.load(bundle / "target", bundle / "draft", k, window, max(levels)),
               "k=0 (draft loaded)": vllm_engine.load(bundle / "target", bundle / "draft", k, window, max(levels),
                                                      schedule={1: k, 2: 0})}
    for llm in engines.values():
        vllm_engine.generate(llm, prompts[:2], 8)  # warm-up
    tps = {c: {name: [t["tokens_per_s"] for t in got] for name, got in vllm_engine.in_turn(
        engines, lambda r, c=c: [prompts[(r * c + i) % len(prompts)] for i in range(c)], new, c, rounds).items()}
        for c in levels}
    median = {c: {name: statistics.median(v) for name, v in row.items()} for c, row in tps.items()}
    result = {str(c): {name: {"tokens_per_s": round(m, 1), "vs_no_draft": round(m / row["no draft"], 3),
                              "runs": [round(x, 1) for x in tps[c][name]]} for name, m in row.items()} for c, row in median.items()}
    if as_json:
        print(json.dumps({"prompts": len(prompts), "max_new_tokens": new, "k": k, "rounds": rounds, "tokens_per_s": result}, indent=2))
        return
    print(f"\nvLLM tokens/s, median of {rounds} interleaved rounds ({new} new tokens)")
    print(f"  {'concurrent':>10}" + "".join(f"{name:>22}" for name in engines))
    for c, row in result.items():
        print(f"  {c:>10}" + "".join(f"{r['tokens_per_s']:>13.1f} ({r['vs_no_draft']:.2f}x)" for r in row.values()))


if __name__ == "__main__":
    main()
