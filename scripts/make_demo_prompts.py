"""Write the demo's prompt sets: varied tasks from templates x topics. build_configs/prompts/broad_prompts.jsonl
(--broad: twelve kinds, the demo recipe's) and demo_prompts.jsonl (six kinds, the first demo set).

The draft head learns from the target's answers to these prompts, and its held-out split measures acceptance,
so a set is large (the head overfits a few hundred conversations) and spread over kinds of task.
Deterministic: the same seed writes the same file. The generator itself is trtspec.demo_prompts (the builtin
evaluation suite, eval.suites kind builtin, draws from it too, minus both files' prompts).

    python scripts/make_demo_prompts.py                # 2400 prompts of six kinds: demo_prompts.jsonl
    python scripts/make_demo_prompts.py --n 400 --out /tmp/p.jsonl
    python scripts/make_demo_prompts.py --broad        # twelve kinds: build_configs/prompts/broad_prompts.jsonl
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from trtspec.demo_prompts import DEMO_N, DEMO_SEED, build, build_broad
from trtspec.errors import run_main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=DEMO_N)
    ap.add_argument("--seed", type=int, default=DEMO_SEED)
    ap.add_argument("--broad", action="store_true", help="twelve kinds of task (passages, roles, reasoning, history) "
                    "instead of six")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    name = "broad_prompts.jsonl" if a.broad else "demo_prompts.jsonl"
    a.out = a.out or Path(__file__).parents[1] / "build_configs" / "prompts" / name
    rows = (build_broad if a.broad else build)(a.n, a.seed)
    a.out.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    counts = {c: sum(r["category"] == c for r in rows) for c in dict.fromkeys(r["category"] for r in rows)}
    print(f"wrote {len(rows)} prompts to {a.out}: {counts}")


if __name__ == "__main__":
    run_main(main)
