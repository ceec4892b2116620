#!/usr/bin/env python
"""Draft families side by side on one target: EAGLE-3, DFlash and DFlash2 drafts (each from its own finished run)
timed in one process, interleaved prompt by prompt, on held-out chat prompts and on code prompts.

    python scripts/bench_drafters.py runs/demo runs/demo-dflash runs/demo-dflash2    # table on stdout
    python scripts/bench_drafters.py runs/demo runs/demo-dflash --ks eagle3=3 --ks dflash=3,7 --json
    python scripts/bench_drafters.py runs/demo --draft-weights float32,bfloat16       # the draft's storage, side by side
    python scripts/bench_drafters.py runs/demo runs/demo-adapted --suite build_configs/prompts/unseen_prompts.jsonl --prompts 32
    python scripts/bench_drafters.py runs/demo runs/demo-dflash runs/demo-dflash2 --write   # and into docs/results.md

Every run must hold the same target (its bundle/target is loaded once, from the first run). For each prompt set,
every prompt runs the runtime without a draft and each (draft, k) in turn, so machine noise hits all alike.
Columns: tokens/s, AL (tokens per target forward), how many outputs are token-identical to the runtime without a
draft (greedy: all must be), per-position acceptance, and one speculative step's cost in plain decode steps
(AL x no-draft tokens/s / speculative tokens/s: what drafting and verifying k + 1 rows cost against one token).
--write puts the table, with the command, date and machine, into docs/results.md between its bench-drafters markers.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from trtspec.bench import arg_parser, verified
from trtspec.errors import run_main

CODE_PROMPTS = Path(__file__).resolve().parent.parent / "build_configs" / "prompts" / "code_prompts.jsonl"


def prompt_sets(run: Path, tok, n: int) -> dict[str, list[list[int]]]:
    """held-out chat prompts of the first run's data stage, and the recipe folder's code prompts."""
    from collections import Counter

    from trtspec.bench import load_prompts
    from trtspec.chat import encode_row, read_prompt_file

    code = read_prompt_file(CODE_PROMPTS, Counter(), "code prompts", "")[:n]
    return {"chat": load_prompts(run, tok, n), "code": [encode_row(tok, r) for r in code]}


def parse_ks(items: list[str]) -> dict[str, list[int]]:
    ks = {"eagle3": [3], "dflash": [3, 7], "dflash2": [3, 7]}
    for item in items:
        method, _, values = item.partition("=")
        ks[method] = [int(v) for v in values.split(",")]
    return ks


def markdown(table: list[dict]) -> str:
    lines = ["| prompts | drafting | tokens/s | vs no draft | AL | identical | step cost (decode steps) | acceptance by position |",
             "|---|---|---:|---:|---:|---:|---:|---|"]
    lines += [f"| {r['prompts']} | {r['method']} | {r['tokens_per_s']:.1f} | {r['speedup_vs_no_draft']:.2f}x | "
              f"{r['acceptance_length']:.2f} | {r['identical']}/{r['of']} | {r['step_cost_in_decode_steps']:.2f} | "
              f"{', '.join(f'{x:.2f}' for x in r['accept_rate_by_position'])} |" for r in table]
    return "\n".join(lines)


def main() -> None:
    ap = arg_parser(__doc__)
    ap.add_argument("runs", type=Path, nargs="+", help="finished runs (bundle/ and data/), one per draft")
    ap.add_argument("--ks", action="append", default=[], help="METHOD=K[,K...]: draft lengths per family "
                    "(default eagle3=3, dflash=3,7, dflash2=3,7)")
    ap.add_argument("--prompts", type=int, default=4, help="prompts per set (chat, code)")
    ap.add_argument("--suite", type=Path, help="a JSONL suite (prompt or messages, category) as the one prompt set: "
                    "--prompts of its rows, spread evenly over the file, instead of the chat and code sets")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--draft-weights", default="auto", help="STORAGE[,STORAGE...]: how each draft's product weights "
                    "are stored, auto | float32 | bfloat16; several load each draft once per storage, timed side by side")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--write", action="store_true", help="also write the table into docs/results.md (its markers)")
    a = ap.parse_args()
    storages = a.draft_weights.split(",")
    if set(storages) - {"auto", "float32", "bfloat16"}:  # kernels.STORAGES, checked before anything loads
        ap.error(f"--draft-weights: expected auto, float32 or bfloat16 (comma-separated), got {a.draft_weights!r}")

    import torch

    from trtspec.bench import load_suite_prompts, open_bundle
    from trtspec.draft_families import load_drafter
    from trtspec.measure import median_speeds, time_methods, warm_up
    from trtspec.runtime import DraftSpec, Stats, generate, speculative_decode
    from trtspec.runtime.kernels import cpu_description

    bundle = open_bundle(a.runs[0])
    tok, eos, new = bundle.tok, bundle.eos, a.max_new_tokens
    target, _ = bundle.runtime(draft=False)
    ks = parse_ks(a.ks)
    drafts = {}  # name -> (drafter, the target layers it reads, its k values)
    for run in a.runs:
        for storage in storages:
            drafter = load_drafter(verified(run, "export")[0] / "draft", target, weights=storage)
            limit = drafter.info.guesses if hasattr(drafter, "info") else 16  # a block drafts at most its guesses
            label = f"{drafter.name}:{run.name}" + (f":{drafter.net.kernel_choice['draft_weights']['weights']}" if len(storages) > 1 else "")
            drafts[label] = (drafter, target.aux_layers, [k for k in ks.get(drafter.name, [3]) if k <= limit])
    sets = {a.suite.stem: load_suite_prompts(a.suite, tok, a.prompts)} if a.suite else prompt_sets(a.runs[0], tok, a.prompts)

    def speculative(p, drafter, layers, k):
        target.aux_layers = layers  # each draft reads its own target layers: the target hands those out
        return speculative_decode(target, drafter, torch.tensor(p), new, DraftSpec(k=k), eos)

    def no_draft(p):
        target.aux_layers = ()
        return generate(target, torch.tensor(p), new, eos)

    methods = {"runtime_no_draft": no_draft}
    for name, (drafter, layers, kk) in drafts.items():
        for k in kk:
            methods[f"{name}@k={k}"] = lambda p, d=drafter, lay=layers, k=k: speculative(p, d, lay, k)
    torch._dynamo.config.cache_size_limit = max(64, torch._dynamo.config.cache_size_limit)  # graphs per aux-layer set
    compile_note = "off (--no-compile)"
    if not a.no_compile:
        first = next(iter(sets.values()))[0]
        layers_of = {id(drafter): layers for drafter, layers, _ in drafts.values()}
        # every row count each draft's passes meet (a graph per run of counts sharing a kernel), each draft reading
        # its own target layers, then every method
        compile_s, compile_note = warm_up(target, [(d, DraftSpec(k=k)) for d, _, kk in drafts.values() for k in kk],
                                          lambda: [m(first) for m in methods.values()],
                                          before_draft=lambda d: setattr(target, "aux_layers", layers_of[id(d)]))
        compile_note += f" ({compile_s:.0f} s)"
    machine = cpu_description()
    if not a.json:
        print(f"machine: {machine['model']}, {machine['cores']} cores; runtime {compile_note}", flush=True)

    table = []
    for set_name, prompts in sets.items():
        timed, _ = time_methods(methods, prompts, a.repeats, target.kernel_choice)
        tps = median_speeds(timed)
        reference = [g.tokens for g in timed["runtime_no_draft"]["outputs"]]
        for m in methods:
            stats = Stats()
            for g in timed[m]["outputs"]:
                stats.merge(g.stats)
            al = stats.acceptance_length()
            k = max(stats.drafted) if stats.drafted else 0
            table.append({
                "prompts": set_name, "method": m, "tokens_per_s": round(tps[m], 2), "acceptance_length": round(al, 3),
                "identical": sum(g.tokens == r for g, r in zip(timed[m]["outputs"], reference, strict=True)),
                "of": len(prompts), "speedup_vs_no_draft": round(tps[m] / tps["runtime_no_draft"], 3),
                "step_cost_in_decode_steps": round(al * tps["runtime_no_draft"] / tps[m], 3),
                "accept_rate_by_position": [round(x, 3) for x in stats.per_position(k)],
            })
            if not a.json:
                r = table[-1]
                print(f"{set_name:>5} {m:<34} {r['tokens_per_s']:>7.1f} tok/s  {r['speedup_vs_no_draft']:>5.2f}x  AL {al:>5.2f}  "
                      f"identical {r['identical']}/{r['of']}  step {r['step_cost_in_decode_steps']:>5.2f} decode steps  "
                      f"by position {r['accept_rate_by_position']}", flush=True)
    if a.json:
        print(json.dumps({"runs": [str(r) for r in a.runs], "max_new_tokens": new, "compile": compile_note,
                          "machine": machine, "rows": table}, indent=2))
    if a.write:
        from trtspec.bench import DOCS, measured_line, write_doc_section

        command = "python scripts/bench_drafters.py " + " ".join(sys.argv[1:])
        write_doc_section(DOCS / "results.md", "bench-drafters", f"{measured_line(command)}runtime {compile_note}\n\n"
                          + markdown(table))
    if any(r["identical"] != r["of"] for r in table):
        sys.exit("error: a draft changed a greedy output")


if __name__ == "__main__":
    run_main(main)
