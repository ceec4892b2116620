#!/usr/bin/env python
"""What the data stage labels in conversations rendered by a chat template: each assistant turn's tokens, for a few
conversations (one turn; a system prompt and two turns; reasoning inline and as `reasoning_content`; an agent's turn:
tools offered, a tool called, its output, an answer; a system prompt and a question after the others, as
data.context_tokens lengthens a row), printed as the labelled text with a verdict: every answer and tool call
labelled whole, and no user's, system's or tool's words labelled.

    python scripts/check_template_masks.py path/to/model              # the folder's tokenizer and chat template
    python scripts/check_template_masks.py a.jinja b.jinja --json     # templates on the demo model's tokenizer

A model folder is read with its own tokenizer; a .jinja file (a folder of them) on the demo model's, whose vocabulary
lacks most families' markers (<|eot_id|>, <end_of_turn>): a labelled span may then start or end with a piece of one.
Exits 1 where a conversation is labelled wrong. A template that refuses a conversation says why (a system turn).
"""

from __future__ import annotations

import json
from pathlib import Path

from trtspec.bench import arg_parser
from trtspec.chat import template_refusal
from trtspec.errors import DataError, run_main

MARKS = ("U1", "U2", "S0", "O1", "D0")  # the words of the user's, system's and tool's turns and of the tools offered,
# none of which may be labelled


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def answer(text: str, **extra: str) -> dict:
    return {"role": "assistant", "content": text, **extra}


CONVERSATIONS = {
    "one turn": [user("U1 name a colour?"), answer("A1 blue is one.")],
    "system, two turns": [{"role": "system", "content": "S0 be brief."}, user("U1 name a colour?"), answer("A1 blue."),
                          user("U2 another?"), answer("A2 red.")],
    "reasoning": [user("U1 name a colour?"), answer("<think>\nT1 a primary one.\n</think>\n\nA1 blue."),
                  user("U2 another?"), answer("A2 red.", reasoning_content="T2 a warm one.")],
}

AGENT = "agent"  # a turn that calls a tool, the tool's output, the answer: labelled where the model wrote them
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "D0 the weather in a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
CALL = {"id": "call12345", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
CONVERSATIONS[AGENT] = [user("U1 umbrella in Paris?"), answer("", tool_calls=[CALL]),
                        {"role": "tool", "content": "O1 light rain", "tool_call_id": "call12345", "name": "get_weather"},
                        answer("A1 take one.")]

LONG = "after the others"  # data.context_tokens' row: chat.with_context puts the conversations above before its own


def after_the_others(tok: object) -> list[dict]:
    from trtspec.chat import with_context

    row = {"messages": [{"role": "system", "content": "S0 be brief."}, user("U2 one more?"), answer("A3 green.")]}
    return with_context(row, [{"messages": m} for m in CONVERSATIONS.values()], tok, 1 << 20)["messages"]


def labelled(tok: object, msgs: list[dict], tools: list | None = None) -> list[str]:
    """The labelled runs of tokens of a conversation, as text (chat.tokenize_row's mask)."""
    from trtspec.chat import tokenize_row

    ids, mask, _ = tokenize_row({"messages": msgs, "tools": tools}, tok, 1 << 20)
    runs: list[list[int]] = [[]]
    for t, m in zip(ids, mask, strict=True):
        if m:
            runs[-1].append(t)
        elif runs[-1]:
            runs.append([])
    return [tok.decode(r) for r in runs if r]


def verdict(msgs: list[dict], spans: list[str]) -> str:
    text = "".join(spans)
    answers = [m["content"].split("</think>")[-1].strip() for m in msgs if m["role"] == "assistant" and m["content"]]
    answers += [w for m in msgs for c in m.get("tool_calls", ()) for w in (c["function"]["name"], *c["function"]["arguments"].values())]
    wrong = [f"'{w}' labelled" for w in MARKS if w in text] + [f"'{a}' not labelled" for a in answers if a not in text]
    return "; ".join(wrong) or "right"


def templates(paths: list[str]) -> list[tuple[str, object]]:
    """(name, tokenizer) per model folder or .jinja file (each file of a folder of them)."""
    from trtspec.models import load_tokenizer, resolve_model

    out = []
    for p in map(Path, paths):
        if (p / "config.json").is_file():
            out.append((p.name, load_tokenizer(p)))
            continue
        files = sorted(p.glob("*.jinja")) if p.is_dir() else [p]
        if not files or not all(f.is_file() for f in files):
            raise DataError(f"'{p}' is neither a model folder nor a .jinja file (or a folder of them)")
        for f in files:
            tok = load_tokenizer(resolve_model("demo:smollm2-135m-instruct"))
            tok.chat_template = f.read_text(encoding="utf-8")
            out.append((f.stem, tok))
    return out


def main() -> int:
    ap = arg_parser(__doc__)
    ap.add_argument("paths", nargs="+", help="model folders, .jinja files or folders of them")
    ap.add_argument("--json", action="store_true", help="print the results as one JSON object")
    a = ap.parse_args()
    results: dict[str, dict] = {}
    for name, tok in templates(a.paths):
        for conv in [*CONVERSATIONS, LONG]:
            try:
                msgs = after_the_others(tok) if conv == LONG else CONVERSATIONS[conv]
                tools = TOOLS if conv == AGENT else None
                if why := template_refusal(tok, msgs, False, tools):  # as the data stage skips such a row
                    raise DataError(why)
                spans = labelled(tok, msgs, tools)
                results.setdefault(name, {})[conv] = {"labelled": spans, "verdict": verdict(msgs, spans)}
            except DataError as e:
                results.setdefault(name, {})[conv] = {"refused": e.message}
    if a.json:
        print(json.dumps(results, indent=2, ensure_ascii=False))
    else:
        for name, convs in results.items():
            for conv, r in convs.items():
                print(f"{name:28} {conv:18} " + (f"refused: {r['refused']}" if "refused" in r else
                                                  f"{r['verdict']:10} {r['labelled']!r}"))
    return int(any(r.get("verdict", "right") != "right" for convs in results.values() for r in convs.values()))


if __name__ == "__main__":
    run_main(main)
