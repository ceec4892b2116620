"""Reading the prompts a service received (trtspec.traffic): each format, what is skipped and why, and the one-line
refusals."""

from __future__ import annotations

import json

import pytest

from trtspec.errors import DataError
from trtspec.traffic import read_traffic


def write(path, lines):
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def test_chat_jsonl_keeps_categories_drops_answers_and_repeats(tmp_path):
    f = write(tmp_path / "t.jsonl", [
        {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}], "category": "greet"},
        {"messages": [{"role": "user", "content": "Hi"}], "category": "greet"},  # the same prompt, answer dropped
        {"prompt": "What is 2+2?"},
    ])
    rows, skips, fmt = read_traffic(f, category="maths")
    assert fmt == "chat"
    assert [(r["category"], r["messages"]) for r in rows] == [
        ("greet", [{"role": "user", "content": "Hi"}]), ("maths", [{"role": "user", "content": "What is 2+2?"}])]
    assert skips == {"repeated prompt": 1}
    assert all(r["id"].startswith("traffic-") for r in rows)


def test_openai_batch_reads_chat_requests_and_their_text_parts(tmp_path):
    body = {"model": "m", "messages": [{"role": "system", "content": "Be brief."},
                                       {"role": "user", "content": [{"type": "text", "text": "Name a "},
                                                                    {"type": "text", "text": "color."}]}],
            "metadata": {"category": "colors"}}
    f = write(tmp_path / "b.jsonl", [
        {"custom_id": "1", "method": "POST", "url": "/v1/chat/completions", "body": body},
        {"custom_id": "2", "method": "POST", "url": "/v1/completions", "body": {"prompt": "raw text"}},
    ])
    rows, skips, fmt = read_traffic(f)
    assert fmt == "openai-batch"
    assert rows[0]["category"] == "colors"
    assert rows[0]["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a color."}]
    assert skips == {"completion request (raw text, no chat turns)": 1}


def test_vllm_request_log_reads_json_bodies_and_counts_cut_ones(tmp_path):
    ok = {"messages": [{"role": "user", "content": "Tell me a joke."}], "max_tokens": 64}
    f = write(tmp_path / "vllm.log", [
        "INFO 11-28 10:00:00 [api_server.py:1] vLLM API server version 0.32.0",
        f"DEBUG 11-28 10:00:01 [request_logger.py:73] Request chatcmpl-1 JSON body: {json.dumps(ok)}",
        "INFO 11-28 10:00:01 [request_logger.py:66] Received request chatcmpl-1: params: SamplingParams(...)",
        'DEBUG 11-28 10:00:02 [request_logger.py:73] Request chatcmpl-2 JSON body: {"messages": [{"role": "us',
    ])
    rows, skips, fmt = read_traffic(f, category="jokes")
    assert fmt == "vllm-log" and len(rows) == 1 and rows[0]["category"] == "jokes"
    assert skips == {"request body cut short (vLLM's --max-log-len)": 1}


def test_unknown_format_and_no_usable_prompt_are_one_line_errors(tmp_path):
    with pytest.raises(DataError, match="not a traffic file"):
        read_traffic(write(tmp_path / "x.jsonl", [{"text": "a document"}]))
    with pytest.raises(DataError, match=r"holds no usable prompt \(chat: 1 request without a usable chat turn"):
        read_traffic(write(tmp_path / "y.jsonl", [{"messages": [{"role": "assistant", "content": "only an answer"}]}]))
    with pytest.raises(DataError, match="holds no usable prompt"):
        read_traffic(write(tmp_path / "z.log", ["INFO nothing here"]), fmt="vllm-log")
