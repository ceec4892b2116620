#!/usr/bin/env python
"""A run's bundle in vLLM beside trtspec's runtime and HF generate, on the same prompts, in one run.

    python scripts/bench_engines.py runs/demo                          # table on stdout
    python scripts/bench_engines.py runs/demo --prompts 8 --k 3 --concurrency 1,32 --json
    python scripts/bench_engines.py runs/demo --draft-off --concurrency 4,16,32
    python scripts/bench_engines.py runs/demo --lockstep --concurrency 1,4,16,32 --draft-lengths 2,3 --max-new-tokens 64
    python scripts/bench_engines.py runs/demo --lockstep --schedule 1:3,2:2,8:0 --concurrency 1,4,16,32

Acceptance: trtspec's runtime (greedy chains of k drafts) and vLLM's own counters (EAGLE-3, k speculative tokens),
prompt by prompt; AL, per-position rates and their ratio. Greedy outputs: vLLM with the draft against HF generate
on the original model, against the runtime, and against vLLM without the draft. Speed: vLLM's tokens/s with and
without the draft at each concurrency (that many requests submitted together), measured one engine after the
other in this run. Needs vLLM (bash scripts/setup.sh --engines vllm).

--lockstep: the engine stage's concurrency sweep (engine.sweep_method lockstep, trtspec.engines.vllm.sweep): vLLM without
the draft and with it at each --draft-lengths, loaded at once in this process; at each concurrency every engine keeps
that many requests in flight and the engines take one scheduler step each in turn, each step timed alone
(vllm_engine.lockstep), --rounds times. Then the draft length per batch size the lengths imply, measured again
beside no draft and the fastest length (--write-schedule saves it for `deploy --drafting auto`); or, with --schedule
B:K,..., that schedule beside them in the same rounds. Host drift (seconds here) then hits every engine alike.
--draft-off: the same for what a draft length of 0 costs: without the draft, drafting k, and drafting 0 from batch
size 2 on (num_speculative_tokens_per_batch_size, what serve.draft_len_schedule's 0 serves).
"""

from __future__ import annotations

import argparse
import json
import sys
from functools import partial
from pathlib import Path

from trtspec.bench import arg_parser
from trtspec.errors import run_main
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
    ap.add_argument("--lockstep", action="store_true", help="fixed draft lengths and a schedule against no draft (see above)")
    ap.add_argument("--draft-lengths", default=None, help="--lockstep: fixed draft lengths, comma separated (default: --k)")
    ap.add_argument("--schedule", default=None, help="--lockstep: measure this draft length per batch size, B:K,... (default: the one the lengths imply)")
    ap.add_argument("--requests", type=int, default=16, help="--lockstep/--draft-off: requests per level at least (else 2 x concurrency)")
    ap.add_argument("--write-schedule", action="store_true",
                    help="--lockstep: save the schedule the fixed lengths imply as RUN/bench/sweep.json, which "
                         "`trtspec deploy triton RUN --drafting auto` serves")
    ap.add_argument("--rounds", type=int, default=3, help="--lockstep/--draft-off: lockstep rounds at each concurrency")
    a = ap.parse_args()

    from trtspec.bench import load_prompts, model_source, open_bundle
    from trtspec.draft_families import speculative_method
    from trtspec.engines import vllm as vllm_engine
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
    if a.draft_off or a.lockstep:
        out = lockstep(bundle, prompts, a, levels)
        if a.write_schedule and out["decided"] != "given":
            from trtspec.engines.vllm.sweep import save_sweep

            out = save_sweep(run, out, run / "bench")
            print(f"wrote {run / 'bench'}/sweep.json: schedule {out['schedule']}", file=sys.stderr)
        print(json.dumps(out, indent=2) if a.json else
              out["table"] + f"\n\nschedule: {out['schedule']} ({out['decided']})" + (f"; {out['crossover']}" if out["crossover"] else ""))
        return

    print(f"HF generate on {len(prompts)} prompts", file=sys.stderr)
    hf = load_model(source, "float32", "cpu")
    hf_out = [hf_answer(hf, p, new, eos) for p in prompts]
    del hf
    print(f"trtspec runtime, chains of {a.k}", file=sys.stderr)
    target, drafter = opened.runtime()
    (rt_out, stats), rt_s = timed(partial(speculative_on_prompts, target, drafter, prompts, new, DraftSpec(shape="chain", k=a.k), eos))
    del target, drafter
    print(f"vLLM {vllm_engine.version()} with the draft and without, loaded together, timed in turn", file=sys.stderr)
    both = vllm_engine.measure(bundle / "target", {"spec": (bundle / "draft", None), "base": (None, None)}, a.k, prompts, new,
                               levels, method=speculative_method(bundle / "draft"))
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


def parse_schedule(text: str) -> dict[int, int]:
    """'1:3,2:2,8:0' -> {1: 3, 2: 2, 8: 0}."""
    from trtspec.draft_schedule import schedule_problem

    try:
        schedule = {int(b): int(k) for b, k in (item.split(":") for item in text.split(","))}
    except ValueError:
        sys.exit(f"error: --schedule {text!r}: expected batch-size:length pairs, e.g. 1:3,2:2,8:0")
    if why := schedule_problem(schedule, schedule.get(1, 0)):
        sys.exit(f"error: --schedule {text!r}: {why}")
    return schedule


def lockstep_engines(a: argparse.Namespace) -> tuple[list[int], dict[int, int] | None]:
    """(the draft lengths, 0 = no draft, and the schedule or None) that --draft-off or --lockstep compares."""
    if a.draft_off:
        return [0, a.k], {1: a.k, 2: 0}
    lengths = sorted({0, *(int(x) for x in (a.draft_lengths or str(a.k)).split(","))})
    return lengths, parse_schedule(a.schedule) if a.schedule else None


def lockstep(bundle: Path, prompts: list[list[int]], a: argparse.Namespace, levels: list[int]) -> dict:
    """vLLM without the draft and at each draft length, loaded together and stepped in lockstep at each concurrency,
    --rounds times. With a schedule (--schedule, --draft-off) it runs beside them in the same rounds; else the sweep
    finds the schedule the lengths imply and measures it again beside no draft and the fastest length
    (trtspec.engines.vllm.sweep.run_sweep)."""
    from trtspec.engines.vllm.sweep import LockstepPool, SweepPlan, run_sweep, sweep_table

    lengths, schedule = lockstep_engines(a)
    plan = SweepPlan(levels, lengths, a.max_new_tokens, min_requests=a.requests, repeats=a.rounds)
    log = lambda m: print(m, file=sys.stderr)  # noqa: E731
    pool = LockstepPool(bundle, plan, prompts, log)
    if not schedule:
        return run_sweep(pool, plan, log)
    with pool:
        for k in lengths:
            pool.start(f"k{k}", k)
        pool.start("schedule", schedule[1], schedule)
        found = pool.rows({c: [*(f"k{k}" for k in lengths), "schedule"] for c in levels})
    rows = {k: found[f"k{k}"] for k in lengths}
    table, where = sweep_table(rows, found["schedule"])
    return {"kind": pool.KIND, "rows": rows, "schedule": schedule, "decided": "given", "scheduled": found["schedule"],
            "table": table, "crossover": where}


if __name__ == "__main__":
    run_main(main)
