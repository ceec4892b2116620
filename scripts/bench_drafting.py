#!/usr/bin/env python
"""EAGLE-3, suffix drafting and the two combined (in front, beside), side by side on several prompt sets, on a finished run.

    python scripts/bench_drafting.py runs/demo                       # table on stdout
    python scripts/bench_drafting.py runs/demo --json --prompts 6 --sets heldout,code,copy

Prompt sets: `heldout` (the data stage's held-out chat prompts), `code` (build_configs/prompts/code_prompts.jsonl:
complete a function) and `copy` (build_configs/prompts/copy_prompts.jsonl: answers that quote, rename or rewrite
text given in the prompt), or any JSONL/text file of prompts. For each set, every prompt runs the runtime without a
draft, with the EAGLE-3 head (chains of --k), with suffix drafting alone (chains of up to --suffix-len), with
both (a suffix match of at least --min-match tokens drafts, the head otherwise) and with a match of at least
--branch-min-match tokens beside the head's chain (one tree, runtime.suffix.SuffixBranchDrafter) in turn,
interleaved so machine noise hits all alike. `exact` counts the prompts whose output is token-identical to the runtime without a draft
(itself held equal to HF generate by validate and the tests). The runtime's passes are torch.compile'd first.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

from trtspec.bench import arg_parser, count
from trtspec.errors import run_main

ROOT = Path(__file__).resolve().parents[1]
SETS = {"code": ROOT / "build_configs" / "prompts" / "code_prompts.jsonl",
        "copy": ROOT / "build_configs" / "prompts" / "copy_prompts.jsonl"}


def load_set(name: str, run: Path, tok, n: int) -> list[list[int]]:
    """n prompts of a set, chat-templated: the first n held-out ones, or n spread over a file (code | copy | a file;
    a suite is ordered by category)."""
    from trtspec.bench import load_prompts, spread
    from trtspec.chat import encode_row, read_prompt_file

    if name == "heldout":
        return load_prompts(run, tok, n)
    path = SETS.get(name, Path(name))
    if not path.is_file():
        sys.exit(f"error: prompt set '{name}' is neither heldout, code, copy nor a file")
    rows = read_prompt_file(path, Counter(), "prompt file", "give a JSONL (prompt|messages) or text file")
    if not rows:
        sys.exit(f"error: no prompts in set '{name}'")
    return [encode_row(tok, r) for r in spread(rows, n)]


def main() -> None:
    ap = arg_parser(__doc__)
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--sets", default="heldout,code,copy", help="prompt sets, comma separated (heldout, code, copy, or files)")
    ap.add_argument("--prompts", type=count, default=6, help="prompts per set")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--k", type=int, default=3, help="EAGLE-3 chain length")
    ap.add_argument("--suffix-len", type=int, default=8, help="longest chain a suffix match drafts")
    ap.add_argument("--min-match", type=int, default=4, help="combined: shortest suffix match that drafts instead of the head")
    ap.add_argument("--branch-min-match", type=int, default=1, help="beside: shortest suffix match drafted as a branch beside the head")
    ap.add_argument("--no-compile", action="store_true", help="run the runtime eagerly (no torch.compile)")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    a = ap.parse_args()

    import torch

    from trtspec.bench import open_bundle
    from trtspec.measure import interleaved, warm_up
    from trtspec.runtime import DraftSpec, Stats, generate, speculative_decode
    from trtspec.runtime.kernels import cpu_description
    from trtspec.runtime.suffix import SuffixBranchDrafter, SuffixDrafter, SuffixThenModelDrafter

    run, bundle = a.run_dir, open_bundle(a.run_dir)
    eos, new = bundle.eos, a.max_new_tokens
    sets = {name: load_set(name, run, bundle.tok, a.prompts) for name in a.sets.split(",")}
    target, eagle = bundle.runtime()
    spec, beside = DraftSpec(k=a.k, suffix_len=a.suffix_len), DraftSpec("chain_suffix", k=a.k, suffix_len=a.suffix_len)
    drafters = {"eagle3": eagle, "suffix": SuffixDrafter(),
                "eagle3+suffix": SuffixThenModelDrafter(eagle, SuffixDrafter(min_match=a.min_match)),
                "eagle3|suffix": SuffixBranchDrafter(eagle, SuffixDrafter(min_match=a.branch_min_match))}
    specs = {m: beside if m == "eagle3|suffix" else spec for m in drafters}
    methods = {"no_draft": lambda p: generate(target, torch.tensor(p), new, eos)}
    methods |= {m: (lambda p, d=d, s=specs[m]: speculative_decode(target, d, torch.tensor(p), new, s, eos)) for m, d in drafters.items()}

    machine = cpu_description()
    compile_s, compile_note = 0.0, "off (--no-compile)"
    if not a.no_compile:  # warm up every row count a draft can verify, then every method on every set
        compile_s, compile_note = warm_up(target, [(eagle, beside)],  # its rows include the chains' own
                                          lambda: [methods[m](ps[0]) for ps in sets.values() for m in methods])
    if not a.json:
        print(f"machine: {machine['model']}, {machine['cores']} cores, {machine['torch_threads']} threads; runtime: {compile_note} ({compile_s:.0f} s)")
        print(f"k={a.k}, suffix chains up to {a.suffix_len}, in front: suffix when its match is >= {a.min_match} tokens, "
              f"beside: a branch when it is >= {a.branch_min_match}; "
              f"{a.prompts} prompts per set, {new} new tokens", flush=True)

    rows = []
    with torch.inference_mode():
        for name, prompts in sets.items():
            res = interleaved(methods, prompts)
            ref = [g.tokens for g in res["no_draft"]["outputs"]]
            base_tps = res["no_draft"]["tokens_per_s"][0]
            for m in drafters:
                stats = Stats()
                for g in res[m]["outputs"]:
                    stats.merge(g.stats)
                tps = res[m]["tokens_per_s"][0]
                rows.append({"set": name, "method": m, "prompts": len(prompts),
                             "exact": sum(g.tokens == r for g, r in zip(res[m]["outputs"], ref, strict=True)),
                             "acceptance_length": round(stats.acceptance_length(), 3), "tokens_per_s": round(tps, 2),
                             "no_draft_tokens_per_s": round(base_tps, 2), "speedup_vs_no_draft": round(tps / base_tps, 3)})
            eagle_al = next(r["acceptance_length"] for r in rows if r["set"] == name and r["method"] == "eagle3")
            for r in rows[-len(drafters):]:
                r["al_vs_eagle3"] = round(r["acceptance_length"] / eagle_al, 3)
            if not a.json:
                print(f"\n{name} ({len(prompts)} prompts; no draft {base_tps:.1f} tok/s)")
                print(f"  {'method':<14} {'exact':>5} {'AL':>5} {'AL/eagle3':>9} {'tok/s':>7} {'vs no draft':>11}")
                for r in rows[-len(drafters):]:
                    print(f"  {r['method']:<14} {r['exact']:>2}/{r['prompts']:<2} {r['acceptance_length']:>5.2f} {r['al_vs_eagle3']:>8.2f}x "
                          f"{r['tokens_per_s']:>7.1f} {r['speedup_vs_no_draft']:>10.2f}x", flush=True)
    if a.json:
        print(json.dumps({"run_dir": str(run), "k": a.k, "suffix_len": a.suffix_len, "min_match": a.min_match,
                          "branch_min_match": a.branch_min_match,
                          "max_new_tokens": new, "compile": {"seconds": compile_s, "note": compile_note},
                          "machine": machine, "rows": rows}, indent=2))


if __name__ == "__main__":
    run_main(main)
