#!/usr/bin/env python
"""The draft's acceptance per category of a finished run's held-out prompts, in the runtime: AL with its bootstrap
interval over the category's prompts, per-position acceptance, greedy outputs identical to the runtime without a
draft, and tokens/s against it (each prompt decoded without and with the draft back to back, so drift hits both).

    python scripts/bench_categories.py runs/demo                        # every held-out prompt, 128 new tokens
    python scripts/bench_categories.py runs/demo --prompts 32 --max-new-tokens 64 --json
    python scripts/bench_categories.py runs/demo --suite build_configs/prompts/unseen_prompts.jsonl   # prompts of yours
    python scripts/bench_categories.py runs/demo --suffix-min-match 4   # a suffix match drafts first (validate's eagle3_suffix)
    python scripts/bench_categories.py runs/demo --suffix-branch 1      # a suffix match drafts beside the head (one tree)

The same per-category summary validate writes into report.json (checks.acceptance_summary), on more prompts than
validate times (eval.num_prompts), with the no-draft runtime as the greedy reference instead of HF generate.
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

from trtspec.bench import add_runtime_flags, arg_parser, count
from trtspec.errors import run_main


def main() -> None:
    ap = arg_parser(__doc__)
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--prompts", type=count, default=1000,
                    help="prompts at most: the first held-out ones, or a suite's spread over its categories")
    ap.add_argument("--suite", type=Path, help="a JSONL suite (prompt or messages, category) instead of the held-out split")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--suffix-min-match", type=int, default=0, metavar="N",
                    help="draft a suffix match of at least N tokens instead of the head (validate's eagle3_suffix); 0: the head alone")
    ap.add_argument("--suffix-branch", type=int, default=0, metavar="N",
                    help="a suffix match of at least N tokens drafts beside the head, as a second branch of one tree "
                         "the target verifies (runtime.suffix.SuffixBranchDrafter); 0: not")
    ap.add_argument("--suffix-len", type=int, default=0, metavar="L",
                    help="with --suffix-branch: the branch's longest chain (a match of n tokens drafts min(n, L)); 0: k")
    ap.add_argument("--json", action="store_true")
    add_runtime_flags(ap)
    a = ap.parse_args()
    if a.suffix_min_match and a.suffix_branch:  # before anything loads
        ap.error("--suffix-min-match and --suffix-branch: give one (a suffix match in front of the head, or beside it)")
    if a.suffix_len and not a.suffix_branch:
        ap.error("--suffix-len sets the length of a branch beside the head: give --suffix-branch N with it")

    from collections import defaultdict

    import torch

    from trtspec.bench import load_prompt_rows, open_bundle, runtime_settings, suite_rows
    from trtspec.chat import encode_row
    from trtspec.checks import acceptance_summary
    from trtspec.measure import timed, warm_up
    from trtspec.runtime import DraftSpec, generate, speculative_decode
    from trtspec.runtime.suffix import SuffixBranchDrafter, SuffixDrafter, SuffixThenModelDrafter

    settings = runtime_settings(a)
    bundle = open_bundle(a.run_dir)
    rows = suite_rows(a.suite, a.prompts) if a.suite else load_prompt_rows(a.run_dir, a.prompts)
    prompts = [torch.tensor(encode_row(bundle.tok, r)) for r in rows]
    target, head = bundle.runtime(settings=settings)
    drafter = (SuffixThenModelDrafter(head, SuffixDrafter(min_match=a.suffix_min_match)) if a.suffix_min_match else
               SuffixBranchDrafter(head, SuffixDrafter(min_match=a.suffix_branch)) if a.suffix_branch else head)
    k = bundle.draft_length
    spec = DraftSpec(shape="chain_suffix", k=k, suffix_len=a.suffix_len) if a.suffix_branch else DraftSpec(shape="chain", k=k)
    eos, new = bundle.eos, a.max_new_tokens
    if settings.compile:  # every row count a step verifies compiled first, or its compilation lands in a timed run
        warm_up(target, [(head, spec)], lambda: [(generate(target, p, 8, eos), speculative_decode(target, drafter, p, 8, spec, eos))
                                                    for p in prompts[:2]])
    plain, spec_runs, seconds = [], [], defaultdict(lambda: [0.0, 0.0, 0, 0])  # category -> s plain, s draft, tokens
    for r, p in zip(rows, prompts, strict=True):
        g0, s0 = timed(partial(generate, target, p, new, eos))
        g1, s1 = timed(partial(speculative_decode, target, drafter, p, new, spec, eos))
        plain.append(g0.tokens)
        spec_runs.append(g1)
        s = seconds[r["category"]]
        s[0], s[1], s[2], s[3] = s[0] + s0, s[1] + s1, s[2] + len(g0.tokens), s[3] + len(g1.tokens)
    summary = acceptance_summary(rows, spec_runs, k, plain)
    for c, v in summary["per_category"].items():
        v["speedup_vs_no_draft"] = speedup(seconds[c])
    result = {"run": str(a.run_dir), "prompts_from": str(a.suite or "heldout"),
              "draft": drafter.name, "k": k, "prompts": len(rows),
              "max_new_tokens": new, "speedup_vs_no_draft": speedup([sum(x) for x in zip(*seconds.values(), strict=True)]), **summary}
    if a.json:
        print(json.dumps(result))
        return
    print(f"{result['draft']} k={k}, {len(rows)} prompts ({result['prompts_from']}), {new} new tokens; AL "
          f"{summary['acceptance_length']:.2f} over all, {result['speedup_vs_no_draft']:.2f}x the runtime without the draft; "
          f"per position {summary['per_position_acceptance']}")
    print(f"{'category':<12} {'prompts':>7} {'AL':>5} {'95% interval':>13} {'per position':>20} {'identical':>9} {'vs no draft':>11}")
    for c, v in summary["per_category"].items():
        pos = " ".join(f"{x:.2f}" for x in v["per_position"])
        print(f"{c:<12} {v['prompts']:>7} {v['acceptance_length']:>5.2f} {v['ci95'][0]:>6.2f}-{v['ci95'][1]:<6.2f} {pos:>20} "
              f"{v['exact']:>4}/{v['prompts']:<4} {v['speedup_vs_no_draft']:>10.2f}x")


def speedup(s: list[float]) -> float:
    """Tokens/s with the draft over tokens/s without, from [s without, s with, tokens without, tokens with]."""
    return round((s[3] / s[1]) / (s[2] / s[0]), 3)


if __name__ == "__main__":
    run_main(main)
