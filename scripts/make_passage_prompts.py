#!/usr/bin/env python
"""Write prompts that hand over passages of your own documents (extract, summarise, rewrite), for `trtspec adapt
--prompts` or a data stage (`data.sources: [{kind: regenerate, path: ...}]`), so a draft learns on the kind of text
your traffic hands the target rather than on the demo generator's made-up notices and schedules.

Each prompt is a run of 2-4 whole sentences of one document (--words long) with one of the demo generator's
instructions for its kind (trtspec.demo_prompts.PASSAGE_FORMS); the kinds take turns, no passage twice.
Deterministic: the same documents and seed write the same file. DOCS: one document per line (data.sources kind:
text's format), blank lines skipped, or JSONL rows with a `text` field (trtspec.chat.read_documents); or the word
`builtin`: the paragraphs of the Python language reference on every machine (trtspec.suites.builtin_prose).

    python scripts/make_passage_prompts.py docs.txt --n 300 --out passages.jsonl
    python scripts/make_passage_prompts.py docs.txt --n 300 --words 40-120 --seed 1 --out passages.jsonl
    python scripts/make_passage_prompts.py builtin --n 96 --out prose.jsonl
    python scripts/make_passage_prompts.py builtin --min-words 30 --n 300 --seed 1 --out prose.jsonl
    trtspec adapt runs/demo --prompts passages.jsonl --out runs/demo-passages
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from trtspec.bench import arg_parser
from trtspec.chat import read_documents
from trtspec.demo_prompts import passage_prompts
from trtspec.errors import DataError, run_main
from trtspec.suites import builtin_prose


def word_range(text: str) -> tuple[int, int]:
    lo, _, hi = text.partition("-")
    if not (lo.isdigit() and hi.isdigit() and 0 < int(lo) <= int(hi)):
        raise DataError(f"--words '{text}': expected a range of word counts such as 25-75")
    return int(lo), int(hi)


def main() -> None:
    ap = arg_parser(__doc__)
    ap.add_argument("docs", type=Path, help="a text file, one document per line, or builtin (the Python language "
                    "reference's paragraphs)")
    ap.add_argument("--n", type=int, default=300, help="prompts to write at most (default 300)")
    ap.add_argument("--words", default="25-75", help="a passage's length in words, a range (default 25-75)")
    ap.add_argument("--seed", type=int, default=0, help="which sentences start a passage and which instruction it gets")
    ap.add_argument("--min-words", type=int, default=50, help="builtin only: the shortest paragraph read (default 50; "
                    "30 reads 249 paragraphs where 50 reads 102)")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    words = word_range(a.words)
    if str(a.docs) == "builtin":
        if a.min_words < 1:
            raise DataError(f"--min-words {a.min_words}: expected a word count of 1 or more")
        if not (docs := builtin_prose(a.min_words)):
            raise DataError(f"--min-words {a.min_words}: no paragraph of the language reference is that long",
                            "lower it (50 reads 102 paragraphs)")
    else:
        docs = read_documents(a.docs, Counter(), "documents file", "one document per line, or JSONL rows with a text field")
    rows = passage_prompts(docs, a.n, a.seed, words)
    if not rows:
        raise DataError(f"{a.docs}: no run of 2-4 sentences of {a.words} words in its {len(docs)} documents "
                        "(one document per line, sentences ending in . ! or ?); try a wider --words")
    a.out.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    counts = {c: sum(r["category"] == c for r in rows) for c in dict.fromkeys(r["category"] for r in rows)}
    print(f"wrote {len(rows)} prompts to {a.out} from {len(docs)} documents: {counts}")


if __name__ == "__main__":
    run_main(main)
