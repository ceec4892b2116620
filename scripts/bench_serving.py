#!/usr/bin/env python
"""A bundle served by vLLM's OpenAI server at each draft length (0 = no draft), loaded by NVIDIA's load generator
aiperf at each concurrency: output tokens/s, time to first token, inter-token latency and the acceptance length vLLM
counted, side by side; the draft length per batch size the sweep implies, measured against the best fixed length and
against no draft at each level, and saved for `trtspec deploy triton RUN --drafting auto` (RUN/bench/sweep.json).

    bash scripts/setup.sh --engines vllm --bench     # aiperf in .venv-bench: its pins clash with vLLM's
    python scripts/bench_serving.py runs/demo --concurrency 1 4 16 32 --draft-lengths 0 1 2 3

The prompts are the run's held-out conversations (data/heldout.jsonl, their user turn, chat endpoint, greedy, up to
--max-tokens): text the head was not trained on, as a user's would be. Each level sends max(2 x concurrency,
--min-requests) requests after a warm-up of min(concurrency, 4). Greedy answers are the same at every draft length
(lossless), so the servers generate the same tokens and tokens/s compare directly. Servers bind 127.0.0.1.
Default --draft-lengths: 0 and the bundle's draft length (with and without the draft).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from trtspec.bench import arg_parser, verified
from trtspec.chat import read_rows
from trtspec.engines.vllm.sweep import (
    ServerPool,
    SweepPlan,
    find_aiperf,
    run_sweep,
    save_sweep,
    write_prompts,
)
from trtspec.errors import TrtspecError, run_main


def heldout_prompts(run: Path) -> list[str]:
    """The user turn of the run's one-turn held-out conversations."""
    rows = read_rows(verified(run, "data")[0] / "heldout.jsonl")
    return [r["messages"][-2]["content"] for r in rows if len(r["messages"]) >= 2 and r["messages"][-2]["role"] == "user"]


def main() -> int:
    from trtspec.engines import read_options

    ap = arg_parser(__doc__)
    ap.add_argument("run", type=Path, help="a trtspec run directory with a finished export (its bundle/)")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 32])
    ap.add_argument("--draft-lengths", type=int, nargs="+", default=None,
                    help="draft lengths to serve, 0 = no draft (default: 0 and the bundle's)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--min-requests", type=int, default=8, help="requests per level at least (else 2 x concurrency)")
    ap.add_argument("--aiperf", default=None, help="the aiperf executable (default: PATH, then .venv-bench)")
    ap.add_argument("--work", type=Path, default=None, help="folder for logs and aiperf artifacts (default: RUN/bench)")
    ap.add_argument("--server-timeout", type=float, default=600, help="seconds for vLLM to come up")
    ap.add_argument("--level-timeout", type=float, default=900, help="seconds for one concurrency level")
    ap.add_argument("--json", type=Path, default=None, help="write the result here too")
    ap.add_argument("--no-iomp", action="store_true", help="vLLM's CPU build without Intel OpenMP preloaded")
    ap.add_argument("--repeats", type=int, default=1,
                    help="rounds of every server at each concurrency, back to back; a level keeps its median round")
    args = ap.parse_args()
    try:
        bundle = verified(args.run, "export")[0]
    except TrtspecError as e:
        sys.exit(f"Error: {e}")
    k_max = read_options(bundle)["speculative_config"]["max_draft_len"]
    lengths = sorted(set(args.draft_lengths if args.draft_lengths is not None else [0, k_max]))
    if bad := [k for k in lengths if not 0 <= k <= k_max]:
        sys.exit(f"Error: --draft-lengths {bad[0]}: the bundle drafts 0..{k_max} tokens")
    if bad := [c for c in args.concurrency if c < 1]:
        sys.exit(f"Error: --concurrency {bad[0]}: at least 1")
    if args.repeats < 1:
        sys.exit(f"Error: --repeats {args.repeats}: at least 1")
    try:
        texts = heldout_prompts(args.run)
    except TrtspecError as e:
        sys.exit(f"Error: {e}")
    if not texts:
        sys.exit(f"Error: {args.run}/data/heldout.jsonl holds no user prompt")
    work = args.work or args.run / "bench"
    work.mkdir(parents=True, exist_ok=True)
    plan = SweepPlan(sorted(set(args.concurrency)), lengths, args.max_tokens, args.min_requests, args.server_timeout,
                     args.level_timeout, not args.no_iomp, args.repeats)
    try:
        aiperf = find_aiperf(args.aiperf)
        n = write_prompts(texts, work / "prompts.jsonl")
        print(f"{n} held-out prompts, concurrency {plan.concurrency}, draft lengths {lengths}, up to {args.max_tokens} "
              f"tokens, aiperf {aiperf}", file=sys.stderr)
        log = lambda m: print(m, file=sys.stderr)  # noqa: E731
        result = run_sweep(ServerPool(bundle, plan, work, aiperf, work / "prompts.jsonl", log), plan, log)
    except TrtspecError as e:
        sys.exit(f"Error: {e}")
    print(result["table"] + "\n\n" + (result["crossover"] + "\n" if result["crossover"] else "")
          + f"schedule: {result['schedule']} ({result['decided']})")
    result = save_sweep(args.run, result, work)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    run_main(main)
