#!/usr/bin/env python
"""Long-context training against the recipe as it is, side by side: two builds of one recipe through the train stage,
the second with data.context_tokens (a share of the training rows after earlier conversations), both measuring
held-out acceptance at each context length (eval.context_bins) on the same prompts and the same histories.

    python scripts/bench_long_training.py build_configs/smollm2-135m-eagle3.yaml --out runs/long
    python scripts/bench_long_training.py build_configs/smollm2-135m-eagle3.yaml --out runs/long \\
        --context-tokens 8000 --share 0.25 --bins 256,1024,2048,4096,8192 --prompts 16 --set train.epochs=8 --json

The second build starts from the first one's regenerated answers (nothing is asked of the target twice); it trains
online (a long row's target states would not fit an offline cache sized for data.seq_len). Printed per bin: the mean
context in tokens and each head's held-out AL@k with its 95% interval and its ratio to its own shortest bin; then
each head's short held-out AL@k and per category. Needs a GPU for the demo's sizes (8k-token rows).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from trtspec.artifacts import RunDir
from trtspec.bench import arg_parser, stage_metrics, verified
from trtspec.errors import run_main


def build(config: Path, out: Path, sets: list[str]) -> dict:
    """One `trtspec build --until train`; its train manifest."""
    cmd = [sys.executable, "-m", "trtspec.cli", "build", str(config), "--out", str(out), "--until", "train"]
    if rc := subprocess.run(cmd + [a for s in sets for a in ("--set", s)]).returncode:
        sys.exit(rc)  # the build said why, in one line
    return stage_metrics(out, "train")


def main() -> None:
    ap = arg_parser(__doc__)
    ap.add_argument("config", type=Path)
    ap.add_argument("--out", type=Path, required=True, help="folder of the two runs (short/, long/)")
    ap.add_argument("--context-tokens", type=int, default=8000, help="data.context_tokens of the long build")
    ap.add_argument("--share", type=float, default=0.25, help="data.context_share of the long build")
    ap.add_argument("--bins", default="256,1024,2048,4096,8000", help="eval.context_bins, in tokens (each with the answer within the window)")
    ap.add_argument("--prompts", type=int, default=16, help="eval.context_prompts: held-out prompts a bin")
    ap.add_argument("--set", action="append", default=[], help="an override for both builds (repeatable)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()

    bins = sorted(int(b) for b in a.bins.split(","))
    both = [f"eval.context_bins=[{','.join(map(str, bins))}]", f"eval.context_prompts={a.prompts}", *a.set]
    short = build(a.config, a.out / "short", both)
    RunDir(a.out / "long").ensure()
    work = a.out / "long" / ".work"
    work.mkdir(exist_ok=True)
    for answers in (a.out / "short" / ".work").glob("answers-*"):
        if not (work / answers.name).exists():
            shutil.copytree(answers, work / answers.name)
    new_tokens = verified(a.out / "short", "data")[1]["config"]["data"]["max_new_tokens"]
    long = build(a.config, a.out / "long", both + [
        f"data.context_tokens={a.context_tokens}", f"data.context_share={a.share}",
        f"data.seq_len={a.context_tokens + new_tokens}", "train.mode=online"])
    k = verified(a.out / "short", "train")[1]["config"]["draft.length"]
    al = f"AL@{k}"
    table = [{"bin": s["bin"], "context_tokens": s["context_tokens"], "short": s, "long": lo}
             for s, lo in zip(short["per_context"], long["per_context"], strict=True)]
    if a.json:
        print(json.dumps({"k": k, "context_tokens": a.context_tokens, "share": a.share, "bins": table,
                          "heldout": {"short": short[al], "long": long[al]},
                          "per_category": {"short": short["per_category"], "long": long["per_category"]}}))
        return
    print(f"| context (tokens) | recipe {al} | vs its shortest | long-context {al} | vs its shortest | long / recipe |")
    print("|---:|---|---:|---|---:|---:|")
    for r in table:
        s, lo = r["short"], r["long"]
        print(f"| {r['bin']} ({r['context_tokens']}) | {s[al]:.2f} ({s[al + '_ci95'][0]:.2f}-{s[al + '_ci95'][1]:.2f}) | "
              f"{s['vs_shortest']:.2f} | {lo[al]:.2f} ({lo[al + '_ci95'][0]:.2f}-{lo[al + '_ci95'][1]:.2f}) | "
              f"{lo['vs_shortest']:.2f} | {lo[al] / s[al]:.2f} |")
    rows = stage_metrics(a.out / "long", "data")["train_long_context_rows"]
    print(f"held-out {al} ({short['eval_prompts']} short prompts): recipe {short[al]:.2f} {short[al + '_ci95']}, "
          f"long-context {long[al]:.2f} {long[al + '_ci95']} ({rows} of {long['train_rows']} training rows long)")
    for c in sorted(short["per_category"]):
        s, lo = short["per_category"][c], long["per_category"].get(c, {})
        print(f"  {c}: {s[al]:.2f} -> {lo.get(al, float('nan')):.2f}")


if __name__ == "__main__":
    run_main(main)
