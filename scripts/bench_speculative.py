#!/usr/bin/env python
"""Acceptance length and speed of the PyTorch speculative runtime for draft lengths k = 1..6, on a finished run.

    python scripts/bench_speculative.py runs/demo                 # table on stdout
    python scripts/bench_speculative.py runs/demo --json --prompts 4 --max-new-tokens 64 --shape chain

Reads RUN_DIR/bundle (target + EAGLE-3 draft), RUN_DIR/data/heldout.jsonl (prompts) and the model source from
RUN_DIR/data/manifest.json. For each k, every prompt runs HF generate, the runtime without draft, the
speculative runtime and HF prompt lookup in turn (interleaved, so machine noise hits all alike). `exact` counts the
prompts whose speculative output is token-identical to HF generate's. The runtime's decode/verify pass is
torch.compile'd first, as in `trtspec validate` (`--no-compile`: eager).

Printed first: the CPU and the kernels the runtime chose by timing on it. Each row gives the memory bandwidth
(median of samples taken among that row's timed runs: a shared machine's bandwidth moves within minutes), the decode
limit it implies (bandwidth / weight bytes per token) and the runtime's plain decoding as a fraction of it: `nd/limit`
with each answer's prefill in the time, `decode/limit` its decode steps alone (`decode`: their tokens/s).
"""

from __future__ import annotations

import json
from pathlib import Path

from trtspec.bench import arg_parser
from trtspec.errors import run_main


def main() -> None:
    ap = arg_parser(__doc__)
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--ks", default="1,2,3,4,5,6", help="draft lengths, comma separated")
    ap.add_argument("--shape", default="chain", choices=["chain", "tree", "dynamic_tree"])
    ap.add_argument("--no-compile", action="store_true", help="run the runtime eagerly (no torch.compile)")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    a = ap.parse_args()

    import torch

    from trtspec.bench import load_prompts, model_source, open_bundle
    from trtspec.generation import hf_answer
    from trtspec.measure import speed_limits, step_cost_by_bytes, time_methods, warm_up
    from trtspec.models import load_model
    from trtspec.runtime import DraftSpec, Stats, generate, speculative_decode
    from trtspec.runtime.kernels import cpu_description, row_labels

    run, bundle = a.run_dir, open_bundle(a.run_dir)
    source = model_source(run)
    prompts, eos, new = load_prompts(run, bundle.tok, a.prompts), bundle.eos, a.max_new_tokens
    hf = load_model(source, "float32", "cpu")
    target, drafter = bundle.runtime()
    machine, kernels = cpu_description(), target.kernel_choice
    if not a.json:
        print(f"machine: {machine['model']}, {machine['cores']} cores, {machine['torch_threads']} threads, {' '.join(machine['flags'])}")
        print(f"kernels by rows: {' '.join(f'{n}:{c}' for n, c in zip(row_labels(), kernels['by_rows'], strict=True))}; "
              f"{kernels['weight_mb']:.0f} MB of weights per token", flush=True)

    ks = [int(x) for x in a.ks.split(",")]
    specs = {k: DraftSpec(shape=a.shape, k=k, topk=4, total=max(8, 4 * k)) for k in ks}
    compile_s, compile_note = 0.0, "off (--no-compile)"
    if not a.no_compile:  # warm up on what will be timed: plain decoding and every k's drafts (each k verifies and
        first = torch.tensor(prompts[0])  # drafts its own row counts: graphs of their own, compiled before timing)
        compile_s, compile_note = warm_up(target, [(drafter, s) for s in specs.values()], lambda: (
            generate(target, first, new, eos), [speculative_decode(target, drafter, first, new, s, eos) for s in specs.values()]))
    if not a.json:
        print(f"runtime: {compile_note} ({compile_s:.0f} s)", flush=True)

    rows = []
    for k, spec in specs.items():
        res, bandwidth = time_methods({
            "hf_generate": lambda p: hf_answer(hf, p, new, eos),
            "runtime_no_draft": lambda p: generate(target, torch.tensor(p), new, eos),
            "speculative": lambda p, s=spec: speculative_decode(target, drafter, torch.tensor(p), new, s, eos),
            "hf_prompt_lookup": lambda p, k=k: hf_answer(hf, p, new, eos, prompt_lookup_num_tokens=k),
        }, prompts, 1, kernels)
        (hf_tps, base_tps, spec_tps, pl_tps) = (res[m]["tokens_per_s"][0] for m in ("hf_generate", "runtime_no_draft", "speculative", "hf_prompt_lookup"))
        hf_outs, outs = res["hf_generate"]["outputs"], res["speculative"]["outputs"]
        stats = Stats()
        for g in outs:
            stats.merge(g.stats)
        al = stats.acceptance_length()
        exact = sum(g.tokens == h for g, h in zip(outs, hf_outs, strict=True))
        rows.append({"k": k, "acceptance_length": round(al, 3), "exact": exact, "hf_generate": round(hf_tps, 2), "runtime_no_draft": round(base_tps, 2),
                     "speculative": round(spec_tps, 2), "hf_prompt_lookup": round(pl_tps, 2),
                     "speedup_vs_hf": round(spec_tps / hf_tps, 3), "speedup_vs_no_draft": round(spec_tps / base_tps, 3),
                     "no_draft_vs_hf": round(base_tps / hf_tps, 3), "speedup_over_al": round(spec_tps / hf_tps / al, 3),
                     "limits": speed_limits(kernels, bandwidth, base_tps, al, al * base_tps / spec_tps,
                                            res["runtime_no_draft"]["decode_tokens_per_s"][0],
                                            res["runtime_no_draft"]["decode_runs"], step_cost_by_bytes(target, drafter, spec))})
        if not a.json:
            r = rows[-1]
            if len(rows) == 1:
                print(f"{'k':>2} {'AL':>5} {'exact':>5} | {'HF gen':>7} {'no-draft':>8} {'spec':>7} {'lookup':>7} | tok/s"
                      f" | {'spec/HF':>7} {'spec/nd':>7} {'nd/HF':>6} {'(spec/HF)/AL':>12} | {'GB/s':>5} {'limit':>6} {'nd/limit':>8}"
                      f" {'decode':>7} {'decode/limit':>12}")
            print(f"{k:>2} {r['acceptance_length']:>5.2f} {exact:>2}/{len(prompts):<2} | {r['hf_generate']:>7.1f} {r['runtime_no_draft']:>8.1f} "
                  f"{r['speculative']:>7.1f} {r['hf_prompt_lookup']:>7.1f} |       | {r['speedup_vs_hf']:>6.2f}x "
                  f"{r['speedup_vs_no_draft']:>6.2f}x {r['no_draft_vs_hf']:>5.2f}x {r['speedup_over_al']:>12.2f} | "
                  f"{bandwidth['gb_per_s']:>5.1f} {r['limits']['limit_tokens_per_s']:>6.1f} "
                  f"{r['limits']['no_draft_fraction_of_limit']:>8.0%} {r['limits']['decode_tokens_per_s']:>7.1f} "
                  f"{r['limits']['decode_fraction_of_limit']:>12.0%}", flush=True)
    if a.json:
        print(json.dumps({"run_dir": str(run), "prompts": len(prompts), "max_new_tokens": new, "shape": a.shape, "compile": {"seconds": compile_s, "note": compile_note},
                          "threads": torch.get_num_threads(), "machine": machine, "kernels": kernels, "rows": rows}, indent=2))


if __name__ == "__main__":
    run_main(main)
