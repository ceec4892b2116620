#!/usr/bin/env python
"""Write second-turn prompts from answered conversations (a run's data/train.jsonl, or any chat JSONL whose rows hold
a user turn and its answer): the first question, its answer cut to its first whole sentences, and a generic follow-up
("Can you give me an example?", trtspec.demo_prompts.FOLLOW_UPS), for the target to answer again in `trtspec adapt
--prompts` or a data stage (`data.sources: [{kind: regenerate, path: ...}]`). A draft trained on single questions
meets its first follow-up turn in serving; this gives it some.

Deterministic: the same conversations and seed write the same file.

    python scripts/make_follow_up_prompts.py runs/demo/data/train.jsonl --n 300 --out follow_ups.jsonl
    trtspec adapt runs/demo --prompts follow_ups.jsonl --out runs/demo-follow-ups
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from trtspec.bench import arg_parser
from trtspec.chat import conversations_from_rows, read_jsonl
from trtspec.demo_prompts import follow_up_prompts
from trtspec.errors import DataError, run_main


def main() -> None:
    ap = arg_parser(__doc__)
    ap.add_argument("conversations", type=Path, help="a chat JSONL of answered conversations (messages rows)")
    ap.add_argument("--n", type=int, default=300, help="prompts to write at most (default 300)")
    ap.add_argument("--words", type=int, default=45, help="the first answer kept to this many words (default 45)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    if a.words < 1 or a.n < 1:
        raise DataError(f"--n {a.n} / --words {a.words}: both must be at least 1")
    skips: Counter = Counter()
    rows = conversations_from_rows(read_jsonl(a.conversations, skips), a.conversations.stem, skips)
    conversations = [c["messages"] for c in rows]
    rows = follow_up_prompts(conversations, a.n, a.seed, a.words)
    if not rows:
        raise DataError(f"{a.conversations}: no conversation with a user turn and its answer to follow up "
                        "(expected JSONL rows of messages [{role, content}], such as a run's data/train.jsonl)")
    a.out.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    print(f"wrote {len(rows)} follow-up prompts to {a.out} from {len(conversations)} conversations")


if __name__ == "__main__":
    run_main(main)
