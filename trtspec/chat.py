"""Conversations and prompts: the file formats trtspec reads, chat templates, and loss masks.

Rows are {id, category, messages} and, where the conversation offered the model tools, `tools` (OpenAI's function
specs, as a request sends them): `messages` are OpenAI-style turns [{role, content}], an assistant turn's `tool_calls`
and the `tool` turns answering them included (chat_turn); in training data the last one is the assistant's answer. A
prompt is the turns before an answer, encoded with the tokenizer's chat template, the row's tools and its generation
prompt (`encode_prompt`; `encode_row` for a row): the one way every stage and script turns messages into token ids.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

from trtspec.errors import DataError

ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant",
         "bing": "assistant", "bard": "assistant", "model": "assistant", "system": "system", "developer": "system",
         "tool": "tool", "function": "tool", "ipython": "tool"}  # a tool's output: OpenAI's, its older name, Llama 3.1's


def require_file(path: Path, what: str, hint: str) -> None:
    """A DataError naming `path` as `what` when it is a folder, a pipe or device, or does not exist. A pipe
    (`--prompts <(zcat log.gz)`) is refused: a build reads its files twice, once to check them and once to use them."""
    if path.is_dir():
        raise DataError(f"{what} '{path}' is a folder, not a file", hint)
    if path.exists() and not path.is_file():
        raise DataError(f"{what} '{path}' is not a regular file (a pipe or a device: trtspec reads its files more "
                        "than once)", "write it to a file first")
    if not path.is_file():
        raise DataError(f"{what} '{path}' does not exist", hint)


# compressed files, by their first bytes (a log rotated to .gz, a dataset's .jsonl.xz): read as the text inside
COMPRESSED = {b"\x1f\x8b": "gzip", b"BZh": "bz2", b"\xfd7zXZ\x00": "lzma"}


def file_bytes(path: Path, what: str, limit: int = -1) -> bytes:
    """A file's bytes, or the bytes inside it where it is gzip, bzip2 or xz-compressed (its first bytes say which,
    not its name); `limit`: at most that many. A compressed file cut short or corrupt is a DataError naming it."""
    import importlib
    import zlib

    with open(path, "rb") as f:
        head = f.read(6)
        kind = next((m for magic, m in COMPRESSED.items() if head.startswith(magic)), None)
        if kind is None:
            f.seek(0)
            return f.read(limit)
    module = importlib.import_module(kind)
    try:
        with module.open(path, "rb") as f:
            return f.read(limit)
    except (EOFError, OSError, zlib.error, getattr(module, "LZMAError", OSError)) as e:  # cut short, or corrupt
        raise DataError(f"{what} '{path}' is {kind}-compressed and cannot be read whole ({type(e).__name__}: {e})",
                        "compress it again, or give it uncompressed") from None


def check_text_file(path: Path, what: str, hint: str) -> None:
    """A DataError unless `path` is a file whose start reads as UTF-8 text, compressed or not (what a build checks
    before spending)."""
    require_file(path, what, hint)
    try:
        decode_text(file_bytes(path, what, 1 << 16))
    except UnicodeDecodeError as e:
        if e.start < (1 << 16) - 4:  # not a multi-byte character cut at the end of the sample
            raise DataError(f"{what} '{path}' cannot be read as UTF-8 text (UnicodeDecodeError)") from None
    except OSError as e:
        raise DataError(f"{what} '{path}' cannot be read ({e.strerror})") from None


def read_lines(path: Path, what: str = "data file", hint: str = "check data.sources[*].path (relative to the YAML)") -> list[str]:
    """The lines of a UTF-8 text file (split_lines); a missing or binary file is a DataError naming it as `what`."""
    return split_lines(read_text(path, what, hint))


def split_lines(text: str) -> list[str]:
    """The lines of a text file, split at "\\n" alone (a trailing "\\r" dropped), JSON Lines' separator: str.splitlines
    also splits at U+0085, U+2028 and U+2029, which JSON holds unescaped inside a string (json.dumps with
    ensure_ascii=False writes them so: the data stage's own files), and would cut such a row in two."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [ln[:-1] if ln.endswith("\r") else ln for ln in lines]


def read_text(path: Path, what: str = "data file", hint: str = "check data.sources[*].path (relative to the YAML)") -> str:
    """A text file whole (decode_text: UTF-8, or UTF-16 with its byte-order mark), gzip, bzip2 or xz-compressed or
    not (file_bytes); a missing or binary file is a DataError naming it as `what`."""
    require_file(path, what, hint)
    try:
        return decode_text(file_bytes(path, what))
    except (UnicodeDecodeError, OSError) as e:
        raise DataError(f"{what} '{path}' cannot be read as UTF-8 text ({e.__class__.__name__})") from None


def decode_text(data: bytes) -> str:
    """A user's text file as str: UTF-8, its byte-order mark dropped (Notepad writes one: it would make the first row
    unparsable), or UTF-16 where a byte-order mark says so (Windows PowerShell 5's `>` and Out-File write it). A
    truncated sample (check_text_file) may end inside a character: the caller judges where the error is."""
    if data[:2] in (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE):
        return data.decode("utf-16")
    return data.decode("utf-8-sig")


def read_jsonl(path: Path, skips: Counter) -> list[dict]:
    """JSON objects, one per line (or the elements of one JSON array, json_array); blank lines ignored, unparsable
    lines counted as skips."""
    rows = []
    for row in json_values(read_text(path), skips, "unparsable line"):
        if isinstance(row, dict):
            rows.append(row)
        else:
            skips["not a JSON object"] += 1
    return rows


def json_array(text: str) -> list | None:
    """The elements of a file that is one JSON array (`json.dump(rows, f, indent=2)` writes one), or None where it is
    not. Read line by line, such a file's lines are "[", "{" and fragments of rows: a prompt file's would each become
    a prompt."""
    if not text.lstrip().startswith("["):
        return None
    try:
        rows = json.loads(text)
    except json.JSONDecodeError:
        return None
    return rows if isinstance(rows, list) else None


def json_values(text: str, skips: Counter, unparsable: str) -> list:
    """A JSON file's rows: the elements of one JSON array (json_array), else the value of each non-blank line (JSON
    Lines), a line that is no JSON counted in skips as `unparsable`."""
    array = json_array(text)
    if array is not None:
        return array
    values = []
    for line in split_lines(text):
        if not line.strip():
            continue
        try:
            values.append(json.loads(line))
        except json.JSONDecodeError:
            skips[unparsable] += 1
    return values


def json_or_lines(path: Path, text: str, skips: Counter, unparsable: str) -> tuple[bool, list]:
    """(True, json_values) for a file of JSON rows: named .jsonl, its first line an object, or one JSON array; else
    (False, its non-blank lines): a prompt or document file may be plain text, one per line."""
    array = json_array(text)
    if array is not None:
        return True, array
    lines = [ln for ln in split_lines(text) if ln.strip()]
    if path.suffix == ".jsonl" or (lines and lines[0].lstrip().startswith("{")):
        return True, json_values(text, skips, unparsable)
    return False, lines


# Where a row keeps its chat turns: OpenAI/HF `messages`; `conversations` (ShareGPT's turns {from, value}, or {role,
# content} as SpecForge's prepare_data.py and Model Optimizer's prepare_input_conversations write them); LMSYS-Chat-1M's
# and WildChat's `conversation`
TURN_KEYS = ("messages", "conversations", "conversation")
# One-turn instruction rows, by the keys their datasets use: the request (Alpaca and Dolly `instruction`, OpenOrca
# `question`), the text it is about (Alpaca `input`, Dolly `context`), a system prompt (OpenOrca `system_prompt`) and
# the answer (Alpaca `output`, Dolly and OpenOrca `response`)
REQUEST_KEYS, ABOUT_KEYS, SYSTEM_KEYS, ANSWER_KEYS = ("instruction", "question"), ("input", "context"), ("system_prompt",), \
    ("output", "response")


def first_text(row: dict, keys: tuple[str, ...]) -> str | None:
    """The first of `keys` whose value in `row` is a text with more than blanks, or None."""
    return next((row[k] for k in keys if isinstance(row.get(k), str) and row[k].strip()), None)


def instruction_turns(row: dict) -> list[dict] | None:
    """An instruction row's turns: [system,] user (the request, then a blank line and the text it is about) [,
    assistant], or None where the row has no request."""
    request = first_text(row, REQUEST_KEYS)
    if request is None:
        return None
    about, system, answer = (first_text(row, keys) for keys in (ABOUT_KEYS, SYSTEM_KEYS, ANSWER_KEYS))
    turns = [{"role": "system", "content": system}] if system else []
    turns.append({"role": "user", "content": f"{request}\n\n{about}" if about else request})
    return turns + ([{"role": "assistant", "content": answer}] if answer else [])


def role_content(turns: list) -> list:
    """Turns with ShareGPT's {from, value} read as {role, content}; other turns as they are."""
    return [{**t, "role": t["from"], "content": t.get("value")} if isinstance(t, dict) and "role" not in t and "from" in t
            else t for t in turns]


def row_turns(row: dict) -> list | None:
    """A row's chat turns (TURN_KEYS, role_content; or an instruction row's), None where it holds none. Roles and
    contents are as the row has them: to_messages and prompt_turns check them."""
    turns = next((row[k] for k in TURN_KEYS if isinstance(row.get(k), list)), None)
    return instruction_turns(row) if turns is None else role_content(turns)


def chat_turn(t: Any, text_types: tuple[str, ...] = ("text",)) -> tuple[dict | None, str]:
    """One turn as the chat templates read it -> (turn, "") or (None, why it cannot be used). A `developer` turn is a
    system turn (OpenAI's newer name); content given as parts is joined (parts_text: a part of another type, an image
    or audio, is no text). An assistant turn keeps its `tool_calls` (tool_calls: a call's arguments as an object; its
    content may then be empty) and its `reasoning_content` (a reasoning parser's output in vLLM's or SGLang's
    responses) for the template to render where it renders them; a tool turn its `tool_call_id` and `name`."""
    if not isinstance(t, dict):
        return None, "a turn that is not an object"
    name = str(t.get("role", "")).lower()
    role = ROLES.get(name)
    if role is None:
        return None, f"role '{name}'" if name else "a turn without a role"
    content = t.get("content")
    if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
        content = parts_text(content, text_types)
        if content is None:
            return None, "non-text content parts"
    keep: dict = {}
    calls = t.get("tool_calls") or ([{"function": t["function_call"]}] if t.get("function_call") else None)
    if role == "assistant" and calls:
        keep["tool_calls"] = tool_calls(calls)
        if keep["tool_calls"] is None:
            return None, "a tool call without a function name, or with arguments that are no JSON object"
        content = content or ""
    if not isinstance(content, str):
        return None, "null content" if content is None else "non-text content"
    reasoning = t.get("reasoning_content")
    if role == "assistant" and isinstance(reasoning, str) and reasoning.strip():
        keep["reasoning_content"] = reasoning
    if role == "tool":
        keep = {k: t[k] for k in ("tool_call_id", "name") if isinstance(t.get(k), str)}
    return {"role": role, "content": content, **keep}, ""


def tool_calls(calls: Any) -> list[dict] | None:
    """An assistant turn's tool calls [{id, type: function, function: {name, arguments}}] with each call's arguments
    an object, as vLLM and SGLang hand them to a chat template (a request sends them as a JSON text; an empty one is
    {}), or None where one is no call of a named function."""
    if not isinstance(calls, list):
        return None
    out = []
    for c in calls:
        f = c.get("function") if isinstance(c, dict) else None
        if not isinstance(f, dict) or not isinstance(f.get("name"), str) or not f["name"].strip():
            return None
        args = f.get("arguments") or {}
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                return None
        if not isinstance(args, dict):
            return None
        out.append({**({"id": c["id"]} if isinstance(c.get("id"), str) else {}), "type": "function",
                    "function": {"name": f["name"], "arguments": args}})
    return out


def chat_turns(turns: list, text_types: tuple[str, ...] = ("text",)) -> tuple[list[dict] | None, str]:
    """Each turn's chat_turn -> (turns, "") or (None, why the first unusable one is), a tool turn answering no tool call
    among them (one follows an assistant turn's calls, or another tool turn)."""
    msgs = []
    for t in turns:
        m, why = chat_turn(t, text_types)
        if m is None:
            return None, why
        if m["role"] == "tool" and not (msgs and (msgs[-1]["role"] == "tool" or msgs[-1].get("tool_calls"))):
            return None, "a tool turn that answers no tool call"
        msgs.append(m)
    return msgs, ""


def row_tools(row: dict) -> tuple[dict | None, str]:
    """A row's `tools` as a field of the rows trtspec writes -> ({"tools": [...]} or {} where it offers none, "") or
    (None, why they are unusable): OpenAI's [{type: function, function: {...}}] as vLLM hands them to a chat template
    (engine_tool), or the bare function specs HF's chat templates also read, as the row gave them."""
    tools = row.get("tools")
    if tools is None or tools == []:
        return {}, ""
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        return None, "tools that are no list of objects"
    return {"tools": [engine_tool(t) if isinstance(t.get("function"), dict) else t for t in tools]}, ""


def engine_tool(tool: dict) -> dict:
    """An OpenAI tool {type: function, function: {...}} as vLLM's server hands it to the chat template (its
    ChatCompletionToolsParam's model_dump()): {type, function: {name, description, parameters}} in that order, a
    missing description or parameters null, `strict` kept where set, other keys dropped. A template printing tools as
    JSON then writes what vLLM writes from the same request (scripts/check_engine_prompts.py)."""
    f = tool["function"]
    spec = {"name": f.get("name"), "description": f.get("description"), "parameters": f.get("parameters")}
    return {"type": "function", "function": {**spec, **({"strict": f["strict"]} if f.get("strict") is not None else {})}}


def tools_field(row: dict) -> dict:
    """{"tools": [...]} of a row that offers tools (read through row_tools), {} of one that offers none: what a row
    made from it carries on."""
    return {"tools": row["tools"]} if row.get("tools") else {}


def to_messages(row: dict) -> tuple[list[dict] | None, str]:
    """A row's turns (row_turns, each a chat_turn) -> (turns ending on an assistant turn, "") or (None, why the row
    cannot be trained on); the last answer is a text or tool calls."""
    turns = row_turns(row)
    if turns is None:
        return None, "no chat turns (messages, conversations or instruction)"
    msgs, why = chat_turns(turns)
    if msgs is None:
        return None, why
    last = max((i for i, m in enumerate(msgs) if m["role"] == "assistant"), default=None)
    if last is None:
        return None, "no assistant turn"
    if not msgs[last]["content"].strip() and not msgs[last].get("tool_calls"):
        return None, "an empty answer"
    return msgs[: last + 1], ""


def conversations_from_rows(rows: list[dict], name: str, skips: Counter) -> list[dict]:
    out = []
    for i, row in enumerate(rows):
        if isinstance(row.get("text"), str) and row_turns(row) is None:
            out.append(text_row(row["text"], f"{name}:{i}"))
            continue
        msgs, why = to_messages(row)
        tools, bad = row_tools(row)
        if msgs is None or tools is None:
            skips[why or bad] += 1
            continue
        out.append({"id": str(row.get("id", f"{name}:{i}")), "category": str(row.get("category", "chat")), "messages": msgs,
                    **tools})
    return out


def prompts_from_rows(rows: list[dict], name: str, skips: Counter) -> list[dict]:
    """{id, category, messages, tools} of what the target answers again in each conversation row (regenerate: true):
    the turns before its last answer, or, where it has no answer yet, its turns as a prompt (prompt_turns: Model
    Optimizer's prepared conversations hold the user's turns only). Rows without either are counted in skips."""
    out = []
    for i, row in enumerate(rows):
        msgs, why = to_messages(row)
        prompt = msgs[:-1] if msgs else prompt_turns(row_turns(row)) if why == "no assistant turn" else None
        tools, bad = row_tools(row)
        if tools is None:
            skips[bad] += 1
            continue
        if not prompt:
            skips[why if msgs is None else "conversation without a turn before its answer"] += 1
            continue
        if not any(m["content"].strip() for m in prompt):
            skips["an empty prompt"] += 1
            continue
        out.append({"id": str(row.get("id", f"{name}:{i}")), "category": str(row.get("category", "chat")),
                    "messages": prompt, **tools})
    return out


def parts_text(parts: list, text_types: tuple[str, ...] = ("text",)) -> str | None:
    """OpenAI message content given as parts [{type: text, text}] joined to one text, or None where a part is another
    (an image, audio, a file): its text alone is not what was asked, and a text-only target was never asked it."""
    if all(isinstance(p, dict) and p.get("type") in text_types and isinstance(p.get("text"), str) for p in parts):
        return "".join(p["text"] for p in parts)
    return None


def content_text(turns: list, text_types: tuple[str, ...] = ("text",)) -> list:
    """Turns whose content is given as parts, that content as one text (parts_text; None where a part is no text:
    prompt_turns then reads no prompt, as to_messages skips such conversations)."""
    return [{**t, "content": parts_text(t["content"], text_types)} if isinstance(t, dict) and isinstance(t.get("content"), list)
            else t for t in turns]


def prompt_turns(turns: Any) -> list[dict] | None:
    """Chat turns (chat_turns; content given as text parts joined, content_text) as a prompt, a last assistant turn
    dropped (the target answers again), or None where they are no prompt: a turn without a known role or text (an
    image among its parts), or no text at all."""
    if not isinstance(turns, list):
        return None
    msgs, _ = chat_turns(content_text(turns))
    if msgs and msgs[-1]["role"] == "assistant":
        msgs = msgs[:-1]
    return msgs if msgs and any(m["content"].strip() for m in msgs) else None


def row_prompt(row: dict) -> list[dict] | None:
    """A prompt row's turns: its `prompt` text as a user turn, else its turns (row_turns) before a last answer (the
    target answers again), or None where it holds no prompt. Its tools: row_tools."""
    if isinstance(row.get("prompt"), str) and row["prompt"].strip():
        return [{"role": "user", "content": row["prompt"]}]
    return prompt_turns(row_turns(row))


def text_row(text: str, row_id: str) -> dict:
    # a plain document: one assistant message, tokenized without the chat template (see tokenize_row)
    return {"id": row_id, "category": "text", "messages": [{"role": "assistant", "content": text}]}


def is_text_row(row: dict) -> bool:
    """Whether a row is a plain document (text_row), which no chat template renders."""
    return row.get("category") == "text" and len(row["messages"]) == 1


def read_prompt_file(path: Path, skips: Counter, what: str = "data file",
                     hint: str = "check data.sources[*].path (relative to the YAML)") -> list[dict]:
    """Prompts to regenerate: JSONL rows with a `prompt` text or turns (row_prompt: the turns before an answer, any
    form row_turns reads), or plain lines.

    Duplicate prompts are dropped (counted). A file that is one JSON array of such objects is read as its rows."""
    as_json, rows = json_or_lines(path, read_text(path, what, hint), skips, "unparsable prompt line")
    prompts, seen = [], set()
    for row in rows:
        if as_json:
            if not isinstance(row, dict):
                skips["unparsable prompt line"] += 1
                continue
            msgs, (tools, bad) = row_prompt(row), row_tools(row)
            if msgs is None or tools is None:
                skips[bad or "prompt row without prompt"] += 1
                continue
            category = str(row.get("category", "chat"))
        else:
            msgs, tools, category = [{"role": "user", "content": row.strip()}], {}, "chat"
        key = prompt_key(msgs, tools)
        if key in seen:
            skips["duplicate prompt"] += 1
            continue
        seen.add(key)
        prompts.append({"id": hashlib.sha1(key.encode()).hexdigest()[:12], "category": category, "messages": msgs, **tools})
    return prompts


def prompt_key(msgs: list[dict], tools: dict) -> str:
    """What tells two prompts apart: their turns, and the tools they offer (row_tools' field). A prompt without tools
    is keyed by its turns alone, so its id is what it was before tools were read."""
    return json.dumps([msgs, tools["tools"]] if tools else msgs, sort_keys=True)


def answered_by_target(kind: str, regenerate: bool) -> bool:
    """Whether a data source (data.sources[*]) gives prompts for the target to answer rather than conversations."""
    return kind == "regenerate" or (regenerate and kind in ("jsonl", "hf"))


def read_source(path: Path, skips: Counter, kind: str, limit: int | None = None, regenerate: bool = False,
                name: str | None = None) -> list[dict]:
    """The rows a local data source (data.sources[*] of kind regenerate, jsonl or text) gives the data stage:
    prompts (see answered_by_target), text documents or conversations. The build's preflight reads each source
    through this too, so it refuses exactly the files the data stage could not use.

    `name` prefixes the ids of rows without one (default: the file's stem); `limit` is data.sources[*].limit."""
    name = name or path.stem
    if kind == "regenerate":
        return read_prompt_file(path, skips)[:limit]
    if kind == "text":
        lines = [ln for ln in read_lines(path) if ln.strip()][:limit]
        return [text_row(ln, f"{name}:{i}") for i, ln in enumerate(lines)]
    rows = read_jsonl(path, skips)[:limit]
    return prompts_from_rows(rows, name, skips) if answered_by_target(kind, regenerate) else \
        conversations_from_rows(rows, name, skips)


def usable_row(kind: str, regenerate: bool) -> str:
    """What a usable row of a data source is: a key of USABLE_ROW."""
    return "prompt" if answered_by_target(kind, regenerate) else "document" if kind == "text" else "conversation"


# what a file that gave nothing usable should hold instead, by what its rows are
USABLE_ROW = {
    "prompt": "one JSON object per line with a non-empty 'prompt' or chat turns ('messages', 'conversations', "
              "'conversation', 'instruction'), or one prompt per line",
    "conversation": "one JSON object per line with chat turns ('messages', 'conversations', 'conversation', or "
                    "'instruction' and 'output') ending on an assistant turn; prompts without answers: regenerate: true",
    "document": "one document per line",
    "report": "an earlier validate's report.json",
}


def require_rows(rows: list, path: Path, what: str, row: str, skips: Counter) -> None:
    """A DataError naming `path` when reading it gave no usable `row` (a key of USABLE_ROW), with the skips counted."""
    if rows:
        return
    why = ", ".join(f"{n} {reason}" for reason, n in skips.items()) or "empty, or blank lines only"
    raise DataError(f"{what} '{path}' holds no usable {row} ({why})", USABLE_ROW[row])


def tokenize_row(row: dict, tok: Any, seq_len: int) -> tuple[list[int], list[int], bool]:
    """(input_ids, loss_mask, truncated): chat template applied (with the row's tools), loss on assistant tokens only
    (an answer's text or tool calls; a tool's output is the conversation's, not the model's). A regenerated row
    brings the target's own tokens (input_ids, label_start: see regenerate); they are used as they are."""
    msgs = row["messages"]
    if "input_ids" in row:
        ids = list(row["input_ids"])
        mask = [0] * row["label_start"] + [1] * (len(ids) - row["label_start"])
    elif is_text_row(row):
        ids = tok(msgs[0]["content"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        mask = [1] * len(ids)
    else:
        ids, mask = assistant_mask(tok, msgs, row.get("tools"))
    truncated = len(ids) > seq_len
    return ids[:seq_len], mask[:seq_len], truncated


def assistant_mask(tok: Any, msgs: list[dict], tools: list | None = None) -> tuple[list[int], list[int]]:
    """The conversation's template ids and a mask over each assistant turn's tokens: template(msgs[:i+1]) minus
    template(msgs[:i] + generation prompt) where both are prefixes of the whole conversation. Some templates render an
    earlier turn otherwise once later turns follow (Qwen3 drops its reasoning and the empty <think> block, Mistral's
    move the system message into the last user turn); such a turn is found by its text in the whole instead."""
    ids = template_ids(tok, msgs, False, tools)
    mask = [0] * len(ids)
    found = None
    for i, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        start, end = template_ids(tok, msgs[:i], True, tools), template_ids(tok, msgs[: i + 1], False, tools)
        if ids[: len(start)] == start and ids[: len(end)] == end:
            mask[len(start) : len(end)] = [1] * (len(end) - len(start))
            continue
        found = found or turns_in_text(tok, msgs, ids, tools)
        for k in found.get(i, ()):
            mask[k] = 1
    return ids, mask


def turns_in_text(tok: Any, msgs: list[dict], ids: list[int], tools: list | None = None) -> dict[int, range]:
    """{assistant turn index: its token positions in `ids`}, each turn located by its text in the whole
    conversation's rendering, in order: its answer (after any `</think>`; followed by what the template closes a turn
    with, `<|im_end|>` or `</s>`, where it can be), back to the end of the template's generation prompt before it
    (`<|im_start|>assistant\\n`, less trailing blanks or from a `<think>` on, which the rendering may show otherwise), else to
    the turn's reasoning where the rendering shows it. A turn that calls tools is found by its own rendering instead
    (called_turn), which writes the calls. A turn whose answer is not in the rendering gets no labels."""
    text = render(tok, msgs, tools)
    bounds = token_bounds(tok, text, len(ids))
    spans, cursor = {}, 0
    for i, m in enumerate(msgs):
        if m["role"] != "assistant":
            said = (m.get("content") or "").strip()
            at = text.find(said, cursor) if said else -1
            cursor = at + len(said) if at >= 0 else cursor
            continue
        *thought, answer = (m.get("content") or "").split("</think>")
        if m.get("tool_calls"):
            answer = shown_prefix(text, called_turn(tok, msgs, i, tools), cursor, m["tool_calls"])
        if not (answer := answer.strip()):
            continue
        last = render(tok, msgs[: i + 1], tools)
        tail = last[last.rfind(answer) + len(answer):]
        at = next((a for a in (text.find(answer + tail, cursor), text.find(answer, cursor)) if a >= 0), -1)
        if at < 0:
            continue
        before, prompt = (render(tok, msgs[:i], tools, g) for g in (False, True))
        header = prompt[len(before):] if prompt.startswith(before) else ""
        opened = header.split("<think>")[0]
        heads = [h for h in dict.fromkeys((header, opened, header.rstrip(), opened.rstrip())) if h.strip()]
        shown = next(((h, a) for h in heads if (a := text.rfind(h, cursor, at)) >= 0), None)
        reasoning = (m.get("reasoning_content") or "".join(thought).replace("<think>", "")).strip()
        thinks = text.find(reasoning, cursor, at) if reasoning else -1
        begin = shown[1] + len(shown[0]) if shown else thinks if thinks >= 0 else at
        close = at + len(answer)
        close += len(os.path.commonprefix([tail, text[close : close + len(tail)]]))
        spans[i] = range(sum(e <= begin for _, e in bounds), sum(s < close for s, _ in bounds))  # a token across `begin` too
        cursor = close
    return spans


def called_turn(tok: Any, msgs: list[dict], i: int, tools: list | None) -> str:
    """Assistant turn i, which calls tools, as the template renders it last: what follows the turns before it and as
    much of the generation prompt as it shows (Gemma 4's and Nemotron's open an empty reasoning block there, which a
    call does not), from after any reasoning block (Qwen3 shows an empty one on a last turn alone); "" where the
    rendering does not begin with the turns before it as far as the generation prompt does (Phi-4-mini closes a
    conversation with <|im_end|>, which a generation prompt replaces)."""
    last, before, prompt = render(tok, msgs[: i + 1], tools), render(tok, msgs[:i], tools), render(tok, msgs[:i], tools, True)
    shown = len(os.path.commonprefix([last, prompt]))
    if shown < len(os.path.commonprefix([before, prompt])):
        return ""
    return last[shown:].split("</think>")[-1].strip()


def shown_prefix(text: str, turn: str, cursor: int, calls: list[dict]) -> str:
    """The longest beginning of a called turn's rendering that `text` shows from `cursor` on (a template may close the
    conversation's last turn otherwise: Phi-4-mini ends it with <|im_end|>), or "" where that beginning leaves out
    one of the calls' names."""
    shown, longer = 0, len(turn)  # turn[:shown] is in the text; a beginning of it is too, so bisect
    while shown < longer:
        k = (shown + longer + 1) // 2
        shown, longer = (k, longer) if text.find(turn[:k], cursor) >= 0 else (shown, k - 1)
    return turn[:shown] if all(c["function"]["name"] in turn[:shown] for c in calls) else ""


def token_bounds(tok: Any, text: str, n: int) -> list[tuple[int, int]]:
    """The characters (start, end) of each of the n template tokens of `text`: a fast tokenizer's offsets where it
    splits the text into those tokens, else the lengths of the text each prefix of them decodes to."""
    if getattr(tok, "is_fast", False):
        enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        if len(enc["input_ids"]) == n:
            return [tuple(b) for b in enc["offset_mapping"]]
    ids = tok(text, add_special_tokens=False)["input_ids"]
    ends = [len(tok.decode(ids[: k + 1])) for k in range(len(ids))]
    return list(zip([0] + ends[:-1], ends, strict=True))


# what to do where the target's chat template refuses turns (its raise_exception: Gemma's and Mistral's templates refuse
# a system turn, or turns that do not alternate user / assistant)
REFUSED = "refused by the chat template: "  # a skip counted by the template's own reason
TEMPLATE_HINT = "merge a system turn into the first user turn and keep the turns alternating, or drop such rows"


def render(tok: Any, msgs: list[dict], tools: list | None = None, generation_prompt: bool = False, tokenize: bool = False) -> Any:
    """The chat template applied to turns and the tools they offer, as vLLM and SGLang apply it to a request."""
    return tok.apply_chat_template(msgs, tools=tools or None, tokenize=tokenize, add_generation_prompt=generation_prompt)


def template_refusal(tok: Any, msgs: list[dict], generation_prompt: bool, tools: list | None = None) -> str | None:
    """Why the tokenizer's chat template refuses these turns (its own words), or None where it renders them; turns
    holding tool calls it renders without them (a template written for chat alone) are refused too, since their
    labels would be an empty answer."""
    try:
        text = render(tok, msgs, tools, generation_prompt)
    except Exception as e:  # noqa: BLE001 -- the template's raise_exception, or its code failing on these turns
        return refusal_words(e)
    if any(m.get("tool_calls") for m in msgs) and render_or_none(tok, without_calls(msgs), tools, generation_prompt) == text:
        return "tool calls it does not show (a template for chat alone: serve a tool-calling one)"
    return None


def without_calls(msgs: list[dict]) -> list[dict]:
    return [{k: v for k, v in m.items() if k != "tool_calls"} for m in msgs]


def render_or_none(tok: Any, msgs: list[dict], tools: list | None, generation_prompt: bool) -> str | None:
    """render, or None where the template refuses the turns (Qwen3's a tool turn after no call)."""
    try:
        return render(tok, msgs, tools, generation_prompt)
    except Exception:  # noqa: BLE001 -- as template_refusal
        return None


def refusal_words(e: Exception) -> str:
    """A template's error as one short line: its raise_exception's words, else the error's class and words (a
    template whose code fails on these turns: `{% for tool in tools %}` with no tools)."""
    from jinja2.exceptions import TemplateError

    words = " ".join(str(e).split())[:120]
    return words if isinstance(e, TemplateError) and words else f"{e.__class__.__name__}: {words}"


def template_ids(tok: Any, msgs: list[dict], generation_prompt: bool, tools: list | None = None) -> list[int]:
    try:
        out = render(tok, msgs, tools, generation_prompt, tokenize=True)
    except Exception as e:  # noqa: BLE001 -- as template_refusal
        raise DataError(f"the target's chat template refuses the turns {'/'.join(m['role'] for m in msgs)}: "
                        f"{refusal_words(e)}", TEMPLATE_HINT) from None
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def rendered_rows(rows: list[dict], tok: Any, skips: Counter, prompts: bool) -> list[dict]:
    """The rows whose turns the chat template renders (prompts with its generation prompt); the others skipped and
    counted by the template's reason."""
    kept = []
    for row in rows:
        if is_text_row(row):
            kept.append(row)  # plain text: no template
        elif why := template_refusal(tok, row["messages"], prompts, row.get("tools")):
            skips[REFUSED + why] += 1
        else:
            kept.append(row)
    return kept


def tokenize_rows(rows: list[dict], tok: Any, seq_len: int) -> tuple[dict, int]:
    """Fixed-length, right-padded tensors {input_ids, attention_mask, loss_mask} and the truncated count."""
    import torch

    n = len(rows)
    ids = torch.full((n, seq_len), tok.pad_token_id, dtype=torch.long)
    attn = torch.zeros((n, seq_len), dtype=torch.bool)
    loss = torch.zeros((n, seq_len), dtype=torch.bool)
    truncated = 0
    for r, row in enumerate(rows):
        t, m, cut = tokenize_row(row, tok, seq_len)
        ids[r, : len(t)] = torch.tensor(t)
        attn[r, : len(t)] = True
        loss[r, : len(m)] = torch.tensor(m, dtype=torch.bool)
        truncated += cut
    return {"input_ids": ids, "attention_mask": attn, "loss_mask": loss}, truncated


def encode_prompt(tok: Any, messages: list[dict], tools: list | None = None) -> list[int]:
    """Token ids of a prompt: the chat template with the tools offered and the generation prompt (the turns joined by
    newlines for a tokenizer without a template)."""
    if tok.chat_template:
        return template_ids(tok, messages, True, tools)
    return tok("\n".join(m["content"] for m in messages))["input_ids"]


def encode_row(tok: Any, row: dict) -> list[int]:
    """encode_prompt of a row: its turns with the tools it offers (a prompt file's row, a request, a conversation's
    prompt part)."""
    return encode_prompt(tok, row["messages"], row.get("tools"))


def encode_prompts(tok: Any, rows: list[dict], where: str) -> list[list[int]]:
    """encode_prompt of each row's turns; a prompt the chat template refuses named by `where`, the file or suite the
    rows are from."""
    try:
        return [encode_row(tok, r) for r in rows]
    except DataError as e:
        raise DataError(f"{where}: {e.message}", e.hint) from None


def turns_reader(tok: Any, max_turns: int = 64) -> Any:
    """A function from a prompt text the tokenizer's chat template wrote (with its generation prompt; what a client
    sends a raw-text endpoint such as Triton's LLM-API model) back to its turns [{role, content}], or None where no
    conversation of up to `max_turns` user turns, with or without a system turn, renders to exactly that text.

    Each candidate conversation is rendered once with marker contents; the text between the markers is literal. A
    text is cut where those literals stand in it (cut_at), and the turns are what lies between them, kept only if
    they render back to the very same text. The conversation of the most user turns is tried first, without a system
    turn before with one (a template's default system turn is not the user's)."""
    import re

    if not tok.chat_template:
        return lambda text: None
    candidates = []
    for users in range(max_turns, 0, -1):
        roles = ["user"] + ["assistant", "user"] * (users - 1)
        for lead in ([], ["system"]):
            turns = [{"role": r, "content": f"\u2063TRTSPEC{i}\u2063"} for i, r in enumerate(lead + roles)]
            try:
                rendered = tok.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)
            except Exception:  # noqa: BLE001 - a template that refuses a system turn (Gemma's) or a turn order
                continue
            pieces = re.split("\u2063TRTSPEC\\d+\u2063", rendered)
            if len(pieces) == len(turns) + 1:  # every content rendered once, as given
                candidates.append(([t["role"] for t in turns], pieces))

    between = {p for _, pieces in candidates for p in pieces[1:-1] if p}  # what the template writes between turns

    def turns_of(text: str) -> list[dict] | None:
        for roles, pieces in candidates:
            contents = cut_at(text, pieces, between)
            if contents is None:
                continue
            turns = [{"role": r, "content": c} for r, c in zip(roles, contents, strict=True)]
            if tok.apply_chat_template(turns, tokenize=False, add_generation_prompt=True) == text:
                return turns
        return None

    return turns_of


def cut_at(text: str, pieces: list[str], between: set[str]) -> list[str] | None:
    """The texts between `pieces` (literals that begin and end `text`, the ones between found in order, each at its
    first place after the one before), or None where they are not all there or a text between holds one of the
    literals `between` (a conversation of more turns, or a content quoting the template: no cut to trust); no
    backtracking."""
    first, last = pieces[0], pieces[-1]
    if len(text) < len(first) + len(last) or not (text.startswith(first) and text.endswith(last)):
        return None
    at, end, out = len(first), len(text) - len(last), []
    for literal in pieces[1:-1]:
        found = text.find(literal, at, end)
        if found < 0:
            return None
        out.append(text[at:found])
        at = found + len(literal)
    out.append(text[at:end])
    return None if any(p in c for c in out for p in between) else out


def read_rows(path: Path) -> list[dict]:
    """The rows of a JSON Lines file trtspec wrote (data/train.jsonl, data/heldout.jsonl, train/train_log.jsonl)."""
    return [json.loads(line) for line in split_lines(path.read_text(encoding="utf-8")) if line.strip()]


def prompt_rows(rows: list[dict]) -> list[dict]:
    """{id, category, messages, tools}: each conversation's turns before its answer (and the tools it offers), a
    document's opening (document_prompt) as a user turn; rows without either are left out."""
    out = []
    for i, r in enumerate(rows):
        if is_text_row(r):
            opening = document_prompt(r["messages"][0]["content"])
            turns = [{"role": "user", "content": opening}] if opening else []
        else:
            turns = r["messages"][:-1]
        if turns:
            out.append({"id": str(r.get("id", i)), "category": r.get("category", "chat"), "messages": turns, **tools_field(r)})
    return out


DOCUMENT_PROMPT_WORDS = 64


def document_prompt(text: str) -> str:
    """A held-out document as a prompt: its first half, at most DOCUMENT_PROMPT_WORDS words, for the target to go on
    with (completion traffic: a base model, whose tokenizer has no chat template, is trained on documents alone);
    empty for a document of fewer than 4 words."""
    import re

    words = re.findall(r"\S+\s*", text)  # each word with the spaces and newlines after it, as written
    return "".join(words[: min(len(words) // 2, DOCUMENT_PROMPT_WORDS)]).rstrip() if len(words) >= 4 else ""


NEAR_TWIN = 0.7  # words two prompts share (Jaccard) from which one is the other's template filled in again


def near_twins(prompts: list[dict], others: list[dict], overlap: float = NEAR_TWIN) -> list[bool]:
    """Whether each prompt row has a near-twin among the `others`: a prompt sharing at least `overlap` of their
    distinct words (Jaccard over lowercased words of the turns before the answer). A held-out prompt with a twin among
    the training prompts ("Write a short poem about a quiet forest." beside "... about a spring morning.") measures
    the templates a draft learned more than what it carries to traffic it never saw."""
    import re

    def words(row: dict) -> frozenset[str]:
        return frozenset(re.findall(r"\w+", " ".join(str(m.get("content") or "") for m in row["messages"]).lower()))

    pool = [w for w in map(words, others) if w]
    return [bool(w) and any(len(w & o) >= overlap * len(w | o) for o in pool) for w in map(words, prompts)]


def held_out_twins(data_dir: Path, acceptance_prompts: int, max_rows: int | None) -> list[bool]:
    """Which of a data stage's held-out prompts the train stage measures (its first eval.acceptance_prompts rows) have
    a near-twin among the prompts trained on (the first train.max_rows rows of train.jsonl)."""
    held = prompt_rows(read_rows(data_dir / "heldout.jsonl")[:acceptance_prompts])
    return near_twins(held, prompt_rows(read_rows(data_dir / "train.jsonl")[:max_rows]))


def token_counts(tokens_file: Path, vocab: int) -> Any:
    """How often each target token is a training label (assistant tokens) in the data stage's tensors."""
    import torch

    data = torch.load(tokens_file, weights_only=True)
    ids, mask = data["input_ids"], data["loss_mask"].bool()
    return torch.bincount(ids[mask].flatten(), minlength=vocab)[:vocab]


def with_history(prompt: dict, history: list[dict], tok: Any, tokens: int) -> tuple[dict, int]:
    """A long-context prompt with no hub: `prompt`'s turns after earlier whole conversations (`history`, rows with
    answers, in order; their own turns) as a chat's prior turns, as many as keep the encoded prompt within `tokens`
    tokens -> (the row, its prompt's length in tokens). Where drafts fail users is long context: a draft trained on
    short rows meets a target whose states were shaped by thousands of tokens before the answer.
    The earlier turns go after the prompt's own system turn, without theirs: one chat has one system prompt, first
    (Llama's, Mistral's, Gemma's and Phi-3's templates refuse one mid-chat; Qwen's render it as a new instruction).
    Conversations are counted by their texts' tokens plus TURN_TOKENS a turn (one encoding of the whole prompt
    instead of one per conversation), then the whole prompt is encoded and trimmed by whole conversations to fit."""
    lead = system_turns(prompt["messages"])
    head, rest = prompt["messages"][:lead], prompt["messages"][lead:]
    tools = prompt.get("tools")
    length = len(encode_prompt(tok, prompt["messages"], tools))
    taken: list[list[dict]] = []
    for row in history:
        own = [m for m in own_turns(row) if m["role"] != "system"]
        if row.get("tools") or any(m["role"] == "tool" for m in own):
            continue  # an agent's turns call tools this prompt may not offer
        length += sum(len(tok(m["content"], add_special_tokens=False)["input_ids"]) + TURN_TOKENS for m in own)
        if length > tokens:
            break
        taken.append(own)
    while True:
        messages = head + [m for turns in taken for m in turns] + rest
        length = len(encode_prompt(tok, messages, tools))
        if length <= tokens or not taken:
            return {**prompt, "messages": messages}, length
        taken.pop()


TURN_TOKENS = 8  # a chat template's tokens around one turn's text (role, start and end markers), counted generously


def at_context(prompts: list[dict], fill: list, tok: Any, tokens: int) -> list[tuple[dict, int]]:
    """Each prompt after up to `tokens` tokens of context -> (row, prompt tokens). `fill`: earlier conversations (rows:
    with_history, a long chat) or documents (str: with_document, a reader's question about a long text). Each prompt
    starts at a place of its own in `fill`, so that prompts measured at several lengths differ in length only."""
    out = []
    for i, p in enumerate(prompts):
        start = (i * 97) % max(1, len(fill))
        turned = fill[start:] + fill[:start]
        out.append(with_document(p, turned, tok, tokens) if fill and isinstance(fill[0], str)
                   else with_history(p, turned, tok, tokens))
    return out


DOCUMENT_INTRO = "Read the following text, then answer.\n\n"


def with_document(prompt: dict, documents: list[str], tok: Any, tokens: int) -> tuple[dict, int]:
    """A long-document prompt: the documents' text (in order) before the question in the prompt's last turn, cut at a
    token so that the encoded prompt is at most `tokens` tokens -> (the row, its prompt's length in tokens)."""
    *earlier, last = prompt["messages"]
    budget = tokens - len(encode_row(tok, prompt)) - len(tok(DOCUMENT_INTRO, add_special_tokens=False)["input_ids"])
    ids: list[int] = []
    for doc in documents:
        if len(ids) >= budget:
            break
        ids += tok(doc.strip() + "\n\n", add_special_tokens=False)["input_ids"]
    ids = ids[: max(0, budget)]
    while True:
        text = tok.decode(ids, skip_special_tokens=True).strip()
        messages = earlier + [{**last, "content": f"{DOCUMENT_INTRO}{text}\n\n{last['content']}"}] if text else prompt["messages"]
        n = len(encode_prompt(tok, messages, prompt.get("tools")))
        if n <= tokens or not text:
            return {**prompt, "messages": messages}, n
        ids = ids[: len(ids) - (n - tokens)]  # decoding and encoding again may join tokens differently


def read_documents(path: Path, skips: Counter, what: str = "eval.context_documents file",
                   hint: str = "check eval.context_documents (relative to the YAML)") -> list[str]:
    """Documents for long contexts: JSONL rows' `text` field (or a JSON array's, json_array), or one document per line."""
    as_json, rows = json_or_lines(path, read_text(path, what, hint), skips, "unparsable line")
    if not as_json:
        return rows
    docs = []
    for row in rows:
        if isinstance(row, dict) and isinstance(row.get("text"), str) and row["text"].strip():
            docs.append(row["text"])
        else:
            skips["row without a 'text' field"] += 1
    return docs


def own_turns(row: dict) -> list[dict]:
    """A conversation's own turns, without the earlier conversations data.context_tokens put after its system turn."""
    lead = system_turns(row["messages"])
    return row["messages"][:lead] + row["messages"][lead + row.get("context_turns", 0):]


def system_turns(messages: list[dict]) -> int:
    """How many turns a conversation opens with that are system turns."""
    return next((i for i, m in enumerate(messages) if m["role"] != "system"), len(messages))


def with_context(row: dict, history: list[dict], tok: Any, tokens: int) -> dict:
    """A training row after earlier conversations (with_history), its prompt up to `tokens` tokens long, marked with
    `context_turns` (the turns put between its system turn and its others). A regenerated row keeps the target's own
    answer tokens after the longer prompt. The answer was written without those turns, yet the head still learns what
    the target does there: its labels are the target's own next-token distributions, computed with the whole context
    in front."""
    prompt = {"messages": row["messages"][:-1], **tools_field(row)}
    longer, n = with_history(prompt, history, tok, tokens)
    added = len(longer["messages"]) - len(prompt["messages"])
    out = {**row, "messages": longer["messages"] + row["messages"][-1:], "context_turns": added}
    if "input_ids" in row:
        out["input_ids"] = encode_prompt(tok, longer["messages"], row.get("tools")) + list(row["input_ids"][row["label_start"]:])
        out["label_start"] = n
    return out


def long_context_rows(rows: list[dict], tok: Any, tokens: int, share: float, seed: int) -> list[dict]:
    """data.context_tokens: `share` of the rows (drawn by `seed`) after earlier conversations of the others
    (with_context), each prompt filled to a length drawn uniformly between its own and `tokens`, so that every
    position up to it is trained. A draft trained on short rows alone never sees the positions and target states a long prompt
    brings, and its acceptance falls with the context."""
    import random

    from tqdm import tqdm

    rng = random.Random(seed)
    picked = sorted(rng.sample(range(len(rows)), round(share * len(rows))))
    out = list(rows)
    for i in tqdm(picked, desc="long-context rows", unit="row", disable=len(picked) < 50):
        start = rng.randrange(len(rows))
        history = [r for j, r in enumerate(rows[start:] + rows[:start]) if (j + start) % len(rows) != i]
        own = len(encode_prompt(tok, rows[i]["messages"][:-1], rows[i].get("tools")))
        out[i] = with_context(rows[i], history, tok, rng.randint(min(own, tokens), tokens))
    return out
