#!/usr/bin/env python
"""Where one speculative step's time goes, against one plain decode step, on a finished run's bundle.

    python scripts/bench_step.py runs/demo                      # table on stdout
    python scripts/bench_step.py runs/demo --k 3 --prompts 3 --json
    python scripts/bench_step.py runs/demo --specs chain:3,dynamic_tree:4:3:8,dynamic_tree:4:4:16   # shapes side by side
    python scripts/bench_step.py runs/demo --suite build_configs/prompts/unseen_prompts.jsonl --prompts 8   # prompts of yours

Every network pass of the runtime goes through `Stepper.run_pass`; this script wraps the target's and the draft's
with a timer and decodes the run's held-out prompts with and without the draft (greedy, compiled as validate
compiles them), each prompt's decode run and speculative run back to back. Per decode step it prints the time inside
the target's passes, inside the draft's (by new rows per pass) and outside both (Python: trees, masks, verification,
cache bookkeeping), and the speculative step in plain decode steps (the median over prompts and rounds of each
speculative run against the decode run beside it) with its cost by bytes (measure.step_cost_by_bytes). `--specs` times several draft shapes (shape:depth[:topk:total]),
interleaved with each other and with the decode runs beside them, and adds a summary table: which shape pays most.

With `--guards-too` the compiled passes are also timed with torch.compiler.set_stance(skip_guard_eval_unsafe=True),
which checks only the guards that pick between the compiled graphs, interleaved with the default: the difference is
what dynamo's guard evaluation costs per step on this machine.
"""

from __future__ import annotations

import json
import statistics
import time
from collections import defaultdict
from contextlib import nullcontext
from functools import partial
from pathlib import Path

from trtspec.bench import add_runtime_flags, arg_parser, count, draft_specs
from trtspec.errors import run_main


class PassTimer:
    """Wraps a network's `run_pass` (every pass: decode, verify, a draft's chain): seconds spent in it, by the number
    of new rows (tokens) per pass; prefills (mask "causal": the prompt's pass, timed apart as Generation.prefill_s) are
    not counted."""

    def __init__(self, net):
        self.net, self.inner = net, net.run_pass
        self.seconds: dict[int, list[float]] = defaultdict(list)
        net.run_pass = self

    def __call__(self, name, *args):
        t0 = time.perf_counter()
        out = self.inner(name, *args)
        if not isinstance(args[-1], str):
            self.seconds[args[0].shape[0]].append(time.perf_counter() - t0)
        return out

    def reset(self) -> None:
        self.seconds.clear()

    def total(self) -> float:
        return sum(sum(v) for v in self.seconds.values())

    def calls(self) -> int:
        return sum(len(v) for v in self.seconds.values())


def main() -> None:
    ap = arg_parser(__doc__)
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--k", type=int, default=3, help="draft length (the default --specs: chain:K)")
    ap.add_argument("--specs", help="draft shapes to time side by side, comma-separated shape:depth[:topk:total], "
                    "e.g. chain:3,dynamic_tree:4:3:8 (default chain:K)")
    ap.add_argument("--prompts", type=count, default=3)
    ap.add_argument("--suite", type=Path, help="a JSONL suite (prompt or messages, category): --prompts of its rows, "
                    "spread evenly over the file, instead of the held-out split")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds of every configuration")
    ap.add_argument("--guards-too", action="store_true", help="also time every run without dynamo's guard evaluation")
    add_runtime_flags(ap)
    ap.add_argument("--draft-weights", default="auto", choices=["auto", "float32", "bfloat16"],
                    help="how the draft's weights are stored (kernels.store_bf16)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    specs = draft_specs(a.specs or f"chain:{a.k}", a.k)

    import torch

    from trtspec.bench import load_prompts, load_suite_prompts, open_bundle, runtime_settings
    from trtspec.errors import ModelError
    from trtspec.measure import step_cost_by_bytes, step_ms, timed
    from trtspec.runtime import compile_steps, generate, speculative_decode
    from trtspec.runtime.kernels import cpu_description, row_labels, weight_mb

    settings = runtime_settings(a)
    bundle = open_bundle(a.run_dir)
    chosen = load_suite_prompts(a.suite, bundle.tok, a.prompts) if a.suite else load_prompts(a.run_dir, bundle.tok, a.prompts)
    prompts = [torch.tensor(p) for p in chosen]
    target, drafter = bundle.runtime(draft_weights=a.draft_weights, settings=settings)
    if getattr(target, "path", None) == "hf":  # runtime/hf_target.py: the HF model's own forward, no passes to time
        raise ModelError(f"'{a.run_dir}': its target runs through the HF model (a family the runtime's own passes do "
                         "not cover), so there is no verify or decode pass to time", "time it end to end with "
                         "scripts/bench_drafters.py or scripts/bench_categories.py")
    net = drafter.net
    eos, new = bundle.eos, a.max_new_tokens
    note, compile_s = "eager (--no-compile)", 0.0
    if settings.compile:
        compile_s, note = compile_steps([target, net], lambda: [
            (generate(target, p, new, eos), *(speculative_decode(target, drafter, p, new, s, eos) for s in specs.values()))
            for p in prompts])
    t_timer, d_timer = PassTimer(target), PassTimer(net)
    stances = {"guards": nullcontext}
    if a.guards_too:
        stances["no_guards"] = lambda: torch.compiler.set_stance(skip_guard_eval_unsafe=True)
    methods = {"no_draft": None, **specs}
    runs: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for _ in range(a.rounds):  # a decode run and the speculative runs of one prompt back to back: the host's pace
        for p in prompts:  # moves within minutes, so each speculative step is held against decode steps of its moment
            for stance, ctx in stances.items():
                for method, spec in methods.items():
                    t_timer.reset()
                    d_timer.reset()
                    with ctx():
                        g, seconds = timed(partial(generate, target, p, new, eos) if spec is None
                                           else partial(speculative_decode, target, drafter, p, new, spec, eos))
                    steps = g.stats.steps
                    runs[(stance, method)].append({
                        "steps": steps, "tokens": len(g.tokens), "total_ms": step_ms(g, seconds),
                        "target_ms": t_timer.total() / steps * 1e3, "draft_ms": d_timer.total() / steps * 1e3,
                        "draft_calls": d_timer.calls() / steps,
                        "target_by_rows": {r: statistics.median(v) * 1e3 for r, v in t_timer.seconds.items()},
                        "draft_by_rows": {r: statistics.median(v) * 1e3 for r, v in d_timer.seconds.items()},
                        "acceptance_length": g.stats.acceptance_length(), "out": g.tokens,
                    })

    def med(stance: str, method: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[(stance, method)])

    def by_rows(stance: str, method: str, key: str) -> dict:
        found = sorted({r for x in runs[(stance, method)] for r in x[key]})
        return {r: round(statistics.median(x[key].get(r, float("nan")) for x in runs[(stance, method)]), 2) for r in found}

    t_mb, d_mb = weight_mb(target), weight_mb(net)
    rows = {}
    for stance in stances:
        plain = med(stance, "no_draft", "total_ms")
        for label, spec in specs.items():
            spec_ms, spec_runs, plain_runs = med(stance, label, "total_ms"), runs[(stance, label)], runs[(stance, "no_draft")]
            ratios = [x["total_ms"] / y["total_ms"] for x, y in zip(spec_runs, plain_runs, strict=True)]
            al = med(stance, label, "acceptance_length")
            rows[(stance, label)] = {
                "stance": stance, "spec": label, "shape": spec.shape, "k": spec.k, "topk": spec.topk, "total": spec.total,
                "decode_step_ms": round(plain, 2), "decode_target_ms": round(med(stance, "no_draft", "target_ms"), 2),
                "decode_python_ms": round(plain - med(stance, "no_draft", "target_ms"), 2),
                "spec_step_ms": round(spec_ms, 2), "spec_target_ms": round(med(stance, label, "target_ms"), 2),
                "spec_draft_ms": round(med(stance, label, "draft_ms"), 2),
                "draft_calls_per_step": round(med(stance, label, "draft_calls"), 2),
                "spec_python_ms": round(spec_ms - med(stance, label, "target_ms") - med(stance, label, "draft_ms"), 2),
                "step_in_decode_steps": round(statistics.median(ratios), 3),
                "step_in_decode_steps_runs": [round(x, 3) for x in ratios],
                "ideal_by_bytes": round(step_cost_by_bytes(target, drafter, spec), 3),
                "acceptance_length": round(al, 3),
                "verify_ms_by_rows": by_rows(stance, label, "target_by_rows"),
                "draft_ms_by_rows": by_rows(stance, label, "draft_by_rows"),
                # AL over the step's cost, each speculative run against the decode run beside it
                "speedup_vs_no_draft": round(statistics.median(x["acceptance_length"] / r for x, r in zip(spec_runs, ratios, strict=True)), 3),
            }
    same = all(x["out"] == y["out"] for (s, m), v in runs.items() if m != "no_draft"
               for x, y in zip(v, runs[(s, "no_draft")], strict=True))
    kernels = dict(zip(row_labels(), target.kernel_choice["by_rows"], strict=True))
    result = {"machine": cpu_description(), "runtime": note, "compile_s": compile_s, "prompts_from": str(a.suite or "heldout"),
              "prompt_tokens": round(sum(p.numel() for p in prompts) / len(prompts), 1), "target_mb": round(t_mb, 1),
              "draft_mb": round(d_mb, 1), "greedy_identical": same, "kernels": kernels, "rows": list(rows.values())}
    if a.json:
        print(json.dumps(result))
        return
    m = result["machine"]
    print(f"machine: {m['model']}, {m['cores']} cores, {' '.join(m['flags'])}; runtime: {note} ({compile_s:.0f} s)")
    print(f"{len(prompts)} prompts ({result['prompts_from']}, {result['prompt_tokens']} tokens on average), {new} new tokens")
    print(f"target {t_mb:.0f} MB, draft {d_mb:.0f} MB per pass; kernels by rows "
          f"{' '.join(f'{n}:{c}' for n, c in kernels.items())}; greedy identical: {same}")
    for r in rows.values():
        print(f"\n[{r['spec']}, {r['stance']}]  decode step {r['decode_step_ms']:.2f} ms (target pass "
              f"{r['decode_target_ms']:.2f}, outside {r['decode_python_ms']:.2f})")
        print(f"  speculative step {r['spec_step_ms']:.2f} ms = target {r['spec_target_ms']:.2f} + draft "
              f"{r['spec_draft_ms']:.2f} ({r['draft_calls_per_step']:.2f} calls) + outside {r['spec_python_ms']:.2f}")
        print(f"  verify ms by rows {r['verify_ms_by_rows']}; draft pass ms by rows {r['draft_ms_by_rows']}")
        print(f"  step = {r['step_in_decode_steps']:.2f} decode steps (median of runs, each against the decode run beside it: "
              f"{' '.join(f'{x:.2f}' for x in r['step_in_decode_steps_runs'])}; ideal by bytes {r['ideal_by_bytes']:.2f}); "
              f"AL {r['acceptance_length']:.2f}; speculative / no draft {r['speedup_vs_no_draft']:.2f}x")
    if len(specs) > 1:
        print("\n| draft | stance | verify rows | step (decode steps) | AL | speculative / no draft |\n|---|---|---|---|---|---|")
        for r in rows.values():
            print(f"| {r['spec']} | {r['stance']} | {max(r['verify_ms_by_rows'], default=0)} | {r['step_in_decode_steps']:.2f} | "
                  f"{r['acceptance_length']:.2f} | {r['speedup_vs_no_draft']:.2f}x |")


if __name__ == "__main__":
    run_main(main)
