#!/usr/bin/env python
"""Whether trtspec asks the target the prompts a vLLM server renders from the same requests: each chat request of a
JSONL file (messages and tools, as `trtspec adapt --prompts` reads them) sent to the /tokenize endpoint of vLLM's
OpenAI server on a bundle's target (the chat template with the request's tools and the generation prompt, rendered
as its /v1/chat/completions renders it), its token ids set beside trtspec's (chat.encode_row of the request as
trtspec reads it), and the requests that differ printed with where they part.

    python scripts/make_agent_requests.py --out agent.jsonl
    python scripts/check_engine_prompts.py runs/agent-base/bundle --prompts agent.jsonl [--json]

The bundle's target/ carries the run's chat template (model.chat_template where the run set one). A request ending on
an assistant turn is sent without it, as trtspec drops it (the target answers again). Exits 1 where a prompt differs.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

from trtspec.bench import arg_parser
from trtspec.errors import DataError, run_main


def requests_of(path: Path) -> list[dict]:
    """The chat requests of a JSONL file: each line's object with `messages`."""
    from trtspec.chat import json_values, read_text

    rows = json_values(read_text(path, "--prompts file", "a JSONL of chat requests"), Counter(), "unparsable line")
    out = [r for r in rows if isinstance(r, dict) and isinstance(r.get("messages"), list) and r["messages"]]
    if not out:
        raise DataError(f"--prompts '{path}' holds no chat request (a JSON object with `messages` a line)",
                        "pass a JSONL of OpenAI chat requests (python scripts/make_agent_requests.py writes one)")
    return out


def engine_ids(port: int, request: dict) -> list[int] | str:
    """vLLM's prompt ids for a chat request (its /tokenize with the generation prompt), or its error's message where
    it refuses the request."""
    body = {"model": "bundle", "messages": request["messages"], "add_generation_prompt": True,
            **({"tools": request["tools"]} if request.get("tools") else {})}
    http = urllib.request.Request(f"http://127.0.0.1:{port}/tokenize", data=json.dumps(body).encode(),
                                  headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(http, timeout=60) as r:
            return json.loads(r.read())["tokens"]
    except urllib.error.HTTPError as e:
        return json.loads(e.read() or b"{}").get("error", {}).get("message", str(e))[:200]


def parted_at(a: list[int], b: list[int]) -> int | None:
    """The first position where two id lists differ (None where equal)."""
    return None if a == b else next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def main() -> int:
    from trtspec.bench import verified
    from trtspec.chat import encode_row
    from trtspec.engines.vllm.sweep import SweepPlan, start_vllm, stop
    from trtspec.models import load_tokenizer
    from trtspec.traffic import request_prompt

    ap = arg_parser(__doc__)
    ap.add_argument("bundle", type=Path, help="a run's bundle folder (RUN/bundle), its export stage done")
    ap.add_argument("--prompts", type=Path, required=True, help="a JSONL of OpenAI chat requests")
    ap.add_argument("--json", action="store_true", help="print the result as one JSON object")
    a = ap.parse_args()
    verified(a.bundle.parent, "export")
    tok = load_tokenizer(a.bundle / "target")
    skips: Counter = Counter()
    pairs = []
    for request in requests_of(a.prompts):
        msgs, tools = request_prompt(request, skips)
        if msgs is not None:
            sent = request["messages"][:-1] if request["messages"][-1].get("role") == "assistant" else request["messages"]
            pairs.append(({**request, "messages": sent}, encode_row(tok, {"messages": msgs, **tools})))
    log = Path(tempfile.mkdtemp(prefix="check-engine-prompts-")) / "vllm.log"  # named by an error where vLLM fails
    server = start_vllm(a.bundle, None, 1, log, SweepPlan(concurrency=[1], draft_lengths=[0]))
    try:
        differ = {}
        for i, (request, ours) in enumerate(pairs):
            theirs = engine_ids(server.port, request)
            if isinstance(theirs, str):
                differ[i] = {"at": None, "trtspec": tok.decode(ours[-12:]), "vllm": f"refused: {theirs}"}
            elif (at := parted_at(ours, theirs)) is not None:
                differ[i] = {"at": at, "trtspec": tok.decode(ours[at : at + 12]), "vllm": tok.decode(theirs[at : at + 12])}
    finally:
        stop(server)
    shutil.rmtree(log.parent, ignore_errors=True)  # the server answered every request: its log says nothing more
    result = {"requests": len(pairs), "identical": len(pairs) - len(differ), "skipped": dict(skips), "differ": differ}
    if a.json:
        print(json.dumps(result, indent=1))
    else:
        for i, d in list(differ.items())[:10]:
            print(f"request {i}: parts at token {d['at']}: trtspec {d['trtspec']!r} | vLLM {d['vllm']!r}")
        print(f"{result['identical']} of {len(pairs)} requests: trtspec's prompt ids equal vLLM's"
              + (f"; skipped by trtspec: {dict(skips)}" if skips else ""))
    return 1 if differ else 0


if __name__ == "__main__":
    run_main(main)
