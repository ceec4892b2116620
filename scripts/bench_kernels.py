#!/usr/bin/env python
"""The runtime with the product kernels it chose at load against the same runtime with some candidates taken away,
side by side in one process: plain decode and speculative (EAGLE-3 chain) tokens/s on a finished run's bundle.

    python scripts/bench_kernels.py runs/demo --without native16            # chosen vs chosen-without-native16
    python scripts/bench_kernels.py runs/demo --without native16,native --prompts 3 --json
    python scripts/bench_kernels.py runs/demo --without native_pass         # the target's pass compiled instead
    python scripts/bench_kernels.py runs/demo --spec dynamic_tree:4:4:16 --without tree_rows,one_pass_trees

The bundle's runtime is loaded twice: once as validate loads it (every candidate timed, the fastest kept per row
count) and once with the candidates named in --without removed before the choice (`native_pass`: the target's
decode and verification passes by its compiled `forward` instead of one native call (settings.native_pass); `tree_rows`:
products of 9-64 rows, a tree's verification, by F.linear instead of the kernel chosen for them; `one_pass_trees`: an
EAGLE-3 tree drafted level by level, one draft call per depth, instead of one pass). Both are compiled as validate
compiles them; then each prompt is decoded by every (runtime, method) in turn, for --rounds rounds, so the host's
drift hits all alike. Printed per runtime: the kernels chosen by row count, the decode step and the speculative
step in ms (medians over prompts and rounds) for the draft shape `--spec`, tokens/s, and the ratio of each to the first runtime's; greedy
outputs must be identical everywhere.
"""

from __future__ import annotations

import json
import statistics
from functools import partial
from pathlib import Path

from trtspec.bench import add_runtime_flags, arg_parser
from trtspec.errors import run_main

ONE_PASS_TREES = "one_pass_trees"  # a drafter's switch: an EAGLE-3 tree drafted in one pass (--without it: per depth)


def load_without(run_dir: Path, settings, one_pass_trees: bool = True):
    """(bundle, target, drafter) loaded as `settings` (runtime/settings.py) say."""
    from trtspec.bench import open_bundle

    bundle = open_bundle(run_dir)
    target, drafter = bundle.runtime(settings=settings)
    drafter.one_pass_trees = one_pass_trees
    return bundle, target, drafter


def main() -> None:
    ap = arg_parser(__doc__)
    ap.add_argument("run_dir", type=Path)
    add_runtime_flags(ap, without_default="native16")
    ap.add_argument("--k", type=int, default=3, help="draft length")
    ap.add_argument("--spec", help="the draft's shape:depth[:topk:total], e.g. dynamic_tree:4:4:16 (default chain:K)")
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()

    import torch

    from trtspec.bench import draft_specs, load_prompts, runtime_settings
    from trtspec.measure import step_ms, timed
    from trtspec.runtime import compile_steps, generate, speculative_decode
    from trtspec.runtime.kernels import cpu_description

    without = [n for n in a.without.split(",") if n != ONE_PASS_TREES]
    (label, spec), = draft_specs(a.spec or f"chain:{a.k}", a.k).items()
    variants = {"chosen": (runtime_settings(a, without=""), True),
                f"without {a.without}": (runtime_settings(a, without=",".join(without)), ONE_PASS_TREES not in a.without)}
    loaded = {name: load_without(a.run_dir, *v) for name, v in variants.items()}
    bundle = next(iter(loaded.values()))[0]
    prompts = [torch.tensor(p) for p in load_prompts(a.run_dir, bundle.tok, a.prompts)]
    eos, new = bundle.eos, a.max_new_tokens
    compile_s, note = dict.fromkeys(loaded, 0.0), "eager (--no-compile)"
    for name, (_, target, drafter) in loaded.items():
        if target.settings.compile:
            compile_s[name], note = compile_steps([target, drafter.net], lambda t=target, d=drafter: [
                (generate(t, p, new, eos), speculative_decode(t, d, p, new, spec, eos)) for p in prompts])
    steps: dict[tuple[str, str], list[float]] = {(n, m): [] for n in loaded for m in ("no_draft", "speculative")}
    outputs: dict[tuple[str, str], list[list[int]]] = {key: [] for key in steps}
    al: dict[str, list[float]] = {n: [] for n in loaded}
    for _ in range(a.rounds):
        for p in prompts:
            for name, (_, target, drafter) in loaded.items():
                for method in ("no_draft", "speculative"):
                    g, seconds = timed(partial(generate, target, p, new, eos) if method == "no_draft"
                                       else partial(speculative_decode, target, drafter, p, new, spec, eos))
                    steps[(name, method)].append(step_ms(g, seconds))
                    outputs[(name, method)].append(g.tokens)
                    if method == "speculative":
                        al[name].append(g.stats.acceptance_length())
    reference = outputs[(next(iter(loaded)), "no_draft")]
    identical = all(v == reference for v in outputs.values())
    rows = {}
    for name, (_, target, drafter) in loaded.items():
        decode, step = statistics.median(steps[(name, "no_draft")]), statistics.median(steps[(name, "speculative")])
        length = statistics.mean(al[name])
        rows[name] = {"kernels_by_rows": target.kernel_choice["by_rows"], "native_pass": target.native_pass, "draft_kernels_by_rows": drafter.net.kernel_choice["by_rows"],
                      "decode_step_ms": round(decode, 2), "spec_step_ms": round(step, 2),
                      "no_draft_tok_s": round(1e3 / decode, 1), "speculative_tok_s": round(length * 1e3 / step, 1),
                      "acceptance_length": round(length, 2), "step_in_decode_steps": round(step / decode, 3),
                      "compile_s": compile_s[name]}
    first = next(iter(rows.values()))
    for r in rows.values():
        r["no_draft_vs_first"] = round(r["no_draft_tok_s"] / first["no_draft_tok_s"], 3)
        r["speculative_vs_first"] = round(r["speculative_tok_s"] / first["speculative_tok_s"], 3)
    result = {"machine": cpu_description(), "runtime": note, "draft": label, "greedy_identical": identical, "rows": rows}
    if a.json:
        print(json.dumps(result))
        return
    m = result["machine"]
    print(f"machine: {m['model']}, {m['cores']} cores, {' '.join(m['flags'])}; draft {label}; greedy identical: {identical}")
    print("| runtime | target kernels by rows (native pass) | decode step | no draft | speculative step | speculative (AL) | step in decode steps | no draft / first | speculative / first |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        print(f"| {name} | {' '.join(r['kernels_by_rows'])} ({'yes' if r['native_pass'] else 'no'}) | {r['decode_step_ms']:.2f} ms | {r['no_draft_tok_s']:.1f} tok/s | "
              f"{r['spec_step_ms']:.2f} ms | {r['speculative_tok_s']:.1f} ({r['acceptance_length']:.2f}) | {r['step_in_decode_steps']:.2f} | "
              f"{r['no_draft_vs_first']:.2f}x | {r['speculative_vs_first']:.2f}x |")


if __name__ == "__main__":
    run_main(main)
