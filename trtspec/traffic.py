"""Prompts a deployed service received, read from what users have: `trtspec adapt --prompts FILE`.

Formats (--format, `auto` tells them apart by their first usable line, or a JSON array's first element):
  chat          JSONL (or one JSON array) of OpenAI chat requests or conversations: `messages` [{role, content}] or
                the other turns chat.row_turns reads (ShareGPT, SpecForge and Model Optimizer `conversations`,
                LMSYS-Chat `conversation`, instruction rows), a last assistant turn dropped (the target answers
                again); or `prompt` (text); or a Responses API request (`input`, `instructions`); an optional
                `category`
  openai-batch  JSONL (or one JSON array) of the OpenAI batch API's requests (what `vllm run-batch` reads):
                {"custom_id", "url": "/v1/chat/completions" or "/v1/responses", "body": {"messages": [...]} or
                {"input": ...}}; a `metadata.category` in the body is kept
  vllm-log      a `vllm serve --enable-log-requests --log-level DEBUG` log: each chat or Responses request's "JSON
                body" line (a body cut by --max-log-len is skipped, counted)
  sglang-log    a `sglang.launch_server --log-requests --log-requests-level 3 --log-requests-format json` log
                (stdout, or the files of --log-requests-target DIR): each OpenAI request's "request.received.openai"
                line, the request as the client sent it (level 2 cuts a text over 2048 characters: such a request
                is skipped, counted)
  triton-trace  the trace Triton writes with `--trace-config triton,file=FILE --trace-config level=TENSORS
                --trace-config rate=1`: each request's `text_input` tensor, read back into its turns with the earlier
                run's chat template (a text that template did not write is skipped, counted); FILE and the FILE.0,
                FILE.1, ... Triton writes instead with `--trace-config triton,log-frequency=N`
A chat request's `tools` and its tool turns (an assistant turn's `tool_calls`, the `tool` turns answering them: an
agent's requests) are kept, so the target answers as it was asked; a Responses API request's calls and their outputs
(`function_call`, `function_call_output`) and its function tools become those turns and tools, as vLLM reads them.
Raw-text completion requests (/v1/completions) carry no chat turns and are skipped, counted. Repeated prompts are kept
once. Rows are {id, category, messages, tools}, as a prompt file of the data stage (kind: regenerate) holds them.
"""

from __future__ import annotations

import glob
import hashlib
import io
import itertools
import json
import math
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trtspec.chat import (
    content_text,
    engine_tool,
    json_array,
    json_values,
    prompt_key,
    prompt_turns,
    read_text,
    rendered_rows,
    row_prompt,
    row_tools,
    row_turns,
    split_lines,
)
from trtspec.errors import DataError

FORMATS = ("auto", "chat", "openai-batch", "vllm-log", "sglang-log", "triton-trace")
VLLM_BODY = " JSON body: "  # vLLM's RequestLogger.log_request_body: "Request <id> JSON body: <json>"
# SGLang's RequestLogger.log_openai_received_request with --log-requests-format json: log_json's one line,
# json.dumps({"timestamp", "event": "request.received.openai", "obj": the request's model_dump}); its other events
# ("request.received": the tokenized form, "request.finished") are left alone
SGLANG_EVENT = '"event": "request.received.openai"'
SGLANG_RECEIVED = '"event": "request.received"'  # the tokenized request: no text in it at --log-requests-level 0 or 1
SGLANG_CUT = 2048  # --log-requests-level 2: a longer text is logged as its first and last 1024 characters around "..."
# Triton's TraceManager::TraceTensorActivity writes a BYTES element between quotes as it is, unescaped (2.51 here:
# `"data":"\"TEXT\""`), so a trace holding a prompt with a quote or a newline is no JSON: its text_input tensors
# are found by their fixed frame instead
TRITON_TEXT_INPUT = re.compile(r'\{"id":\d+,"activity":"TENSOR_QUEUE_INPUT","tensor":\{"name":"text_input","data":"'
                               r'(.*?)","shape":"([\d,]*)","dtype":"BYTES"\}\}', re.S)


# the text parts of a Responses API message: what the user wrote, what the model answered
RESPONSES_TEXT = ("input_text", "output_text", "text")


def responses_turns(body: dict) -> list[dict] | None:
    """An OpenAI Responses API request's turns (POST /v1/responses, which vLLM serves too), as vLLM's
    construct_input_messages makes chat turns of it: its `instructions` as a system turn, then its `input`, a text or
    items. A message item is a turn whose content is a text or text parts (joined; a content with an image or a file
    is None, chat.content_text); a `function_call` item a call of the assistant turn before it (a new assistant turn
    where none is), a `function_call_output` item a tool turn. None where it has no `input`, or an item of another
    kind (reasoning, a custom or namespaced tool's call): the target cannot be asked it as a chat."""
    items = body.get("input")
    if not isinstance(items, (str, list)):
        return None
    instructions = body.get("instructions")
    turns = [{"role": "system", "content": instructions}] if isinstance(instructions, str) and instructions.strip() else []
    if isinstance(items, str):
        return turns + [{"role": "user", "content": items}]
    for item in items:
        turn = responses_item_turn(item, turns[-1] if turns and turns[-1]["role"] == "assistant" else None)
        if turn is None:
            return None
        if turn is not MERGED:
            turns.append(turn)
    return content_text(turns, RESPONSES_TEXT)


MERGED: dict = {}  # responses_item_turn's answer for an item that became part of the assistant turn before it


def responses_item_turn(item: Any, assistant: dict | None) -> dict | None:
    """One Responses API input item as a chat turn, or MERGED where it joins `assistant` (the assistant turn before it,
    or None), or None where it is no turn a chat template renders. vLLM's _construct_message_from_response_item: a call
    joins the assistant turn's calls, an assistant message fills that turn's empty content."""
    if not isinstance(item, dict):
        return None
    kind = item.get("type", "message")
    if kind == "function_call" and not item.get("namespace"):
        call = {"id": item.get("call_id"), "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments")}}
        if assistant is None:
            return {"role": "assistant", "content": None, "tool_calls": [call]}
        assistant["tool_calls"] = [*assistant.get("tool_calls", []), call]
        return MERGED
    if kind == "function_call_output":
        return {"role": "tool", "content": item.get("output"), "tool_call_id": item.get("call_id")}
    if kind != "message" or "role" not in item:
        return None
    content = item.get("content")
    if item["role"] != "assistant":
        return {"role": item["role"], "content": content}
    text = content if isinstance(content, str) else (content[0].get("text") if content and isinstance(content, list)
                                                     and isinstance(content[0], dict) else None)
    if assistant is not None and assistant.get("content") is None:
        assistant["content"] = text
        return MERGED
    return {"role": "assistant", "content": text}


def responses_tools(tools: Any) -> tuple[Any, str]:
    """A Responses API request's tools in the form a chat template reads, as vLLM's construct_tool_dicts hands them to
    it -> (tools, "") or (None, why they cannot be): a function tool {type: function, name, description, parameters,
    strict} becomes {type: function, function: {name, description, parameters} and strict where set}; a tool of
    another kind (web search, file search, MCP) is shown to no template and is left out; a custom or namespaced tool
    (rendered through vLLM's own shim) is not read. Tools that are null or no list of objects are given back as they
    are (chat.row_tools reads them)."""
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        return tools, ""
    if any(t.get("type") in ("custom", "namespace") for t in tools):
        return None, "Responses request offering custom or namespaced tools"
    return [engine_tool({"function": t}) for t in tools if t.get("type") == "function"], ""


def request_prompt(body: dict, skips: Counter) -> tuple[list[dict] | None, dict]:
    """(a chat request's turns before its answer, the tools it offers as a field of the rows) or (None, {}), counted in
    skips, where it has none. Its turns: chat.row_prompt (a `prompt` text, or turns in any form row_turns reads) or a
    Responses API request's (responses_turns); its tools: chat.row_tools (a Responses request's through
    responses_tools)."""
    msgs, why = row_prompt(body), ""
    if msgs is None and row_turns(body) is not None:
        why = "request without a usable chat turn"
    elif msgs is None and "input" not in body:
        why = "request without messages or prompt"
    elif msgs is None:
        msgs = prompt_turns(responses_turns(body))
        tools, why = responses_tools(body.get("tools"))
        why = why if msgs is not None else "Responses request without a usable chat turn (reasoning, images, custom or namespaced tools)"
        body = {"tools": tools}
    if not why:
        tools, why = row_tools(body)
        if tools is not None:
            return msgs, tools
    skips[why] += 1
    return None, {}


def request_format(row: Any) -> str:
    """The format whose row `row` (a traffic file's first) is: openai-batch, chat or unknown."""
    if isinstance(row, dict) and isinstance(row.get("body"), dict):
        return "openai-batch"
    if isinstance(row, dict) and ("prompt" in row or "input" in row or row_turns(row) is not None):
        return "chat"
    return "unknown"


def detect_format(text: str, array: list | None = None) -> str:
    """The format of a traffic file from its first row: the first element of `array` (the file as one JSON array,
    chat.json_array), else its first non-blank line (a vLLM log: a request line among its first 2000); only those
    lines are split off, read_traffic splits the whole file once."""
    if array is not None:
        first = array[0] if array else None
        return "triton-trace" if isinstance(first, dict) and "model_name" in first else request_format(first)
    if text.lstrip().startswith('[{"id":'):  # a trace whose unescaped texts make it no JSON
        return "triton-trace"
    lines = list(itertools.islice(io.StringIO(text), 2000))
    first = next((ln for ln in lines if ln.strip()), "")
    if any(VLLM_BODY in ln for ln in lines):
        return "vllm-log"
    if any(SGLANG_EVENT in ln or SGLANG_RECEIVED in ln for ln in lines):
        return "sglang-log"
    try:
        return request_format(json.loads(first))
    except json.JSONDecodeError:
        return "unknown"


def request_rows(text: str, fmt: str, array: list | None, skips: Counter) -> list:
    """The JSON value of each request in a traffic file: the elements of `array`, each line's (JSON Lines), or each
    request line's body (a vLLM log; a body cut by --max-log-len counted in skips)."""
    if array is not None:
        return array
    if fmt == "sglang-log":
        return sglang_requests(text, skips)
    if fmt != "vllm-log":
        return json_values(text, skips, "unparsable line")
    out = []
    for line in split_lines(text):
        if VLLM_BODY not in line:
            continue  # the log's other lines
        try:
            out.append(json.loads(line.split(VLLM_BODY, 1)[1]))
        except json.JSONDecodeError:
            skips["request body cut short (vLLM's --max-log-len)"] += 1
    return out


def sglang_requests(text: str, skips: Counter) -> list:
    """The OpenAI request of each "request.received.openai" line of an SGLang JSON request log (its other lines, and
    the server's own, left alone); one whose text --log-requests-level 2 cut, and a request logged without its text
    (level 0 or 1, which log no OpenAI request), are counted in skips."""
    out = []
    for line in split_lines(text):
        if SGLANG_EVENT not in line and SGLANG_RECEIVED not in line:
            continue
        try:
            entry = json.loads(line[line.find("{"):])
        except json.JSONDecodeError:
            skips["unparsable line"] += 1
            continue
        obj = entry.get("obj") if isinstance(entry, dict) else None
        if not isinstance(obj, dict):
            skips["unparsable line"] += 1
        elif entry.get("event") != "request.received.openai":
            if "text" not in obj and "input_ids" not in obj:
                skips["request logged without its text (SGLang's --log-requests-level 0 or 1; 3 logs it)"] += 1
        elif any(cut_by_sglang(t) for t in strings(obj.get("messages", obj.get("input")))):
            skips["request cut short (SGLang's --log-requests-level 2; 3 logs it whole)"] += 1
        else:
            out.append(obj)
    return out


def strings(value: Any) -> list[str]:
    """Every string inside a JSON value."""
    if isinstance(value, str):
        return [value]
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else []
    return [s for v in items for s in strings(v)]


def cut_by_sglang(text: str) -> bool:
    """Whether a text is one SGLang's request log cut (its _transform_data_for_logging: text[:1024] + "..." +
    text[-1024:])."""
    half = SGLANG_CUT // 2
    return len(text) == SGLANG_CUT + 3 and text[half : half + 3] == "..."


def records(rows: list, fmt: str, skips: Counter) -> list[tuple[dict, str | None]]:
    """(request body, its category or None) per request of a traffic file in format `fmt` (request_rows)."""
    out = []
    for row in rows:
        if not isinstance(row, dict):
            skips["unparsable line"] += 1
            continue
        if fmt == "openai-batch":
            if not str(row.get("url", "/v1/chat/completions")).endswith(("/chat/completions", "/responses")):
                skips["completion request (raw text, no chat turns)"] += 1
                continue
            body = row.get("body") if isinstance(row.get("body"), dict) else {}
            meta = body.get("metadata") if isinstance(body.get("metadata"), dict) else {}
            out.append((body, meta.get("category")))
        elif fmt in ("vllm-log", "sglang-log") and "messages" not in row and "input" not in row:
            skips["completion request (raw text, no chat turns)"] += 1
        else:
            out.append((row, row.get("category") if fmt == "chat" else None))
    return out


def trace_files(path: Path) -> list[Path]:
    """A Triton trace's files: FILE where Triton wrote one (at its exit), then FILE.0, FILE.1, ... (log-frequency)."""
    numbered = [p for p in path.parent.glob(f"{glob.escape(path.name)}.*") if p.suffix[1:].isdigit() and p.is_file()]
    return ([path] if path.is_file() else []) + sorted(numbered, key=lambda p: int(p.suffix[1:]))


def trace_text(element: str) -> str:
    """A text_input element as the trace frames it (`\"TEXT\"` in 2.51, `"TEXT"` as the tracer's source writes it)."""
    for quote in ('\\"', '"'):
        if len(element) >= 2 * len(quote) and element.startswith(quote) and element.endswith(quote):
            return element[len(quote):-len(quote)]
    return element


def trace_records(texts: list[str], turns_of: Callable[[str], list[dict] | None], skips: Counter) -> list[tuple[dict, None]]:
    """(a request body {messages}, None) per text_input tensor of a Triton trace's files (their texts), its text read
    back into turns by `turns_of`."""
    out = []
    for text in texts:
        for m in TRITON_TEXT_INPUT.finditer(text):
            if math.prod(int(d) for d in m.group(2).split(",") if d) != 1:
                skips["text_input of several prompts"] += 1
                continue
            turns = turns_of(trace_text(m.group(1)))
            if turns is None:
                skips["text_input the chat template did not write (raw text)"] += 1
                continue
            out.append(({"messages": turns}, None))
    return out


def read_traffic(path: Path, fmt: str = "auto", category: str | None = None,
                 tok: Any = None) -> tuple[list[dict], Counter, str]:
    """(prompt rows {id, category, messages}, skips, the format read) of a traffic file; `category` names rows that
    name none (default "traffic"); `tok`: the target's tokenizer, whose chat template reads a Triton trace's texts
    back into turns and must render each prompt (chat.rendered_rows). A file that is no traffic, or holds no usable
    prompt, is a DataError."""
    where = f"--prompts '{path}'"
    hint = "pass a JSONL of chat requests, an OpenAI batch file, a vLLM or SGLang request log or a Triton trace"
    traces = trace_files(path) if fmt in ("auto", "triton-trace") else []
    if traces and not path.is_file():  # only the FILE.N Triton writes with log-frequency
        text, found, array = "", "triton-trace", None
    else:
        text = read_text(path, "--prompts file", hint)  # read once: a trace of every request's tensors is large
        array = json_array(text) if fmt in ("auto", "chat", "openai-batch") else None
        found = detect_format(text, array) if fmt == "auto" else fmt
    if found == "unknown":
        raise DataError(f"{where}: not a traffic file this tool reads (its first line is no chat request, OpenAI "
                        "batch request, vLLM or SGLang request-log line or Triton trace)",
                        f"formats: {', '.join(FORMATS[1:])} (trtspec adapt --help)")
    skips: Counter = Counter()
    if found == "triton-trace":
        from trtspec.chat import turns_reader

        if tok is None:
            raise ValueError("a Triton trace is read with the target's tokenizer (its chat template): pass tok")
        numbered = [f.read_text(encoding="utf-8", errors="replace") for f in traces if f != path]
        bodies = trace_records([text, *numbered], turns_reader(tok), skips)
    else:
        bodies = records(request_rows(text, found, array, skips), found, skips)
    rows, seen = [], set()
    for body, cat in bodies:
        msgs, tools = request_prompt(body, skips)
        if msgs is None:
            continue
        key = prompt_key(msgs, tools)
        if key in seen:
            skips["repeated prompt"] += 1
            continue
        seen.add(key)
        name = str(cat).strip() if cat is not None and str(cat).strip() else (category or "traffic")
        rows.append({"id": "traffic-" + hashlib.sha1(key.encode()).hexdigest()[:12], "category": name, "messages": msgs,
                     **tools})
    if tok is not None:  # requests whose turns the target's chat template refuses: skipped and counted
        rows = rendered_rows(rows, tok, skips, prompts=True)
    if not rows:
        why = ", ".join(f"{n} {r}" for r, n in skips.items()) or "no request in it"
        raise DataError(f"{where} holds no usable prompt ({found}: {why})",
                        "a chat request needs a user turn; a vLLM log needs --enable-log-requests --log-level DEBUG; "
                        "an SGLang log --log-requests --log-requests-level 3 --log-requests-format json; "
                        "a Triton trace needs --trace-config level=TENSORS and prompts in the target's chat template")
    return rows, skips, found
