#!/usr/bin/env python
"""Write a prompt file whose prompts the target model writes itself (Magpie, arXiv 2406.08464), for a data stage
that needs more prompts than a prompt set holds and has no dataset to read.

An instruct model given its chat template up to the start of a user turn writes a user's message: sampled many
times, that gives varied prompts in the target's own idea of what users ask. Only messages the model ended itself
(an end-of-turn token within --max-new-tokens) are kept, each once, and none that equals a prompt of the --exclude
files (held-out or benchmark prompts must stay unseen). The result feeds `data.sources: [{kind: regenerate, path:
...}]`, where the target then answers each prompt.

    python scripts/make_self_prompts.py demo:smollm2-135m-instruct --n 20000 --out runs/self_prompts.jsonl \\
        --exclude build_configs/prompts/demo_prompts.jsonl build_configs/prompts/code_prompts.jsonl
    python scripts/make_self_prompts.py demo:smollm2-135m-instruct --n 4000 --out runs/self_code.jsonl \\
        --system "You are a Python programming assistant." --category self-code

Prints how many samples were drawn, how many were kept and why the others were not.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

from trtspec.bench import arg_parser
from trtspec.errors import run_main

PLACEHOLDER = "\x00USER\x00"


def user_turn_prefix(tok, system: str | None) -> list[int]:
    """Token ids of the chat template up to where a user's message begins (the template's or `system`'s turn
    first)."""
    turns = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": PLACEHOLDER}]
    text = tok.apply_chat_template(turns, tokenize=False)
    return tok(text.split(PLACEHOLDER)[0], add_special_tokens=False)["input_ids"]


def known_prompts(files: list[Path]) -> set[str]:
    """The prompts of prompt files (the `prompt` field, or the last user turn of `messages`), whitespace-folded."""
    from trtspec.chat import read_prompt_file

    seen = set()
    for f in files:
        for row in read_prompt_file(f, Counter(), "excluded prompts", ""):
            seen.add(" ".join(row["messages"][-1]["content"].split()))
    return seen


def sample_prompts(model, tok, prefix: list[int], n: int, batch: int, max_new: int, temperature: float, eos: set[int],
                   exclude: set[str]) -> tuple[list[str], Counter]:
    """Draw batches of user messages until n distinct new ones are kept (or 4n samples are drawn)."""
    import torch

    kept, why = {}, Counter()
    ids = torch.tensor([prefix], device=model.device)
    while len(kept) < n and why.total() < 4 * n:
        out = model.generate(ids.expand(batch, -1), attention_mask=torch.ones_like(ids).expand(batch, -1),
                             do_sample=True, temperature=temperature, top_p=0.95, max_new_tokens=max_new,
                             eos_token_id=sorted(eos), pad_token_id=tok.pad_token_id)
        for row in out[:, len(prefix):].tolist():
            if len(kept) == n:
                break
            end = next((i for i, t in enumerate(row) if t in eos), None)
            text = " ".join(tok.decode(row[:end]).split()) if end is not None else ""
            reason = ("unfinished" if end is None else "too short" if len(text) < 12 else
                      "excluded" if text in exclude else "repeated" if text in kept else "kept")
            why[reason] += 1
            if reason == "kept":
                kept[text] = None
    return list(kept), why


def main() -> None:
    ap = arg_parser(__doc__)
    ap.add_argument("model", help="the target: an HF folder, a .gguf file or demo:NAME (as model.source)")
    ap.add_argument("--n", type=int, default=20000, help="distinct prompts to write")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--exclude", type=Path, nargs="*", default=[], help="prompt files none of whose prompts is kept")
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--system", help="a system turn that steers the subject (e.g. 'You are a Python programming "
                    "assistant.' for code questions); default: the chat template's own")
    ap.add_argument("--category", default="self", help="the rows' category field")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()

    import torch

    from trtspec.generation import eos_ids
    from trtspec.models import load_model, load_tokenizer, resolve_model, use_bf16

    torch.manual_seed(a.seed)
    folder = resolve_model(a.model)
    tok, model = load_tokenizer(folder), load_model(folder, "bfloat16" if use_bf16("auto") else "float32")
    t0 = time.perf_counter()
    prompts, why = sample_prompts(model, tok, user_turn_prefix(tok, a.system), a.n, a.batch, a.max_new_tokens, a.temperature,
                                  eos_ids(folder, tok), known_prompts(a.exclude))
    a.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = a.out.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps({"id": f"{a.category}-{i}", "category": a.category, "prompt": p}) + "\n"
                           for i, p in enumerate(prompts)), encoding="utf-8")
    tmp.replace(a.out)
    print(f"wrote {len(prompts)} prompts to {a.out} in {time.perf_counter() - t0:.0f} s; "
          f"{why.total()} samples: {dict(why)}")


if __name__ == "__main__":
    run_main(main)
