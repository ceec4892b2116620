#!/usr/bin/env python
"""The lockstep sweep's memory with every draft length's vLLM engine loaded at once against the same sweep in groups
(what the engine stage does when the memory free cannot hold them all, `engines_that_fit`): peak RSS, wall time and
the schedule each decides, one sweep after the other in its own process, on one run's bundle.

    python scripts/bench_sweep_memory.py runs/demo --together 0 3 2 --concurrency 1 4 --draft-lengths 0 1 2 3

--together 0 = every engine at once; N = groups of N engines, each with no draft beside its lengths.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

from trtspec.errors import run_main


def one_sweep(run: Path, together: int, concurrency: list[int], lengths: list[int], max_tokens: int) -> dict:
    """The engine stage's lockstep sweep on the run's bundle and held-out prompts, in this process (run as a child:
    its peak RSS is its own)."""
    from trtspec.bench import load_prompts, open_bundle
    from trtspec.engines.vllm import sweep

    plan = sweep.SweepPlan(concurrency, lengths, max_tokens, min_requests=16, together=together)
    b = open_bundle(run)
    prompts = load_prompts(run, b.tok, 16)  # the run's held-out prompts, chat-templated
    t0 = time.time()
    result = sweep.lockstep_sweep(b.path, prompts, plan, log=lambda *a: None)
    return {"together": together, "groups": result["groups"], "wall_s": round(time.time() - t0, 1),
            "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
            "schedule": result["schedule"], "decided": result["decided"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="a trtspec run with a finished export (its bundle/)")
    ap.add_argument("--together", type=int, nargs="+", default=[0, 3, 2])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--draft-lengths", type=int, nargs="+", default=[0, 1, 2, 3])
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        print(json.dumps(one_sweep(args.run, args.child, args.concurrency, args.draft_lengths, args.max_tokens)))
        return 0
    rows = []
    for n in args.together:
        cmd = [sys.executable, __file__, str(args.run), "--child", str(n), "--concurrency", *map(str, args.concurrency),
               "--draft-lengths", *map(str, args.draft_lengths), "--max-tokens", str(args.max_tokens)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode:
            print(f"together={n} failed: {done.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
            return 1
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(f"{'engines at once':<16} {'groups':<26} {'peak RSS GiB':>12} {'wall s':>7}  schedule")
    for r in rows:
        at_once = "all" if not r["together"] else str(r["together"])
        print(f"{at_once:<16} {str(r['groups']):<26} {r['peak_rss_gib']:>12} {r['wall_s']:>7}  {r['schedule']} ({r['decided']})")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    run_main(main)
