"""Prompts a deployed service received, read from what users have: `trtspec adapt --prompts FILE`.

Formats (--format, `auto` tells them apart by their first usable line):
  chat          JSONL of OpenAI chat requests or conversations: `messages` [{role, content}] (a last assistant turn
                dropped: the target answers again), or `prompt` (text); an optional `category`
  openai-batch  JSONL of the OpenAI batch API's requests (what `vllm run-batch` reads): {"custom_id", "url":
                "/v1/chat/completions", "body": {"messages": [...]}}; a `metadata.category` in the body is kept
  vllm-log      a `vllm serve --enable-log-requests --log-level DEBUG` log: each request's "JSON body" line (a body cut
                by --max-log-len is skipped, counted)
Raw-text completion requests (/v1/completions) carry no chat turns and are skipped, counted. Repeated prompts are kept
once. Rows are {id, category, messages}, as a prompt file of the data stage (kind: regenerate) holds them.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path

from trtspec.chat import read_lines
from trtspec.errors import DataError
from trtspec.suites import prompt_turns

FORMATS = ("auto", "chat", "openai-batch", "vllm-log")
VLLM_BODY = " JSON body: "  # vLLM's RequestLogger.log_request_body: "Request <id> JSON body: <json>"


def content_text(turns: list) -> list:
    """OpenAI message content given as parts [{type: text, text}] joined to one text (other parts dropped)."""
    out = []
    for t in turns:
        if isinstance(t, dict) and isinstance(t.get("content"), list):
            t = {**t, "content": "".join(p.get("text", "") for p in t["content"] if isinstance(p, dict)
                                         and p.get("type") == "text")}
        out.append(t)
    return out


def request_prompt(body: dict, skips: Counter) -> list[dict] | None:
    """A chat request's turns before its answer, or None (counted in skips) where it has none."""
    if isinstance(body.get("messages"), list):
        msgs = prompt_turns(content_text(body["messages"]))
        if msgs is None:
            skips["request without a usable chat turn"] += 1
        return msgs
    if "prompt" in body and isinstance(body["prompt"], str) and body["prompt"].strip():
        return [{"role": "user", "content": body["prompt"]}]
    skips["request without messages or prompt"] += 1
    return None


def detect_format(lines: list[str]) -> str:
    """The format of a traffic file from its first non-blank line."""
    first = next((ln for ln in lines if ln.strip()), "")
    if VLLM_BODY in first or any(VLLM_BODY in ln for ln in lines[:2000]):
        return "vllm-log"
    try:
        row = json.loads(first)
    except json.JSONDecodeError:
        return "unknown"
    if isinstance(row, dict) and isinstance(row.get("body"), dict):
        return "openai-batch"
    if isinstance(row, dict) and ("messages" in row or "prompt" in row):
        return "chat"
    return "unknown"


def records(lines: list[str], fmt: str, skips: Counter) -> list[tuple[dict, str | None]]:
    """(request body, its category or None) per line of a traffic file in format `fmt`."""
    out = []
    for line in lines:
        if not line.strip():
            continue
        if fmt == "vllm-log" and VLLM_BODY not in line:
            continue  # the log's other lines
        text = line.split(VLLM_BODY, 1)[1] if fmt == "vllm-log" else line
        try:
            row = json.loads(text)
        except json.JSONDecodeError:
            skips["request body cut short (vLLM's --max-log-len)" if fmt == "vllm-log" else "unparsable line"] += 1
            continue
        if not isinstance(row, dict):
            skips["unparsable line"] += 1
            continue
        if fmt == "openai-batch":
            if not str(row.get("url", "/v1/chat/completions")).endswith("/chat/completions"):
                skips["completion request (raw text, no chat turns)"] += 1
                continue
            body = row.get("body") if isinstance(row.get("body"), dict) else {}
            meta = body.get("metadata") if isinstance(body.get("metadata"), dict) else {}
            out.append((body, meta.get("category")))
        elif fmt == "vllm-log" and "messages" not in row:
            skips["completion request (raw text, no chat turns)"] += 1
        else:
            out.append((row, row.get("category") if fmt == "chat" else None))
    return out


def read_traffic(path: Path, fmt: str = "auto", category: str | None = None) -> tuple[list[dict], Counter, str]:
    """(prompt rows {id, category, messages}, skips, the format read) of a traffic file; `category` names rows that
    name none (default "traffic"). A file that is no traffic, or holds no usable prompt, is a DataError."""
    where = f"--prompts '{path}'"
    lines = read_lines(path, "--prompts file", "pass a JSONL of chat requests, an OpenAI batch file or a vLLM request log")
    found = detect_format(lines) if fmt == "auto" else fmt
    if found == "unknown":
        raise DataError(f"{where}: not a traffic file this tool reads (its first line is no chat request, OpenAI "
                        "batch request or vLLM request-log line)",
                        f"formats: {', '.join(FORMATS[1:])} (trtspec adapt --help)")
    skips: Counter = Counter()
    rows, seen = [], set()
    for body, cat in records(lines, found, skips):
        msgs = request_prompt(body, skips)
        if msgs is None:
            continue
        key = json.dumps(msgs, sort_keys=True)
        if key in seen:
            skips["repeated prompt"] += 1
            continue
        seen.add(key)
        name = str(cat).strip() if cat is not None and str(cat).strip() else (category or "traffic")
        rows.append({"id": "traffic-" + hashlib.sha1(key.encode()).hexdigest()[:12], "category": name, "messages": msgs})
    if not rows:
        why = ", ".join(f"{n} {r}" for r, n in skips.items()) or "no request in it"
        raise DataError(f"{where} holds no usable prompt ({found}: {why})",
                        "a chat request needs a user turn; a vLLM log needs --enable-log-requests --log-level DEBUG")
    return rows, skips, found
